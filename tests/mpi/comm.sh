#!/usr/bin/env bash
# Collectives of src/comm.c under mpirun at 1..4 ranks.
. "$(dirname "$0")/lib.bash"
for np in 1 2 3 4; do
  mpi_case "comm np=$np" "$np" $RUN tests/mpi/comm_check.lua
done
[ "$FAILS" -eq 0 ]
