#!/usr/bin/env bash
# Runs every test (busted specs, C tests, MPI tests, one MPI job at a time)
# and ends with one plain line "N passed, N failed". Exit 1 on any failure.
# Each component reports TAP lines ("ok ..." / "not ok ..."); a component
# that exits non-zero without a "not ok" line counts as one failure.
set -u
cd "$(dirname "$0")/.."
export LUA_PATH="$PWD/lua/?.lua;$PWD/lua/?/init.lua;$PWD/tests/?.lua;;"
passed=0
failed=0
log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT

run_tap() { # name command...
  local name=$1; shift
  local out="$log/$name.out"
  echo "== $name"
  "$@" >"$out" 2>&1
  local status=$?
  cat "$out"
  local p f
  p=$(grep -cE '^ok [0-9]' "$out")
  f=$(grep -cE '^not ok [0-9]' "$out")
  if [ "$status" -ne 0 ] && [ "$f" -eq 0 ]; then
    echo "not ok - $name exited with status $status"
    f=1
  fi
  passed=$((passed + p))
  failed=$((failed + f))
}

# Lua specs (busted under LuaJIT, TAP output).
run_tap busted luajit /usr/bin/busted -o TAP

# C tests: each build/tests/<name> prints TAP.
for t in build/tests/*; do
  [ -x "$t" ] || continue
  run_tap "c-$(basename "$t")" "$t"
done

# MPI tests: tests/mpi/*.sh, strictly one after another.
for t in tests/mpi/*.sh; do
  [ -f "$t" ] || continue
  run_tap "mpi-$(basename "$t" .sh)" bash "$t"
done

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
