#!/usr/bin/env bash
# The ABI of a library's public surface, with libabigail (Debian
# abigail-tools):
#   abi.sh dump LIB HEADER > BASELINE.abi   what `make abi-baseline` writes
#   abi.sh check BASELINE.abi LIB HEADER    what tests/abi_spec.lua runs
# The public surface is the functions HEADER declares with MU_API (muon.h);
# every other exported function (muon_ffi.h's, MUON_PRIVATE) and the types
# only they use are left out, so private changes never count.
#
# check prints abidiff's report, then one line: "abi: compatible ..." (exit
# 0) or "abi: INCOMPATIBLE ..." (exit 1). Incompatible: what abidiff marks
# so (exit bit 8: a function or symbol removed) and every change to an
# existing function or variable it reports (a parameter's or return type,
# a struct it reaches growing or changing its layout), which abidiff sets
# only bit 4 for; added functions alone are compatible.
set -u
usage() { echo "usage: abi.sh dump LIB HEADER | abi.sh check BASELINE LIB HEADER" >&2; exit 2; }

# The MU_API function names of a header, or of a baseline (its functions),
# one per line.
header_names() { sed -n 's/^MU_API[^(]*[ *]\(mu_[a-z0-9_]*\)(.*/\1/p' "$1"; }
baseline_names() { sed -n "s/^ *<function-decl name='\([^']*\)'.*/\1/p" "$1"; }

# A suppression file that keeps the functions named on stdin and drops
# every other function (the library exports no variables). (A variable
# suppression would not do for variables: libabigail applies it to struct
# members too.)
suppressions() { # out
  local names
  names=$(sort -u | paste -sd'|')
  [ -n "$names" ] || { echo "abi.sh: no MU_API function found" >&2; exit 2; }
  printf '[suppress_function]\n  symbol_name_not_regexp = ^(%s)$\n  drop = yes\n' "$names" >"$1"
}

for tool in abidw abidiff; do
  command -v "$tool" >/dev/null || { echo "abi.sh: $tool not found (Debian: apt-get install abigail-tools)" >&2; exit 2; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

case "${1:-}" in
dump)
  [ $# -eq 3 ] || usage
  header_names "$3" | suppressions "$tmp/public.suppr"
  # no paths, no DT_NEEDED (with or without MPI), short locations: the
  # baseline depends on the public types and functions alone
  abidw --drop-undefined-syms --no-corpus-path --no-comp-dir-path --no-elf-needed --short-locs \
    --suppressions "$tmp/public.suppr" "$2"
  ;;
check)
  [ $# -eq 4 ] || usage
  # the baseline's functions and the header's: a function the header no
  # longer declares is still compared (removed, or moved to MUON_PRIVATE)
  { baseline_names "$2"; header_names "$4"; } | suppressions "$tmp/public.suppr"
  abidiff --suppressions "$tmp/public.suppr" "$2" "$3" >"$tmp/report" 2>&1
  rc=$?
  cat "$tmp/report"
  if [ $((rc & 3)) -ne 0 ]; then
    echo "abi: abidiff failed (exit status $rc)"
    exit 1
  fi
  # "Functions changes summary: 0 Removed, 1 Changed (3 filtered out), 2 Added functions"
  # "Function symbols changes summary: 1 Removed, 0 Added function symbol ..."
  changed=$(sed -n 's/^\(Functions\|Variables\|Function symbols\|Variable symbols\) changes summary: \([0-9]*\) Removed\(, \([0-9]*\) Changed\)\{0,1\}.*/\2 \4/p' \
    "$tmp/report" | awk '{ n += $1 + $2 } END { print n + 0 }')
  added=$(sed -n 's/^Functions changes summary: .* \([0-9]*\) Added functions\{0,1\}$/\1/p' "$tmp/report")
  if [ $((rc & 8)) -ne 0 ] || [ "$changed" -ne 0 ]; then
    echo "abi: INCOMPATIBLE with $2 ($changed functions or symbols removed or changed; abidiff exit status $rc)"
    exit 1
  fi
  echo "abi: compatible with $2 (${added:-0} functions added)"
  ;;
*) usage ;;
esac
