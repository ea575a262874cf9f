#!/usr/bin/env bash
# `muon check --world N --rank R --mesh SPEC` prints the figures a real
# mpirun has at np 2-4 (state bytes, NS flops, bytes in and out per step,
# items held and owned), on small meshes.
. "$(dirname "$0")/lib.bash"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/shapes.txt" <<'SH'
embed 50 16
l0.qkv 48 16
l0.o 16 16
l0.up 64 16
l0.down 16 64
l0.ln 16
l0.bias 64
l1.qkv 48 16
l1.o 16 16 @R,R
l1.up 64 16
l1.down 16 64 @S(2),R
l1.ln 16
experts 4 16 8 @R,S(1)
SH
for c in "2 replicate:1,shard:2" "2 replicate:2,shard:1" "3 replicate:1,shard:3" "4 replicate:2,shard:2"; do
  set -- $c
  lua_mesh=$(echo "$2" | sed -E 's/([a-z]+):([0-9]+)/{ "\1", \2 }/g')
  cat >"$work/cfg.lua" <<CFG
return { groups = {
  { optimizer = "muon", match = "^l", min_dim = 2, lr = 0.02, weight_decay = 0.1 },
  { optimizer = "lion", match = "^experts", lr = 1e-3 },
  { optimizer = "adamw", match = ".*", lr = 1e-3 } },
  dist = { mesh = { $lua_mesh } } }
CFG
  mpi_case "plan np=$1 mesh $2" "$1" $RUN tests/mpi/plan_check.lua "$work/cfg.lua" "$work/shapes.txt" "$2"
done
[ "$FAILS" -eq 0 ]
