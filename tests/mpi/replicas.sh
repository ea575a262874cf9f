#!/usr/bin/env bash
# Replicas that cannot drift: eng:reduce_grads bitwise against one process
# given the mean of the ranks' gradients (np 2 and 4), check_replicas, and
# ranks loading different checkpoint files.
. "$(dirname "$0")/lib.bash"
S=tests/mpi/replicas_check.lua
for c in "2 replicate:2" "4 replicate:4" "4 replicate:2,shard:2"; do
  set -- $c
  mpi_case "reduce_grads np=$1 mesh $2" "$1" $RUN $S reduce "$2"
done
[ "$FAILS" -eq 0 ]
