#!/usr/bin/env bash
# Split Newton-Schulz under mpirun (tests/mpi/split_check.lua): every rank's
# piece bitwise equal to one process, the counted bytes equal to the
# machines' formula, failures on one rank failing every rank.
. "$(dirname "$0")/lib.bash"
for np in 2 4; do
  mpi_case "split ns np=$np" "$np" $RUN tests/mpi/split_check.lua
done
[ "$FAILS" -eq 0 ]
