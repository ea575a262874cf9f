#!/usr/bin/env bash
# The hook budget on a mesh: a sandboxed config's hook misbehaves on rank 1
# only (an endless loop, a huge allocation, a deep recursion, nested library
# calls; in post_update_fn, post_ortho_fn, momentum_update_fn and the
# schedule): every rank fails the step with that rank's error, nothing
# changed anywhere, no hang; then the step passes as if never tried.
. "$(dirname "$0")/lib.bash"
mpi_case "hook budget np=2, rank 1 misbehaves" 2 $RUN tests/mpi/budget_check.lua
[ "$FAILS" -eq 0 ]
