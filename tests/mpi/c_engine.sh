#!/usr/bin/env bash
# A C trainer that owns MPI: mu_engine_set_comm + mu_engine_add_param_sharded,
# bitwise against a plain engine on full tensors (np 2 and 4); built against
# the installed header alone (build/include/muon.h, a copy of src/muon.h).
. "$(dirname "$0")/lib.bash"
cd "$ROOT"
if [ ! -f build/libmuon.a ] || [ ! -f build/include/muon.h ] || ! pkg-config --exists ompi-c; then
  echo "ok 1 - c_engine: skipped (no build/libmuon.a and build/include/muon.h, or no Open MPI) # SKIP"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bin="$work/c_engine"
if ! cc -std=c11 -O2 -Wall -Wextra -Ibuild/include $(pkg-config --cflags ompi-c luajit openblas) -o "$bin" tests/mpi/c_engine.c \
  -Wl,--whole-archive build/libmuon.a -Wl,--no-whole-archive -Wl,--export-dynamic \
  $(pkg-config --libs ompi-c luajit openblas) -lm -lpthread 2>"$work/cc.log"; then
  tap fail "c_engine: compile"
  sed 's/^/# /' "$work/cc.log" | head -20
  exit 1
fi
groups='groups = {
  { optimizer = "muon", match = "^layers", lr = 0.02, weight_decay = 0.1 },
  { optimizer = "adamw", match = ".*", lr = 1e-3 } }'
for m in "2 1 2" "4 2 2"; do
  set -- $m
  echo "return { $groups, dist = { mesh = { {\"replicate\", $2}, {\"shard\", $3} } } }" > "$work/dist.lua"
  echo "return { $groups, dist = { independent = true } }" > "$work/plain.lua"
  mpi_case "c_engine np=$1 mesh ${2}x${3}" "$1" "$bin" "$work/dist.lua" "$work/plain.lua" "$2" "$3"
done
[ "$FAILS" -eq 0 ]
