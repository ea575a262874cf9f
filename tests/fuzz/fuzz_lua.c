/* libFuzzer harness embedding LuaJIT: feeds each input to a function of
 * tests/fuzz/driver.lua (FUZZ_TARGET = "safetensors" or "config") through a
 * temporary file, the way users hand files to muon. The driver raises only
 * for outcomes that are bugs (an error that is not a clean validation
 * message, a load that accepted a malformed file); those abort here, and
 * the sanitizers catch memory errors in the C reader underneath. */
#include "muon.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#ifndef FUZZ_TARGET
#error "define FUZZ_TARGET"
#endif
#ifndef MUON_SRC_DIR
#error "define MUON_SRC_DIR"
#endif

/* Lua line coverage for libFuzzer: libFuzzer's instrumentation sees only
 * the C code, so the Lua parsers (safetensors header, checkpoint metadata,
 * config validation) would be blind spots. A line hook (JIT off: hooks do
 * not fire in traces) bumps one of these counters per (chunk, line); the
 * section makes libFuzzer treat them as extra coverage features. */
#define COV_N (1 << 16)
__attribute__((section("__libfuzzer_extra_counters"))) static uint8_t lua_cov[COV_N];

static void line_hook(lua_State *L, lua_Debug *ar)
{
    if (!lua_getinfo(L, "S", ar)) return;
    uintptr_t h = (uintptr_t)ar->source * 0x9E3779B97F4A7C15ull + (uintptr_t)ar->currentline * 0xC2B2AE3D27D4EB4Full;
    uint8_t *c = &lua_cov[(h >> 40) % COV_N];
    if (*c < 255) (*c)++;
}

static lua_State *L;
static int fn_ref;
static char path[256];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    L = luaL_newstate();
    luaL_openlibs(L);
    const char *dir = getenv("MUON_SRC_DIR");
    if (!dir) dir = MUON_SRC_DIR;
    char buf[4096];
    snprintf(buf, sizeof buf, "package.path = '%s/lua/?.lua;%s/lua/?/init.lua;' .. package.path", dir, dir);
    if (luaL_dostring(L, buf)) goto fail;
    snprintf(buf, sizeof buf, "%s/tests/fuzz/driver.lua", dir);
    if (luaL_dofile(L, buf)) goto fail;
    lua_getfield(L, -1, FUZZ_TARGET);
    if (!lua_isfunction(L, -1)) {
        fprintf(stderr, "driver.lua has no function '%s'\n", FUZZ_TARGET);
        abort();
    }
    fn_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    if (!getenv("MUON_FUZZ_NO_LUA_COV")) {
        if (luaL_dostring(L, "jit.off()")) goto fail;
        lua_sethook(L, line_hook, LUA_MASKLINE, 0);
    }
    const char *tmp = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/muon-fuzz-%s-%ld", tmp && *tmp ? tmp : "/tmp", FUZZ_TARGET,
             (long)getpid());
    return 0;
fail:
    fprintf(stderr, "fuzz init: %s\n", lua_tostring(L, -1));
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    fclose(f);
    lua_rawgeti(L, LUA_REGISTRYINDEX, fn_ref);
    lua_pushstring(L, path);
    if (lua_pcall(L, 1, 0, 0) != 0) {
        fprintf(stderr, "FUZZ FINDING: %s\n", lua_tostring(L, -1));
        abort();
    }
    lua_settop(L, 0);
    unlink(path);
    return 0;
}
