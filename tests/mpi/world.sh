#!/usr/bin/env bash
# mpirun without a mesh, dist = { independent = true }, muon.world() in a
# config and a routing error on a mesh (tests/mpi/world_check.lua), at np 2
# and 3.
. "$(dirname "$0")/lib.bash"
S=tests/mpi/world_check.lua
for np in 2 3; do
  mpi_case "world np=$np" "$np" $RUN $S
done
[ "$FAILS" -eq 0 ]
