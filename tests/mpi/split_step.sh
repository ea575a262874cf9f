#!/usr/bin/env bash
# Split Newton-Schulz in the engine's step (tests/mpi/split_step_check.lua):
# the split matrices' groups, bitwise equal to one process at 1-4 ranks,
# their bytes, a failure on one rank failing every rank, MU_NS_SPLIT_PLAN
# different on one rank failing the first step everywhere (no hang).
. "$(dirname "$0")/lib.bash"
export MU_NS_SPLIT_PLAN=64,16,16
S=tests/mpi/split_step_check.lua
for c in "1 one shard:1" "2 one shard:2" "2 one replicate:2" "3 two shard:3" "4 two shard:4" "4 two replicate:2,shard:2" "4 one shard:2,shard2:2"; do
  set -- $c
  mpi_case "split step np=$1 $2 mesh $3" "$1" $RUN $S "$2" "$3"
done
[ "$FAILS" -eq 0 ]
