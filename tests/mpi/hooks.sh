#!/usr/bin/env bash
# The research hooks on meshes (tests/mpi/hooks_check.lua): AdaMuon,
# Newton-Muon and MuonH (sharded weights, ctx.global_norm) and every
# reduction bitwise equal to one process at 1..4 ranks, the mesh's
# checkpoint of them; ranks whose reductions differ fail together.
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
rm -rf "$ck"
[ "$FAILS" -eq 0 ]
