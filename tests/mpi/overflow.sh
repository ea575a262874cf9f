#!/usr/bin/env bash
# A finite gradient whose momentum overflows on one rank only: with
# nonfinite = "skip" every rank skips the group (then steps bitwise like one
# process); with "error" every rank fails naming the parameter.
. "$(dirname "$0")/lib.bash"
for np in 2 3; do
  for m in skip error; do
    mpi_case "overflowing momentum on rank 0 only, nonfinite=$m, np=$np" "$np" $RUN tests/mpi/overflow_check.lua "$m"
  done
done
[ "$FAILS" -eq 0 ]
