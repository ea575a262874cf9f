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
