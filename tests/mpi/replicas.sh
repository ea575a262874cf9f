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
for c in "2 replicate:2" "4 replicate:2,shard:2"; do
  set -- $c
  mpi_case "check_replicas np=$1 mesh $2" "$1" $RUN $S replicas "$2"
done
ck=$(mktemp -d)
mpi_case "load np=3 mesh replicate:3: rank 0 loads another file" 3 $RUN $S load "replicate:3" "$ck"
mpi_case "load np=4 mesh replicate:2,shard:2: rank 0 loads another file" 4 $RUN $S load "replicate:2,shard:2" "$ck"
rm -rf "$ck"
[ "$FAILS" -eq 0 ]
