#!/usr/bin/env bash
# Runs every test (busted specs, C tests, the Python package's tests, MPI
# tests, one MPI job at a time) and ends with one plain line "N passed, N
# failed". Exit 1 on any failure. Each component reports TAP lines ("ok ..."
# / "not ok ..."); a component that exits non-zero without a "not ok" line
# counts as one failure. "ok ... # SKIP" lines (a test that cannot run here:
# torch or mpi4py missing, no MPI) count as skipped, not passed. Output is
# streamed as it comes: a line per test, "# <spec file>" lines from the
# busted handler tests/tap_progress.lua, and a heartbeat after 10 s of
# silence (tests/heartbeat.bash).
set -u
cd "$(dirname "$0")/.."
export LUA_PATH="$PWD/lua/?.lua;$PWD/lua/?/init.lua;$PWD/tests/?.lua;;"
. tests/heartbeat.bash
passed=0
failed=0
skipped=0
failures=() # "component: test name" of every failing test, for the summary
log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT

run_tap() { # name command...
  local name=$1; shift
  local out="$log/$name.out"
  echo "== $name"
  # (streamed as it runs, never silent for more than 10 s, and kept for the
  # counts below)
  "$@" 2>&1 | heartbeat "$name" | tee "$out"
  local status=${PIPESTATUS[0]}
  local p f s
  s=$(grep -E '^ok [0-9]' "$out" | grep -ciE '# SKIP')
  p=$(($(grep -cE '^ok [0-9]' "$out") - s))
  f=$(grep -cE '^not ok [0-9]' "$out")
  if [ "$status" -ne 0 ] && [ "$f" -eq 0 ]; then
    echo "not ok - $name exited with status $status"
    failures+=("$name: exited with status $status")
    f=1
  fi
  local line
  while IFS= read -r line; do
    failures+=("$name: ${line#not ok }")
  done < <(grep -E '^not ok [0-9]' "$out")
  passed=$((passed + p))
  failed=$((failed + f))
  skipped=$((skipped + s))
}

# MUON_BUILD: the build tree (make test SAN=1 passes build-san). SAN=1: the
# specs load the instrumented library (MUON_LIB) under plain luajit with the
# ASan runtime preloaded; leak checks stay off for luajit itself (LuaJIT
# keeps its objects in its own mmap'd heap, which LeakSanitizer does not
# scan, so every GC-owned tensor would be reported), on for the C tests.
# MPI tests are skipped under SAN (Open MPI's own allocations and its
# shared-memory transport flood ASan reports). VALGRIND=1: the C tests run
# under valgrind (suppressions: tests/valgrind.supp).
BUILD=${MUON_BUILD:-build}
export MUON_BUILD=$BUILD
# TSAN=1: only the C tests, on the ThreadSanitizer build (build-tsan/): the
# Lua specs would need an instrumented luajit, MPI an instrumented Open MPI.
# ns_openmp_test is left out: libgomp is not instrumented, so TSan cannot
# see its barriers and reports the parallel regions' hand-over as races.
if [ "${TSAN:-}" = 1 ]; then
  export TSAN_OPTIONS=halt_on_error=1:exitcode=66
  for t in "$BUILD"/tests/*; do
    [ -x "$t" ] || continue
    [ "$(basename "$t")" = ns_openmp_test ] && { echo "# $t skipped under TSAN=1 (see above)"; continue; }
    run_tap "c-$(basename "$t")-tsan" "$t"
  done
  [ "$skipped" -gt 0 ] && echo "($skipped skipped: not counted as passed)"
  echo "$passed passed, $failed failed"
  [ "$failed" -eq 0 ]
  exit
fi
if [ "${SAN:-}" = 1 ]; then
  export MUON_LIB=$PWD/$BUILD/libmuon.so
  asan_rt=$(${CC:-cc} -print-file-name=libasan.so)
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  # (allocator_may_return_null: a huge allocation fails as malloc does,
  # NULL, so that the specs see MU_ENOMEM instead of ASan aborting)
  export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:allocator_may_return_null=1
  run_tap busted env LD_PRELOAD="$asan_rt" luajit /usr/bin/busted -o tests/tap_progress.lua
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
else
  # Lua specs (busted under LuaJIT, TAP output).
  run_tap busted luajit /usr/bin/busted -o tests/tap_progress.lua
fi

# C tests: each $BUILD/tests/<name> prints TAP.
for t in "$BUILD"/tests/*; do
  [ -x "$t" ] || continue
  if [ "${VALGRIND:-}" = 1 ]; then
    run_tap "c-$(basename "$t")-valgrind" valgrind -q --leak-check=full --show-leak-kinds=definite,indirect,possible \
      --errors-for-leak-kinds=definite,indirect,possible --error-exitcode=1 --suppressions=tests/valgrind.supp "$t"
  else
    run_tap "c-$(basename "$t")" "$t"
  fi
done

# The Python package (src/libmuon): tests/python/run.py prints TAP. Under
# SAN=1 the package loads the instrumented library with the ASan runtime
# preloaded into Python (leak checks off: CPython's own allocations).
PYTHON=${PYTHON:-$(command -v /usr/bin/python3 || command -v python3)}
if [ -z "$PYTHON" ] || ! "$PYTHON" -c "import cffi, numpy" 2>/dev/null; then
  echo "ok 1 - python: skipped (${PYTHON:-no python3}: no cffi or numpy; Debian: python3-cffi python3-numpy) # SKIP" \
    >"$log/python.skip"
  run_tap python cat "$log/python.skip"
elif [ "${SAN:-}" = 1 ]; then
  run_tap python env LD_PRELOAD="$asan_rt" ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:allocator_may_return_null=1 \
    "$PYTHON" tests/python/run.py
else
  run_tap python "$PYTHON" tests/python/run.py
fi

# MPI tests: tests/mpi/*.sh, strictly one after another.
[ "${SAN:-}" = 1 ] && echo "# MPI tests skipped under SAN=1 (see above)"
for t in tests/mpi/*.sh; do
  [ "${SAN:-}" = 1 ] && break
  [ -f "$t" ] || continue
  run_tap "mpi-$(basename "$t" .sh)" bash "$t"
done

if [ "$failed" -ne 0 ]; then
  echo "== failing tests"
  for f in "${failures[@]}"; do echo "  $f"; done
fi
[ "$skipped" -gt 0 ] && echo "($skipped skipped: not counted as passed)"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
