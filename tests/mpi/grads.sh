#!/usr/bin/env bash
# eng:clip_grad_norm, zero_grad and set_lr on meshes (tests/mpi/grads_check.lua):
# the norm, the clipped grads and the next step bitwise equal to one process.
. "$(dirname "$0")/lib.bash"
S=tests/mpi/grads_check.lua
for c in "2 replicate:2" "3 shard:3" "4 replicate:2,shard:2"; do
  set -- $c
  mpi_case "grads np=$1 mesh $2" "$1" $RUN $S "$2"
done
[ "$FAILS" -eq 0 ]
