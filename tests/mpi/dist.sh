#!/usr/bin/env bash
# The distributed step (HSDP) under mpirun: bitwise equality with one
# process at 1..4 ranks on meshes {shard,N}, {replicate,N},
# {replicate,2}x{shard,2} and a two-axis 2-D shard, with OpenBLAS at 1 and
# 2 threads, including the steps after failed ones; failures that reach
# every rank; configs that differ; batch-sharded experts that move nothing;
# replicated state; bfloat16 Newton-Schulz; checkpoints resharded across world sizes; the pipelined
# (overlapped) exchanges and a failure in the middle of them; NS inputs
# written where they leave from (no pack). Every kind
# (Muon, AdamW, Lion) is in the meshes.
. "$(dirname "$0")/lib.bash"
S=tests/mpi/dist_check.lua
for c in "1 shard:1" "2 shard:2" "2 replicate:2" "3 shard:3" "3 replicate:3" "4 shard:4" "4 replicate:4" \
         "4 replicate:2,shard:2" "4 shard:2,shard2:2"; do
  set -- $c
  for t in 1 2; do
    OPENBLAS_NUM_THREADS=$t mpi_case "dist np=$1 mesh $2 blas threads $t" "$1" $RUN $S equal "$2"
  done
done
ck=$(mktemp -d)
mpi_case "dist np=4 mesh replicate:2,shard:2 save" 4 $RUN $S save "replicate:2,shard:2" "$ck/opt.safetensors"
mpi_case "dist np=2 mesh shard:2 resume from np=4" 2 $RUN $S resume "shard:2" "$ck/opt.safetensors"
mpi_case "dist np=1 resume from np=4" 1 $RUN $S resume "shard:1" "$ck/opt.safetensors"
mpi_case "dist np=3 mesh replicate:3 resume from np=4" 3 $RUN $S resume "replicate:3" "$ck/opt.safetensors"
mpi_case "dist np=4 mesh shard:2,shard2:2 resume from np=4" 4 $RUN $S resume "shard:2,shard2:2" "$ck/opt.safetensors"
# bfloat16 state (state_dtype): bitwise as one process, checkpoints gathered and resharded
for c in "2 shard:2" "3 replicate:3" "4 replicate:2,shard:2"; do
  set -- $c
  MU_TEST_STATE_DTYPE=bfloat16 mpi_case "dist np=$1 mesh $2 bfloat16 state" "$1" $RUN $S equal "$2"
done
MU_TEST_STATE_DTYPE=bfloat16 mpi_case "dist np=4 bfloat16 state save" 4 $RUN $S save "replicate:2,shard:2" "$ck/bf16.safetensors"
MU_TEST_STATE_DTYPE=bfloat16 mpi_case "dist np=2 bfloat16 state resume from np=4" 2 $RUN $S resume "shard:2" "$ck/bf16.safetensors"
# bfloat16 Newton-Schulz (ns_dtype): bitwise as one process at np 1-4
for c in "1 shard:1" "2 shard:2" "3 replicate:3" "4 replicate:2,shard:2" "4 shard:2,shard2:2"; do
  set -- $c
  MU_TEST_NS_DTYPE=bfloat16 mpi_case "dist np=$1 mesh $2 bfloat16 Newton-Schulz" "$1" $RUN $S equal "$2"
done
for c in "1 shard:1" "2 shard:2" "4 replicate:2,shard:2"; do
  set -- $c
  MU_TEST_NS_DTYPE=bfloat16 MU_TEST_NS_METHOD=gram mpi_case "dist np=$1 mesh $2 bfloat16 Gram Newton-Schulz" "$1" \
    $RUN $S equal "$2"
done
for c in "1 shard:1" "2 shard:2" "2 replicate:2" "3 shard:3" "4 replicate:2,shard:2" "4 shard:2,shard2:2"; do
  set -- $c
  mpi_case "variants np=$1 mesh $2" "$1" $RUN $S variants "$2" "$ck/variants.safetensors"
done
for c in "1 shard:1" "2 shard:2" "3 replicate:3" "4 replicate:2,shard:2" "4 shard:2,shard2:2"; do
  set -- $c
  mpi_case "overlap np=$1 mesh $2" "$1" $RUN $S overlap "$2"
done
for c in "2 shard:2" "3 shard:3" "4 replicate:2,shard:2"; do
  set -- $c
  mpi_case "direct NS inputs np=$1 mesh $2" "$1" $RUN $S direct "$2"
done
mpi_case "dist np=3 config differs on rank 2" 3 $RUN $S config "shard:3"
mpi_case "dist np=3 hook_state (a nested table) differs on rank 2" 3 $RUN $S config "shard:3" hook_state
mpi_case "dist np=4 experts sharded on dim 1" 4 $RUN $S experts "shard:4"
mpi_case "dist np=2 replicated state" 2 $RUN $S memory "replicate:2,shard:1"
for c in "1 shard:1" "3 shard:3" "4 replicate:2,shard:2"; do
  set -- $c
  mpi_case "dist np=$1 mesh $2 nothing to step" "$1" $RUN $S nothing "$2"
done
rm -rf "$ck"
if [ -x "$ROOT/build/muon" ]; then
  # The example prints the same losses at any world size.
  ex=$(mktemp -d)
  for np in 1 4; do
    mpi_run $np build/muon run examples/dist_hsdp.lua "$ex/ck$np.safetensors" >"$ex/out$np"
  done
  # safetensors: 8-byte header length, JSON header (key order may differ), tensor bytes.
  data_of() { local n; n=$(od -An -t u8 -N 8 "$1" | tr -d ' '); tail -c +$((n + 9)) "$1"; }
  if grep -q "^step 30" "$ex/out1" && [ "$(grep '^step' "$ex/out1")" = "$(grep '^step' "$ex/out4")" ] \
     && cmp -s <(data_of "$ex/ck1.safetensors") <(data_of "$ex/ck4.safetensors"); then
    tap ok "examples/dist_hsdp.lua: same losses and identical checkpoint tensor bytes at np=1 and np=4"
  else
    tap fail "examples/dist_hsdp.lua: np=1 and np=4 differ"
    diff "$ex/out1" "$ex/out4" | head -10 | sed 's/^/# /'
  fi
  rm -rf "$ex"
  # An uncaught Lua error on one rank aborts the whole job (no hang).
  t0=$(date +%s)
  mpi_run 3 build/muon run tests/mpi/abort_check.lua >/dev/null
  rc=$?
  t1=$(date +%s)
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ $((t1 - t0)) -lt 60 ]; then
    tap ok "abort: an error on rank 1 of 3 ends the job (exit $rc, $((t1 - t0)) s)"
  else
    tap fail "abort: exit $rc after $((t1 - t0)) s"
  fi
fi
[ "$FAILS" -eq 0 ]
