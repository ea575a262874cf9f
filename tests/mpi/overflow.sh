#!/usr/bin/env bash
# A finite gradient whose momentum overflows on one rank only: with
# nonfinite = "skip" every rank skips the group (then steps bitwise like one
# process); with "error" every rank fails naming the parameter. The same for
# NaN hook state and a parameter holding NaN on one rank (commit_check.lua),
# a momentum that only the bfloat16 state rounds to Inf, and checkpoints
# whose state is Inf in bfloat16 or breaks a kind's invariant.
. "$(dirname "$0")/lib.bash"
for np in 2 3; do
  for m in skip error; do
    mpi_case "overflowing momentum on rank 0 only, nonfinite=$m, np=$np" "$np" $RUN tests/mpi/overflow_check.lua "$m"
    mpi_case "momentum Inf only in rank 0's bfloat16 state, nonfinite=$m, np=$np" "$np" $RUN tests/mpi/overflow_check.lua \
      "$m" bfloat16
    mpi_case "NaN hook state on its holders, nonfinite=$m, np=$np" "$np" $RUN tests/mpi/commit_check.lua hook "$m"
    mpi_case "post_update_fn NaN on rank 0's piece, nonfinite=$m, np=$np" "$np" $RUN tests/mpi/commit_check.lua post "$m"
  done
  mpi_case "NaN in rank 0's part of a parameter, np=$np" "$np" $RUN tests/mpi/commit_check.lua param error
  mpi_case "a checkpoint Inf in bfloat16 or below a kind's invariant, np=$np" "$np" $RUN tests/mpi/overflow_check.lua load
done
[ "$FAILS" -eq 0 ]
