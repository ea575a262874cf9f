#!/usr/bin/env bash
# The research hooks on meshes (tests/mpi/hooks_check.lua): AdaMuon,
# Newton-Muon and MuonH (sharded weights, ctx.global_norm) and every
# reduction bitwise equal to one process at 1..4 ranks, the mesh's
# checkpoint of them; ranks whose reductions differ fail together; hooks
# that write their read-only ctx or yield, on one rank, fail every rank.
. "$(dirname "$0")/lib.bash"
S=tests/mpi/hooks_check.lua
ck=$(mktemp -d)
for c in "1 shard:1" "2 shard:2" "2 replicate:2" "3 shard:3" "4 shard:4" "4 replicate:2,shard:2" "4 shard:2,shard2:2"; do
  set -- $c
  mpi_case "hooks np=$1 mesh $2" "$1" $RUN $S variants "$2" "$ck/hooks.safetensors"
done
for c in "1 shard:1" "2 shard:2" "3 shard:3" "4 replicate:2,shard:2"; do
  set -- $c
  mpi_case "hooks np=$1 mesh $2 reductions that differ" "$1" $RUN $S mismatch "$2"
done
# Hooks that write into ctx or post_update_fn's parameter, or yield, on one
# rank only: every rank fails the step, nothing changes, no hang.
for np in 1 2 3; do
  mpi_case "hooks np=$np writing ctx / yielding on one rank" "$np" $RUN tests/mpi/hook_misuse_check.lua "$ck/misuse.safetensors"
done
rm -rf "$ck"
if [ -x "$ROOT/build/muon" ]; then
  # examples/muonh.lua prints the same numbers with its weights sharded over 3 ranks.
  ex=$(mktemp -d)
  for np in 1 3; do
    mpi_run $np build/muon run examples/muonh.lua 20 >"$ex/out$np"
  done
  if grep -q "^check:" "$ex/out1" && [ "$(grep -m1 '^check:' "$ex/out1")" = "$(grep -m1 '^check:' "$ex/out3")" ]; then
    tap ok "examples/muonh.lua: the same numbers at np=1 and np=3 (sharded weights)"
  else
    tap fail "examples/muonh.lua: np=1 and np=3 differ"
    diff "$ex/out1" "$ex/out3" | head -10 | sed 's/^/# /'
  fi
  rm -rf "$ex"
fi
[ "$FAILS" -eq 0 ]
