#!/usr/bin/env bash
# make fuzz: builds the libFuzzer harnesses of tests/fuzz/ with clang
# (ASan + UBSan + coverage) into build/fuzz/ and runs each for FUZZ_SECONDS
# (default 60) from the seed corpus tests/fuzz/corpus/<name>/. New inputs go
# to build/fuzz/work/<name>/ (the committed corpus stays small); a crash is
# written to build/fuzz/artifacts/<name>/ and fails the run: copy it into
# tests/fuzz/regressions/<name>/ once fixed (tests/fuzz_spec.lua replays them).
#   FUZZ_SECONDS=300 make fuzz      FUZZ_TARGETS="npy config" make fuzz
# Target "tensor" is the Lua tensor view fuzzer (tests/fuzz/tensor_fuzz.lua)
# on the ASan + UBSan library build-san/libmuon.so (built here if needed).
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
SECONDS_EACH=${FUZZ_SECONDS:-60}
TARGETS=${FUZZ_TARGETS:-"npy safetensors config tensor"}
CLANG=${FUZZ_CC:-$(command -v clang-14 || command -v clang)}
[ -n "$CLANG" ] || { echo "make fuzz: clang not found (apt-get install clang-14 libclang-rt-14-dev)"; exit 1; }
OUT=build/fuzz
mkdir -p "$OUT/obj" "$OUT/gen"

SAN="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
CFLAGS="-O1 -g -std=c11 -D_POSIX_C_SOURCE=200809L -DMU_BUILDING -fvisibility=hidden $SAN"
DEPC=$(pkg-config --cflags luajit openblas)
DEPL="$(pkg-config --libs luajit openblas) -lm -lpthread -ldl"

# cdef.inc exactly as the Makefile makes it
"$CLANG" -E -P -DMU_FFI_CDEF src/muon_ffi.h | grep -v '^[[:space:]]*$' \
  | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/^/"/' -e 's/$/\\n"/' > "$OUT/gen/cdef.inc.tmp" \
  && mv "$OUT/gen/cdef.inc.tmp" "$OUT/gen/cdef.inc" || exit 1

# The library, instrumented for coverage (single-process comm backend: no MPI).
objs=()
for src in src/*.c; do
  o="$OUT/obj/$(basename "$src" .c).o"
  stale=0
  [ -f "$o" ] && [ ! "$src" -nt "$o" ] || stale=1
  for h in src/*.h; do [ "$h" -nt "$o" ] && stale=1; done
  if [ "$stale" = 1 ]; then
    "$CLANG" $CFLAGS -fsanitize=fuzzer-no-link $DEPC -I"$OUT/gen" -Isrc -c "$src" -o "$o" || exit 1
  fi
  objs+=("$o")
done
LINK="-Wl,--export-dynamic"
build() { # name source extra-flags...
  local name=$1 src=$2; shift 2
  "$CLANG" $CFLAGS -fsanitize=fuzzer $DEPC -Isrc "$@" -o "$OUT/fuzz_$name" "$src" "${objs[@]}" $LINK $DEPL || exit 1
}
build npy tests/fuzz/fuzz_npy.c
build safetensors tests/fuzz/fuzz_lua.c -DFUZZ_TARGET='"safetensors"' -DMUON_SRC_DIR="\"$ROOT\""
build config tests/fuzz/fuzz_lua.c -DFUZZ_TARGET='"config"' -DMUON_SRC_DIR="\"$ROOT\""

export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export OPENBLAS_NUM_THREADS=1 MU_FOREACH_THREADS=1
status=0
summary=""
for t in $TARGETS; do
  if [ "$t" = tensor ]; then
    # The Lua tensor view fuzzer (tests/fuzz/tensor_fuzz.lua) on the ASan +
    # UBSan build of the library (build-san/, as make test SAN=1).
    echo "== fuzz tensor for ${SECONDS_EACH}s"
    log="$OUT/tensor.log"
    make --no-print-directory SAN=1 build-san/libmuon.so >"$OUT/tensor-build.log" 2>&1 || { echo "SAN build failed"; exit 1; }
    asan_rt=$(${CC:-cc} -print-file-name=libasan.so)
    LUA_PATH="$ROOT/lua/?.lua;$ROOT/lua/?/init.lua;$ROOT/tests/?.lua;$ROOT/tests/fuzz/?.lua;;" \
      MUON_LIB="$ROOT/build-san/libmuon.so" LD_PRELOAD="$asan_rt" ASAN_OPTIONS="detect_leaks=0:abort_on_error=1" \
      luajit tests/fuzz/tensor_run.lua "$SECONDS_EACH" >"$log" 2>&1
    rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    if [ "$rc" -ne 0 ]; then
      status=1
      echo "FINDING in tensor (exit $rc); see $log"
      grep -E "FUZZ FINDING|ERROR|runtime error|SUMMARY" "$log" | head -5
    fi
    line="fuzz tensor: ${execs:-?} ops in ${SECONDS_EACH}s, $([ "$rc" -eq 0 ] && echo "no findings" || echo "FINDING")"
    echo "$line"
    summary="$summary$line"$'\n'
    continue
  fi
  mkdir -p "$OUT/work/$t" "$OUT/artifacts/$t"
  extra=()
  [ -f "tests/fuzz/$t.dict" ] && extra+=("-dict=tests/fuzz/$t.dict")
  # LuaJIT keeps objects in its own mmap'd heap, which LeakSanitizer does not
  # scan: leak checks only for the pure C harness.
  leaks=1
  [ "$t" = npy ] || leaks=0
  asan="$ASAN_OPTIONS"
  [ "$leaks" = 1 ] || asan="$asan:detect_leaks=0"
  echo "== fuzz $t for ${SECONDS_EACH}s"
  log="$OUT/$t.log"
  ASAN_OPTIONS="$asan" "$OUT/fuzz_$t" -max_total_time="$SECONDS_EACH" -timeout=20 -rss_limit_mb=4096 -max_len=4096 \
    -detect_leaks=$leaks -print_final_stats=1 -artifact_prefix="$OUT/artifacts/$t/" "${extra[@]}" \
    "$OUT/work/$t" "tests/fuzz/corpus/$t" >"$log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1)
  if [ "$rc" -ne 0 ]; then
    status=1
    echo "FINDING in $t (exit $rc); see $log and $OUT/artifacts/$t/"
    grep -E "ERROR|FUZZ FINDING|runtime error|SUMMARY" "$log" | head -5
  fi
  line="fuzz $t: ${execs:-?} execs in ${SECONDS_EACH}s, ${cov:-cov: ?}, $([ "$rc" -eq 0 ] && echo "no findings" || echo "FINDING")"
  echo "$line"
  summary="$summary$line"$'\n'
done
printf '%s' "$summary"
exit $status
