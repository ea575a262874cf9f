#!/usr/bin/env bash
# `make bench`: runs every tests/bench/*_bench.lua, one after another, with
# the fast OpenBLAS core (OPENBLAS_CORETYPE unset so the Lua loader picks it
# from the CPU flags). Exit 1 if any benchmark fails. Each benchmark prints
# its rows as it measures them; a heartbeat line follows 10 s of silence
# (tests/heartbeat.bash).
set -u
cd "$(dirname "$0")/../.."
export LUA_PATH="$PWD/lua/?.lua;$PWD/lua/?/init.lua;$PWD/tests/?.lua;;"
. tests/heartbeat.bash
status=0
for b in tests/bench/*_bench.lua; do
  [ -f "$b" ] || continue
  echo "== $(basename "$b" .lua)"
  # (stdbuf: LuaJIT's stdout is line-buffered, so each row shows when printed)
  env -u OPENBLAS_CORETYPE stdbuf -oL luajit "$b" 2>&1 | heartbeat "$(basename "$b" .lua)"
  if [ "${PIPESTATUS[0]}" -ne 0 ]; then
    echo "bench $(basename "$b") failed" >&2
    status=1
  fi
done
exit $status
