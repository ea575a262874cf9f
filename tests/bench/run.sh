#!/usr/bin/env bash
# `make bench`: runs every tests/bench/*_bench.lua, one after another, with
# the fast OpenBLAS core (OPENBLAS_CORETYPE unset so the Lua loader picks it
# from the CPU flags). Exit 1 if any benchmark fails.
set -u
cd "$(dirname "$0")/../.."
export LUA_PATH="$PWD/lua/?.lua;$PWD/lua/?/init.lua;$PWD/tests/?.lua;;"
status=0
for b in tests/bench/*_bench.lua; do
  [ -f "$b" ] || continue
  echo "== $(basename "$b" .lua)"
  if ! env -u OPENBLAS_CORETYPE luajit "$b"; then
    echo "bench $(basename "$b") failed" >&2
    status=1
  fi
done
exit $status
