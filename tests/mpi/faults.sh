#!/usr/bin/env bash
# One rank dying ends the whole job with a non-zero code within the MPI
# timeout: os.exit on rank 1, a segfault on rank 1 (FFI null store), and a
# Lua error on rank 1 (the job's output carries that error's message).
source "$(dirname "$0")/lib.bash"
if [ ! -x "$ROOT/build/muon" ] || ! command -v mpirun >/dev/null; then
  echo "ok 1 - rank death: skipped (no build/muon or no mpirun) # SKIP"
  exit 0
fi
job() { # label expect-in-output command...
  local label=$1 expect=$2; shift 2
  local t0 t1 rc out
  t0=$(date +%s)
  out=$(mpi_run 3 "$@")
  rc=$?
  t1=$(date +%s)
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] && [ $((t1 - t0)) -lt 60 ] \
     && ! printf '%s\n' "$out" | grep -q "not-aborted" \
     && { [ -z "$expect" ] || printf '%s\n' "$out" | grep -qF "$expect"; }; then
    tap ok "$label ends the job (exit $rc, $((t1 - t0)) s)"
  else
    tap fail "$label: exit $rc after $((t1 - t0)) s"
    printf '%s\n' "$out" | tail -8 | sed 's/^/# /'
  fi
}
job "os.exit(3) on rank 1 of 3" "" build/muon run tests/mpi/rank_death_check.lua exit
job "segfault on rank 1 of 3" "" build/muon run tests/mpi/rank_death_check.lua segv
job "Lua error on rank 1 of 3" "deliberate failure on rank 1" build/muon run tests/mpi/abort_check.lua
[ "$FAILS" -eq 0 ]
