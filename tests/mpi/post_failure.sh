#!/usr/bin/env bash
# A post_update_fn failing on one rank (raising, leaving NaN, out of its
# budget) changes nothing on any rank, a kept view of a parameter and hook
# state included (post_failure_check.lua), at np 1 to 4, on the first and
# on the last rank.
. "$(dirname "$0")/lib.bash"
for np in 1 2 3 4; do
  for r in $(printf '%s\n' 0 $((np - 1)) | sort -u); do
    mpi_case "post_update_fn failing on rank $r, np=$np" "$np" $RUN tests/mpi/post_failure_check.lua "$r"
  done
done
[ "$FAILS" -eq 0 ]
