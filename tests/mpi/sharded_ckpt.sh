#!/usr/bin/env bash
# Sharded checkpoints (eng:save(dir, { sharded = true })): saved at np 4 on
# meshes replicate:2,shard:2 and shard:4, loaded at np 4, 3, 2 and 1 on
# other meshes, 5 more steps bitwise equal to 10 steps in one process
# (tests/mpi/dist_check.lua save / resume, every kind, empty shards,
# replicated state, bfloat16 state); a missing, extra or corrupt shard and
# a failed save on one rank fail every rank with nothing changed; the bytes
# a rank's save allocates (tests/mpi/sharded_check.lua).
. "$(dirname "$0")/lib.bash"
S=tests/mpi/dist_check.lua
ck=$(mktemp -d)
for m in "replicate:2,shard:2" "shard:4"; do
  d="$ck/${m//[:,]/_}"
  MU_TEST_SHARDED=1 mpi_case "sharded np=4 mesh $m save" 4 $RUN $S save "$m" "$d"
  for c in "4 shard:2,shard2:2" "4 $m" "3 replicate:3" "3 shard:3" "2 shard:2" "1 shard:1"; do
    set -- $c
    mpi_case "sharded np=$1 mesh $2 resume from np=4 $m" "$1" $RUN $S resume "$2" "$d"
  done
done
MU_TEST_STATE_DTYPE=bfloat16 MU_TEST_SHARDED=1 mpi_case "sharded np=4 bfloat16 state save" 4 $RUN $S save \
  "replicate:2,shard:2" "$ck/bf16"
for c in "3 shard:3" "1 shard:1"; do
  set -- $c
  MU_TEST_STATE_DTYPE=bfloat16 mpi_case "sharded np=$1 bfloat16 state resume from np=4" "$1" $RUN $S resume "$2" "$ck/bf16"
done
# the directory's files at np=1 resume from the np=4 shards: a sharded save at np 1 loads at np 4
MU_TEST_SHARDED=1 mpi_case "sharded np=1 save" 1 $RUN $S save "shard:1" "$ck/one"
mpi_case "sharded np=4 resume from np=1" 4 $RUN $S resume "replicate:2,shard:2" "$ck/one"
X=tests/mpi/sharded_check.lua
for c in "4 replicate:2,shard:2" "4 shard:4" "3 shard:3" "1 shard:1"; do
  set -- $c
  mpi_case "sharded np=$1 mesh $2 failures and memory" "$1" $RUN $X "$2" "$ck/x$1"
done
rm -rf "$ck"
[ "$FAILS" -eq 0 ]
