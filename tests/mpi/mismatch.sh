#!/usr/bin/env bash
# Collective calls that cannot match (save on rank 0 while the others step,
# load against step, save against load, the first call of an engine) fail
# on every rank with the same message, well before mpirun's timeout, and
# the ranks go on; an argument error on one rank fails the call everywhere,
# and so do arguments, or config keys of what the ranks do together, that
# differ across ranks (both values named); a rank whose checkpoint file is
# missing fails every rank with its own error (tests/mpi/mismatch_check.lua;
# the C API's in tests/mpi/c_engine.sh).
. "$(dirname "$0")/lib.bash"
if [ ! -x "$ROOT/build/muon" ] || ! command -v mpirun >/dev/null; then
  echo "ok 1 - mismatch: skipped (no build/muon or no mpirun) # SKIP"
  exit 0
fi
ck=$(mktemp -d)
for np in 2 3; do
  t0=$(date +%s)
  mpi_case "mismatched calls np=$np" "$np" $RUN tests/mpi/mismatch_check.lua "$ck/opt.safetensors"
  t1=$(date +%s)
  if [ $((t1 - t0)) -lt 60 ]; then tap ok "mismatched calls np=$np: no hang ($((t1 - t0)) s)"
  else tap fail "mismatched calls np=$np: took $((t1 - t0)) s"; fi
done
rm -rf "$ck"
# The first call that builds the engine's communicators (a collective)
# failing on rank 1 only, uncaught: the host aborts the job with rank 1's
# message instead of rank 0 waiting (tests/mpi/first_call_check.lua).
for c in "add_param|grad has shape [5] but the value has shape [4]" "open|lr must be a finite number, got the string \"fast\""; do
  how=${c%%|*} want=${c#*|}
  t0=$(date +%s)
  out=$(mpi_run 2 build/muon run tests/mpi/first_call_check.lua "$how")
  rc=$?
  t1=$(date +%s)
  if [ "$rc" -ne 0 ] && [ $((t1 - t0)) -lt 60 ] && ! printf '%s\n' "$out" | grep -q "not-aborted" \
     && printf '%s\n' "$out" | grep -qF "$want"; then
    tap ok "first call fails on rank 1 only ($how): the job ends with its message (exit $rc, $((t1 - t0)) s)"
  else
    tap fail "first call fails on rank 1 only ($how): exit $rc after $((t1 - t0)) s"
    printf '%s\n' "$out" | tail -8 | sed 's/^/# /'
  fi
done
[ "$FAILS" -eq 0 ]
