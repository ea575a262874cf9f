#!/usr/bin/env bash
# The distributed step (HSDP) under mpirun: bitwise equality with one process
# at 1..4 ranks on several meshes, byte counters vs the plan's formula,
# failures that reach every rank, checkpoints resharded across world sizes.
. "$(dirname "$0")/lib.bash"
S=tests/mpi/dist_check.lua
for m in "1 1 1" "2 1 2" "2 2 1" "3 1 3" "3 3 1" "4 1 4" "4 4 1" "4 2 2"; do
  set -- $m
  mpi_case "dist np=$1 mesh ${2}x${3}" "$1" luajit $S equal "$2" "$3"
done
ck=$(mktemp -d)
mpi_case "dist np=4 mesh 2x2 save" 4 luajit $S save 2 2 "$ck/opt.safetensors"
mpi_case "dist np=2 mesh 1x2 resume from np=4" 2 luajit $S resume 1 2 "$ck/opt.safetensors"
mpi_case "dist np=1 resume from np=4" 1 luajit $S resume 1 1 "$ck/opt.safetensors"
mpi_case "dist np=3 mesh 3x1 resume from np=4" 3 luajit $S resume 3 1 "$ck/opt.safetensors"
rm -rf "$ck"
mpi_case "dist np=3 different shape" 3 luajit $S shape 1 3
mpi_case "dist np=4 hook raises on owner" 4 luajit $S hook 2 2
mpi_case "dist np=2 post_update raises on rank 1" 2 luajit $S posthook 1 2
[ "$FAILS" -eq 0 ]
