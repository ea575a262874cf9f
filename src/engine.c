/*
 * The embedding API: a mu_engine owns a LuaJIT state that runs the Lua
 * engine (lua/muon/engine.lua through lua/muon/host.lua). This is the only
 * file of the library that includes the Lua headers. Every call into Lua is
 * protected (lua_pcall with a traceback handler), so no Lua error escapes as
 * a longjmp; failures become status codes with a per-engine detail message.
 */
#define _GNU_SOURCE /* dladdr */
#include "muon_internal.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

/* The engine behind a handle (the handle itself is a token, see
 * "handles" below). */
typedef struct mu__eng {
    lua_State *L;
    int host_ref;   /* registry: the muon.host module table */
    int engine_ref; /* registry: the Lua engine object */
    char *err;      /* detail of the last failure, "" if none */
    int busy;       /* a call is running (registry lock) */
    int close_pending; /* closed during that call: freed when it returns */
} mu__eng;

/* Registry key (its address) of the metatable of muon's own error objects
 * (lua/muon/core.lua), captured when the engine's modules load: only those
 * objects choose the status code of a call. */
static const char mu__errmt_key = 0;

/* ------------------------------------------------------------ messages */

/* The status code an error value chooses: a plain value (a string) none
 * (0: the caller's fallback applies); one of muon's own error objects
 * (lua/muon/errors.lua, recognised by its metatable's identity, which a
 * config cannot forge) its `code` when that is a failure code of the
 * table in muon.h; any other table -- a config's, whatever its fields or
 * metatable name -- MU_ELUA. So a config cannot choose the status an
 * mu_engine_* call returns (MU_OK, MU_EIO, or an arbitrary number).
 * Raw reads only: the value may come from a config, and its metamethods
 * are not called. */
static int mu__code_of(lua_State *L, int idx)
{
    if (!lua_istable(L, idx)) return 0;
    int ours = 0;
    if (lua_getmetatable(L, idx)) { /* the real one, whatever __metatable says */
        lua_pushlightuserdata(L, (void *)&mu__errmt_key);
        lua_rawget(L, LUA_REGISTRYINDEX);
        ours = lua_istable(L, -1) && lua_rawequal(L, -1, -2);
        lua_pop(L, 2);
    }
    if (!ours) return MU_ELUA;
    int code = MU_ELUA;
    lua_pushliteral(L, "code");
    lua_rawget(L, idx);
    if (lua_type(L, -1) == LUA_TNUMBER) {
        lua_Number n = lua_tonumber(L, -1);
        if (n < 0 && n >= INT_MIN && n == (lua_Number)(int)n && strcmp(mu_errname((int)n), "UNKNOWN") != 0)
            code = (int)n;
    }
    lua_pop(L, 1);
    return code;
}

/* For a string error: the traceback where it was first raised, if it was
 * caught and raised again on its way here (by the sandbox membrane, which
 * rethrows a config's errors) and muon.errors kept that traceback:
 * require("muon.errors").traceback(err). NULL otherwise. Pushes one value. */
static const char *mu__first_traceback(lua_State *L, int idx)
{
    lua_getfield(L, LUA_REGISTRYINDEX, "_LOADED");
    lua_getfield(L, -1, "muon.errors");
    lua_remove(L, -2);
    if (!lua_istable(L, -1)) return NULL;
    lua_pushliteral(L, "traceback");
    lua_rawget(L, -2);
    lua_remove(L, -2);
    if (!lua_isfunction(L, -1)) return NULL;
    lua_pushvalue(L, idx);
    if (lua_pcall(L, 1, 1, 0) != 0) return NULL;
    return lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
}

/* Message handler for lua_pcall: turns any error value into a table
 * { msg = <string>, code = <MU_E* number or nil>, tb = <traceback or nil> }.
 * Error objects (lua/muon/errors.lua: { code =, msg = [, tb =] }) choose the
 * status code. The traceback is the one an error carries (or that
 * muon.errors kept for a string): captured where the user's hook raised and
 * cut to the user's frames. Any other error (a user mistake the message
 * names, or a fault of muon itself) has none: muon's own frames say nothing
 * the user controls. MUON_TRACEBACK=1 adds the traceback of this point to
 * those (for reporting a fault of muon). */
static int mu__msgh_ex(lua_State *L, int always_tb);

static int mu__msgh(lua_State *L)
{
    return mu__msgh_ex(L, 0);
}

/* For scripts (mu_script_run*): the script is the user's own code, so a
 * traceback always comes, cut to the user's frames like a hook's. */
static int mu__msgh_script(lua_State *L)
{
    return mu__msgh_ex(L, 1);
}

/* The traceback of this point cut to the user's frames
 * (require("muon.errors").trim_traceback); nil when muon.errors is not
 * loaded (muon failed to load: no user code ran). Pushes one value. */
static void mu__user_traceback(lua_State *L)
{
    int top = lua_gettop(L);
    luaL_traceback(L, L, NULL, 2);
    lua_getfield(L, LUA_REGISTRYINDEX, "_LOADED");
    lua_getfield(L, -1, "muon.errors");
    lua_remove(L, -2);
    if (lua_istable(L, -1)) {
        lua_pushliteral(L, "trim_traceback");
        lua_rawget(L, -2);
        lua_remove(L, -2);
        if (lua_isfunction(L, -1)) {
            lua_pushvalue(L, -2);
            if (lua_pcall(L, 1, 1, 0) == 0 && lua_type(L, -1) == LUA_TSTRING) {
                lua_remove(L, -2);
                return;
            }
        }
    }
    lua_settop(L, top);
    lua_pushnil(L);
}

static int mu__msgh_ex(lua_State *L, int always_tb)
{
    const char *msg = NULL;
    const char *tb = NULL;
    int code = mu__code_of(L, 1);
    if (lua_istable(L, 1)) {
        lua_pushliteral(L, "msg");
        lua_rawget(L, 1);
        msg = lua_tostring(L, -1);
        lua_pushliteral(L, "tb");
        lua_rawget(L, 1);
        if (lua_type(L, -1) == LUA_TSTRING) tb = lua_tostring(L, -1);
    } else {
        msg = lua_tostring(L, 1);
        if (lua_type(L, 1) == LUA_TSTRING) tb = mu__first_traceback(L, 1);
    }
    if (!msg) {
        if (luaL_callmeta(L, 1, "__tostring") && lua_isstring(L, -1))
            msg = lua_tostring(L, -1);
        else
            msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    }
    lua_createtable(L, 0, 3);
    int t = lua_gettop(L);
    lua_pushstring(L, msg);
    lua_setfield(L, t, "msg");
    if (code) {
        lua_pushinteger(L, code);
        lua_setfield(L, t, "code");
    }
    const char *want = getenv("MUON_TRACEBACK");
    if (tb)
        lua_pushstring(L, tb);
    else if (always_tb)
        mu__user_traceback(L);
    else if (want && *want && strcmp(want, "0") != 0)
        luaL_traceback(L, L, NULL, 1);
    else
        lua_pushnil(L);
    lua_setfield(L, t, "tb");
    lua_pushvalue(L, t);
    return 1;
}

static void mu__set_err(mu__eng *eng, const char *s)
{
    if (!eng) return;
    size_t n = strlen(s);
    char *p = realloc(eng->err, n + 1);
    if (!p) { /* keep the old buffer; at least cut it */
        if (eng->err) eng->err[0] = '\0';
        return;
    }
    memcpy(p, s, n + 1);
    eng->err = p;
}

/* After a failed lua_pcall (status != 0, error value on top): record the
 * message in mu_last_error() ("what: msg") and, with the traceback, in the
 * engine's detail. Pops the error value and returns the status code: the
 * error object's, or fallback for a plain error (a string). */
static int mu__lua_fail(lua_State *L, mu__eng *eng, int status, int fallback, const char *what)
{
    const char *msg = NULL, *tb = NULL;
    int rc = fallback; /* for plain errors; an error object brings its code */
    if (status == LUA_ERRMEM) {
        rc = MU_ENOMEM;
        msg = "not enough memory in the Lua state";
    } else if (lua_istable(L, -1)) { /* made by mu__msgh */
        lua_getfield(L, -1, "msg");
        lua_getfield(L, -2, "code");
        lua_getfield(L, -3, "tb");
        msg = lua_tostring(L, -3);
        if (lua_isnumber(L, -2)) rc = (int)lua_tointeger(L, -2);
        tb = lua_tostring(L, -1);
    } else {
        msg = lua_tostring(L, -1);
    }
    if (!msg) msg = "unknown Lua error";
    /* drop the position prefix that error(msg, 2) adds when the engine
     * blames its caller, the glue in muon/host.lua */
    const char *glue = strstr(msg, "muon/host.lua:");
    if (glue && !memchr(msg, '\n', (size_t)(glue - msg))) {
        const char *rest = strstr(glue, ": ");
        if (rest) msg = rest + 2;
    }
    mu__fail(rc, "%s: %s", what, msg);
    if (eng) {
        luaL_Buffer b;
        luaL_buffinit(L, &b);
        lua_pushfstring(L, "%s: %s", what, msg);
        luaL_addvalue(&b);
        if (tb) {
            luaL_addchar(&b, '\n');
            lua_pushstring(L, tb);
            luaL_addvalue(&b);
        }
        luaL_pushresult(&b);
        mu__set_err(eng, lua_tostring(L, -1));
    }
    lua_settop(L, 1); /* keep the message handler at index 1 */
    return rc;
}

/* Record a C-side argument error on the engine and the thread. */
#define MU__EFAIL(eng, code, ...) \
    (mu__fail((code), __VA_ARGS__), mu__set_err((eng), mu_last_error()), (code))

/* -------------------------------------------------------- module search */

static int mu__is_file(const char *path)
{
    return access(path, R_OK) == 0;
}

/* Looks for <dir>/share/lua/5.1/muon/init.lua or <dir>/lua/muon/init.lua in
 * start's directory and up to 3 parents; writes the Lua directory to out. */
static int mu__search_up(const char *start, char *out, size_t cap)
{
    char dir[PATH_MAX];
    char probe[PATH_MAX + 64];
    if (!start) return 0;
    if (!realpath(start, dir)) {
        /* /proc/self/exe of a binary replaced while running reads
         * "<path> (deleted)": its directory still tells where we are */
        ssize_t n = readlink(start, probe, sizeof probe - 1);
        if (n <= 0) {
            if (strlen(start) >= sizeof probe) return 0;
            strcpy(probe, start);
        } else {
            probe[n] = '\0';
        }
        char *slash = strrchr(probe, '/');
        if (!slash) return 0;
        *slash = '\0';
        char parent[PATH_MAX];
        if (!realpath(probe[0] ? probe : "/", parent)) return 0;
        snprintf(probe, sizeof probe, "%s/x", parent);
        if (strlen(probe) >= sizeof dir) return 0;
        strcpy(dir, probe);
    }
    for (int level = 0; level < 4; level++) {
        char *slash = strrchr(dir, '/');
        if (!slash) return 0;
        if (slash == dir) slash[1] = '\0'; else *slash = '\0';
        static const char *const subs[] = {"/share/lua/5.1", "/lua"};
        for (int i = 0; i < 2; i++) {
            snprintf(probe, sizeof probe, "%s%s/muon/init.lua", strcmp(dir, "/") ? dir : "", subs[i]);
            if (mu__is_file(probe)) {
                size_t n = strlen(probe) - strlen("/muon/init.lua");
                if (n >= cap) return 0;
                memcpy(out, probe, n);
                out[n] = '\0';
                return 1;
            }
        }
        if (strcmp(dir, "/") == 0) return 0;
    }
    return 0;
}

/* Fills templ with a package.path prefix ("...;") or "" if nothing found. */
static void mu__lua_path(const char *explicit_dir, char *templ, size_t cap)
{
    char dir[PATH_MAX];
    const char *env = getenv("MUON_LUA_PATH");
    templ[0] = '\0';
    if (explicit_dir && *explicit_dir) {
        snprintf(dir, sizeof dir, "%s", explicit_dir);
    } else if (env && *env) {
        if (strchr(env, '?')) {
            snprintf(templ, cap, "%s;", env);
            return;
        }
        snprintf(dir, sizeof dir, "%s", env);
    } else {
        Dl_info info;
        int found = 0;
        if (dladdr((void *)&mu_engine_open, &info) && info.dli_fname && info.dli_fname[0])
            found = mu__search_up(info.dli_fname, dir, sizeof dir);
        if (!found) found = mu__search_up("/proc/self/exe", dir, sizeof dir);
        if (!found) return;
    }
    snprintf(templ, cap, "%s/?.lua;%s/?/init.lua;", dir, dir);
}

/* A fresh state with the standard libraries, package.path set, and the
 * message handler at stack index 1. NULL on failure (mu_last_error set). */
static lua_State *mu__new_state(const char *explicit_dir)
{
    char templ[2 * PATH_MAX + 64];
    lua_State *L = luaL_newstate();
    if (!L) {
        mu__fail(MU_ENOMEM, "cannot create a Lua state");
        return NULL;
    }
    luaL_openlibs(L);
    mu__lua_path(explicit_dir, templ, sizeof templ);
    if (templ[0]) {
        lua_getglobal(L, "package");
        lua_getfield(L, -1, "path");
        lua_pushfstring(L, "%s%s", templ, lua_tostring(L, -1));
        lua_setfield(L, -3, "path");
        lua_pop(L, 2);
    }
    lua_settop(L, 0);
    lua_pushcfunction(L, mu__msgh);
    return L;
}

/* Calls require(module) protected; leaves the module on the stack. */
static int mu__require(lua_State *L, const char *module)
{
    lua_getglobal(L, "require");
    lua_pushstring(L, module);
    return lua_pcall(L, 1, 1, 1);
}

/* ------------------------------------------------------------- engines */

/* Pushes host[fn] and the engine object; returns the stack base. */
static void mu__push_call(mu__eng *eng, const char *fn)
{
    lua_State *L = eng->L;
    lua_settop(L, 1); /* keep the message handler */
    lua_rawgeti(L, LUA_REGISTRYINDEX, eng->host_ref);
    lua_getfield(L, -1, fn);
    lua_remove(L, -2);
    lua_rawgeti(L, LUA_REGISTRYINDEX, eng->engine_ref);
}

static int mu__call(mu__eng *eng, int nargs, int nres, int fallback, const char *what)
{
    int status = lua_pcall(eng->L, nargs + 1, nres, 1);
    if (status != 0) return mu__lua_fail(eng->L, eng, status, fallback, what);
    return MU_OK;
}

/* -------------------------------------------------------------- handles */

/*
 * A mu_engine * is not the engine's address but a token: a slot of a
 * process-wide registry and the generation the slot had when the engine
 * opened, tagged in the top bits (no user-space pointer has them set).
 * Every call looks its handle up, so a closed handle (double close, use
 * after close) or a foreign value never reaches freed or unrelated memory:
 * the call returns MU_ESTATE. The library never dereferences a handle.
 *
 * Why a registry (the one piece of process-wide mutable state here): a
 * flag inside the engine would need the engine's memory to outlive close
 * (a leak per engine) and could not tell a foreign pointer from a real one;
 * a token checked against a table can. The table is small (one pointer
 * and one generation per open engine), guarded by one mutex, and freed
 * when the last engine closes.
 *
 * The registry also marks an engine busy for the duration of each call: a
 * second call on the same engine while one runs (from another thread, or
 * re-entered from a hook) returns MU_ESTATE instead of corrupting its Lua
 * state, and a close during a call takes effect when that call returns.
 *
 * What remains undefined: a token forged to match a live engine's slot and
 * generation exactly (it is that engine); generations repeat after 2^32
 * opens, so a handle kept across four billion later opens may name a new
 * engine; the string returned by mu_engine_error is valid until the next
 * call on the engine from any thread.
 */
#include <pthread.h>

enum { MU__SLOT_BITS = 20, MU__GEN_BITS = 32 };
#define MU__HANDLE_TAG ((uint64_t)0xA5B << (MU__SLOT_BITS + MU__GEN_BITS))
#define MU__HANDLE_TAG_MASK (~(uint64_t)0 << (MU__SLOT_BITS + MU__GEN_BITS))
_Static_assert(sizeof(uintptr_t) == 8, "engine handles are 64-bit tokens");

typedef struct {
    mu__eng *eng; /* NULL: free slot */
    uint32_t gen;
} mu__slot;

static pthread_mutex_t mu__reg_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    mu__slot *slots;
    uint32_t cap, live, next_gen;
} mu__reg;

/* Registers eng; its handle in *out. */
static int mu__reg_add(mu__eng *eng, mu_engine **out)
{
    pthread_mutex_lock(&mu__reg_lock);
    uint32_t i = 0;
    while (i < mu__reg.cap && mu__reg.slots[i].eng) i++;
    if (i == mu__reg.cap) {
        uint32_t cap = mu__reg.cap ? 2 * mu__reg.cap : 8;
        mu__slot *ns = cap <= (1u << MU__SLOT_BITS) ? realloc(mu__reg.slots, cap * sizeof *ns) : NULL;
        if (!ns) {
            pthread_mutex_unlock(&mu__reg_lock);
            return mu__fail(MU_ENOMEM, "mu_engine_open: too many open engines");
        }
        memset(ns + mu__reg.cap, 0, (cap - mu__reg.cap) * sizeof *ns);
        mu__reg.slots = ns;
        mu__reg.cap = cap;
    }
    uint32_t gen = ++mu__reg.next_gen; /* process-wide: a reused slot gets a new one */
    mu__reg.slots[i].eng = eng;
    mu__reg.slots[i].gen = gen;
    mu__reg.live++;
    *out = (mu_engine *)(uintptr_t)(MU__HANDLE_TAG | (uint64_t)gen << MU__SLOT_BITS | i);
    pthread_mutex_unlock(&mu__reg_lock);
    return MU_OK;
}

/* The slot of handle h, or NULL (lock held). */
static mu__slot *mu__reg_find(const mu_engine *h)
{
    uint64_t v = (uint64_t)(uintptr_t)h;
    if ((v & MU__HANDLE_TAG_MASK) != MU__HANDLE_TAG) return NULL;
    uint32_t i = (uint32_t)(v & ((1u << MU__SLOT_BITS) - 1));
    uint32_t gen = (uint32_t)(v >> MU__SLOT_BITS);
    if (i >= mu__reg.cap || !mu__reg.slots[i].eng || mu__reg.slots[i].gen != gen) return NULL;
    return &mu__reg.slots[i];
}

static void mu__reg_remove(mu__slot *slot)
{
    slot->eng = NULL;
    if (--mu__reg.live == 0) { /* nothing open: give the table back */
        free(mu__reg.slots);
        mu__reg.slots = NULL;
        mu__reg.cap = 0;
    }
}

static void mu__eng_free(mu__eng *eng)
{
    if (eng->L) lua_close(eng->L);
    free(eng->err);
    free(eng);
}

/* The engine of handle h, marked busy until mu__release; MU_EINVAL for
 * NULL, MU_ESTATE for a closed or foreign handle or a busy engine. */
static int mu__acquire(const mu_engine *h, const char *fn, mu__eng **out)
{
    *out = NULL;
    if (!h) return mu__fail(MU_EINVAL, "%s: eng is NULL", fn);
    pthread_mutex_lock(&mu__reg_lock);
    mu__slot *slot = mu__reg_find(h);
    mu__eng *eng = slot ? slot->eng : NULL;
    int busy = eng && eng->busy;
    if (eng && !busy) eng->busy = 1;
    pthread_mutex_unlock(&mu__reg_lock);
    if (!eng)
        return mu__fail(MU_ESTATE, "%s: eng is not an open engine (closed, or not a handle from "
                        "mu_engine_open)", fn);
    if (busy)
        return mu__fail(MU_ESTATE, "%s: the engine is already in a call (used from two threads "
                        "at once, or from inside its own hook)", fn);
    *out = eng;
    return MU_OK;
}

static void mu__release(mu__eng *eng)
{
    pthread_mutex_lock(&mu__reg_lock);
    eng->busy = 0;
    int gone = eng->close_pending;
    pthread_mutex_unlock(&mu__reg_lock);
    if (gone) mu__eng_free(eng);
}

int mu_engine_open(mu_engine **out, const char *config_path)
{
    return mu_engine_open_ex(out, config_path, NULL);
}

/* Pushes the metatable of muon's error objects (as muon.core makes them)
 * into the registry under mu__errmt_key. Protected (called by lua_pcall). */
static int mu__capture_errmt(lua_State *L)
{
    lua_getglobal(L, "require");
    lua_pushliteral(L, "muon.core");
    lua_call(L, 1, 1);
    lua_getfield(L, -1, "error_object");
    lua_pushinteger(L, MU_ELUA);
    lua_pushliteral(L, "");
    lua_call(L, 2, 1);
    lua_pushlightuserdata(L, (void *)&mu__errmt_key);
    if (!lua_getmetatable(L, -2)) return luaL_error(L, "muon.core made an error object without a metatable");
    lua_rawset(L, LUA_REGISTRYINDEX);
    return 0;
}

int mu_engine_open_ex(mu_engine **out, const char *config_path, const mu_engine_opts *opts)
{
    if (!out) return mu__fail(MU_EINVAL, "mu_engine_open: out is NULL");
    *out = NULL;
    if (!config_path || !*config_path)
        return mu__fail(MU_EINVAL, "mu_engine_open: config_path is NULL or empty");
    char resolved[PATH_MAX];
    if (mu_file_check(config_path, resolved, sizeof resolved) != MU_OK) {
        char reason[256];
        snprintf(reason, sizeof reason, "%s", mu_last_error());
        return mu__fail(MU_EIO, "mu_engine_open: config '%s' (resolved %s): %s", config_path, resolved,
                        reason);
    }

    mu__eng *eng = calloc(1, sizeof *eng);
    if (!eng) return mu__fail(MU_ENOMEM, "mu_engine_open: out of memory");
    eng->host_ref = eng->engine_ref = LUA_NOREF;
    eng->L = mu__new_state(opts ? opts->lua_path : NULL);
    if (!eng->L) {
        free(eng);
        return MU_ENOMEM;
    }
    lua_State *L = eng->L;
    int status = mu__require(L, "muon.host");
    if (status == 0) {
        lua_pushcfunction(L, mu__capture_errmt);
        status = lua_pcall(L, 0, 0, 1);
    }
    if (status != 0) {
        int rc = mu__lua_fail(L, NULL, status, MU_ELUA,
                              "mu_engine_open: loading muon.host (set MUON_LUA_PATH to the directory that holds "
                              "muon/init.lua, or pass mu_engine_opts.lua_path)");
        mu__eng_free(eng);
        return rc;
    }
    eng->host_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_settop(L, 1);
    lua_rawgeti(L, LUA_REGISTRYINDEX, eng->host_ref);
    lua_getfield(L, -1, "open");
    lua_remove(L, -2);
    lua_pushstring(L, config_path);
    lua_createtable(L, 0, 1);
    if (opts) {
        lua_pushboolean(L, opts->trusted != 0);
        lua_setfield(L, -2, "trusted");
    }
    status = lua_pcall(L, 2, 1, 1);
    if (status != 0) {
        int rc = mu__lua_fail(L, NULL, status, MU_EINVAL, "mu_engine_open");
        mu__eng_free(eng);
        return rc;
    }
    eng->engine_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_settop(L, 1);
    int rc = mu__reg_add(eng, out);
    if (rc) mu__eng_free(eng);
    return rc;
}

void mu_engine_close(mu_engine *h)
{
    if (!h) return;
    pthread_mutex_lock(&mu__reg_lock);
    mu__slot *slot = mu__reg_find(h);
    mu__eng *eng = slot ? slot->eng : NULL;
    int now = 0;
    if (eng) {
        mu__reg_remove(slot); /* from here on the handle is closed */
        if (eng->busy) eng->close_pending = 1; /* freed when that call returns */
        else now = 1;
    }
    pthread_mutex_unlock(&mu__reg_lock);
    if (!eng)
        mu__fail(MU_ESTATE, "mu_engine_close: eng is not an open engine (closed twice?)");
    if (now) mu__eng_free(eng);
}

const char *mu_engine_error(const mu_engine *h)
{
    if (!h) return mu_last_error();
    pthread_mutex_lock(&mu__reg_lock);
    mu__slot *slot = mu__reg_find(h);
    const char *err = slot ? (slot->eng->err ? slot->eng->err : "") : NULL;
    pthread_mutex_unlock(&mu__reg_lock);
    if (!err) {
        mu__fail(MU_ESTATE, "mu_engine_error: eng is not an open engine (closed, or not a handle "
                 "from mu_engine_open)");
        return mu_last_error();
    }
    return err;
}

static int eng_add_param(mu__eng *eng, const char *name, int dtype, int ndim,
                        const int64_t *shape, void *data, void *grad)
{
    if (!eng) return mu__fail(MU_EINVAL, "mu_engine_add_param: eng is NULL");
    if (!name || !*name) return MU__EFAIL(eng, MU_EINVAL, "mu_engine_add_param: name is NULL or empty");
    if (dtype != MU_F32 && dtype != MU_F64)
        return MU__EFAIL(eng, MU_EDTYPE,
                         "mu_engine_add_param: parameter '%s': dtype %d is not MU_F32 or MU_F64",
                         name, dtype);
    if (ndim < 0 || ndim > MU_MAX_DIMS)
        return MU__EFAIL(eng, MU_EINVAL, "mu_engine_add_param: parameter '%s': ndim %d is outside 0..%d",
                         name, ndim, (int)MU_MAX_DIMS);
    if (ndim > 0 && !shape)
        return MU__EFAIL(eng, MU_EINVAL, "mu_engine_add_param: parameter '%s': shape is NULL", name);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0)
            return MU__EFAIL(eng, MU_EINVAL,
                             "mu_engine_add_param: parameter '%s': shape[%d] is negative (%lld)", name,
                             i, (long long)shape[i]);
    if (mu__shape_numel(ndim, shape) < 0)
        return MU__EFAIL(eng, MU_EINVAL, "mu_engine_add_param: parameter '%s': shape overflows", name);
    if (!data)
        return MU__EFAIL(eng, MU_EINVAL, "mu_engine_add_param: parameter '%s': data is NULL", name);
    if (grad == data)
        return MU__EFAIL(eng, MU_EINVAL,
                         "mu_engine_add_param: parameter '%s': grad is the same buffer as data", name);
    if (grad) { /* both hold numel elements of dtype: their memory must not overlap */
        uintptr_t d = (uintptr_t)data, g = (uintptr_t)grad;
        uintptr_t bytes = (uintptr_t)mu__shape_numel(ndim, shape) * mu_dtype_size(dtype);
        if (bytes > 0 && d < g + bytes && g < d + bytes)
            return MU__EFAIL(eng, MU_EINVAL,
                             "mu_engine_add_param: parameter '%s': grad overlaps data (%llu bytes each)", name,
                             (unsigned long long)bytes);
    }

    lua_State *L = eng->L;
    mu__push_call(eng, "add_param");
    lua_pushstring(L, name);
    lua_pushinteger(L, dtype);
    lua_createtable(L, ndim, 0);
    for (int i = 0; i < ndim; i++) {
        lua_pushnumber(L, (lua_Number)shape[i]);
        lua_rawseti(L, -2, i + 1);
    }
    lua_pushlightuserdata(L, data);
    if (grad) lua_pushlightuserdata(L, grad); else lua_pushnil(L);
    return mu__call(eng, 5, 0, MU_EINVAL, "mu_engine_add_param");
}

static int eng_set_comm(mu__eng *eng, void *mpi_comm_ptr)
{
    if (!eng) return mu__fail(MU_EINVAL, "mu_engine_set_comm: eng is NULL");
    if (!mpi_comm_ptr) return MU__EFAIL(eng, MU_EINVAL, "mu_engine_set_comm: mpi_comm_ptr is NULL");
    mu__push_call(eng, "set_comm");
    lua_pushlightuserdata(eng->L, mpi_comm_ptr);
    return mu__call(eng, 1, 0, MU_ESTATE, "mu_engine_set_comm");
}

static int eng_add_param_sharded(mu__eng *eng, const char *name, int dtype, int ndim,
                                const int64_t *global_shape, int naxes,
                                const mu_placement *placements, void *local_data, void *local_grad)
{
    if (!eng) return mu__fail(MU_EINVAL, "mu_engine_add_param_sharded: eng is NULL");
    if (!name || !*name) return MU__EFAIL(eng, MU_EINVAL, "mu_engine_add_param_sharded: name is NULL or empty");
    if (ndim < 0 || ndim > MU_MAX_DIMS || (ndim > 0 && !global_shape))
        return MU__EFAIL(eng, MU_EINVAL, "mu_engine_add_param_sharded: parameter '%s': bad ndim %d or NULL shape",
                         name, ndim);
    for (int i = 0; i < ndim; i++)
        if (global_shape[i] < 0)
            return MU__EFAIL(eng, MU_EINVAL,
                             "mu_engine_add_param_sharded: parameter '%s': global_shape[%d] is negative", name, i);
    if (naxes < 0 || (naxes > 0 && !placements))
        return MU__EFAIL(eng, MU_EINVAL, "mu_engine_add_param_sharded: parameter '%s': bad naxes %d or NULL placements",
                         name, naxes);
    if (local_grad && local_grad == local_data)
        return MU__EFAIL(eng, MU_EINVAL,
                         "mu_engine_add_param_sharded: parameter '%s': grad is the same buffer as data", name);
    lua_State *L = eng->L;
    mu__push_call(eng, "add_param_sharded");
    lua_pushstring(L, name);
    lua_pushinteger(L, dtype);
    lua_createtable(L, ndim, 0);
    for (int i = 0; i < ndim; i++) {
        lua_pushnumber(L, (lua_Number)global_shape[i]);
        lua_rawseti(L, -2, i + 1);
    }
    lua_createtable(L, naxes, 0);
    for (int i = 0; i < naxes; i++) {
        lua_createtable(L, 2, 0);
        lua_pushinteger(L, placements[i].kind);
        lua_rawseti(L, -2, 1);
        lua_pushinteger(L, placements[i].dim);
        lua_rawseti(L, -2, 2);
        lua_rawseti(L, -2, i + 1);
    }
    if (local_data) lua_pushlightuserdata(L, local_data); else lua_pushnil(L);
    if (local_grad) lua_pushlightuserdata(L, local_grad); else lua_pushnil(L);
    return mu__call(eng, 6, 0, MU_EINVAL, "mu_engine_add_param_sharded");
}

static int eng_step(mu__eng *eng)
{
    if (!eng) return mu__fail(MU_EINVAL, "mu_engine_step: eng is NULL");
    mu__push_call(eng, "step");
    return mu__call(eng, 0, 0, MU_ELUA, "mu_engine_step");
}

static int eng_set(mu__eng *eng, const char *key, double value)
{
    if (!eng) return mu__fail(MU_EINVAL, "mu_engine_set: eng is NULL");
    if (!key) return MU__EFAIL(eng, MU_EINVAL, "mu_engine_set: key is NULL");
    mu__push_call(eng, "set");
    lua_pushstring(eng->L, key);
    lua_pushnumber(eng->L, value);
    return mu__call(eng, 2, 0, MU_EINVAL, "mu_engine_set");
}

static int eng_get(mu__eng *eng, const char *key, double *out)
{
    if (!eng) return mu__fail(MU_EINVAL, "mu_engine_get: eng is NULL");
    if (!key) return MU__EFAIL(eng, MU_EINVAL, "mu_engine_get: key is NULL");
    if (!out) return MU__EFAIL(eng, MU_EINVAL, "mu_engine_get: out is NULL");
    mu__push_call(eng, "get");
    lua_pushstring(eng->L, key);
    int rc = mu__call(eng, 1, 1, MU_EINVAL, "mu_engine_get");
    if (rc != MU_OK) return rc;
    if (!lua_isnumber(eng->L, -1)) {
        lua_settop(eng->L, 1);
        return MU__EFAIL(eng, MU_EINVAL, "mu_engine_get: key '%s' has no numeric value", key);
    }
    *out = (double)lua_tonumber(eng->L, -1);
    lua_settop(eng->L, 1);
    return MU_OK;
}

static int eng_set_signal(mu__eng *eng, const char *name, const double *values, int64_t n)
{
    if (!eng) return mu__fail(MU_EINVAL, "mu_engine_set_signal: eng is NULL");
    if (!name || !*name) return MU__EFAIL(eng, MU_EINVAL, "mu_engine_set_signal: name is NULL or empty");
    if (n < 0 || n > (1 << 24))
        return MU__EFAIL(eng, MU_EINVAL, "mu_engine_set_signal: signal '%s': n = %lld is outside 0..%d", name,
                         (long long)n, 1 << 24);
    if (n > 0 && !values)
        return MU__EFAIL(eng, MU_EINVAL, "mu_engine_set_signal: signal '%s': values is NULL", name);
    lua_State *L = eng->L;
    mu__push_call(eng, "set_signal");
    lua_pushstring(L, name);
    lua_createtable(L, (int)n, 0);
    for (int64_t i = 0; i < n; i++) {
        lua_pushnumber(L, (lua_Number)values[i]);
        lua_rawseti(L, -2, (int)(i + 1));
    }
    return mu__call(eng, 2, 0, MU_EINVAL, "mu_engine_set_signal");
}

static int eng_save(mu__eng *eng, const char *path)
{
    if (!eng) return mu__fail(MU_EINVAL, "mu_engine_save: eng is NULL");
    if (!path || !*path) return MU__EFAIL(eng, MU_EINVAL, "mu_engine_save: path is NULL or empty");
    mu__push_call(eng, "save");
    lua_pushstring(eng->L, path);
    return mu__call(eng, 1, 0, MU_EIO, "mu_engine_save");
}

static int eng_load(mu__eng *eng, const char *path, int flags)
{
    if (!eng) return mu__fail(MU_EINVAL, "mu_engine_load: eng is NULL");
    if (!path || !*path) return MU__EFAIL(eng, MU_EINVAL, "mu_engine_load: path is NULL or empty");
    if (flags & ~MU_LOAD_NO_CHECKSUM)
        return MU__EFAIL(eng, MU_EINVAL, "mu_engine_load_ex: unknown flags 0x%x", (unsigned)flags);
    mu__push_call(eng, "load");
    lua_pushstring(eng->L, path);
    lua_pushboolean(eng->L, (flags & MU_LOAD_NO_CHECKSUM) != 0);
    return mu__call(eng, 2, 0, MU_EFORMAT, "mu_engine_load");
}

/* The public calls: look the handle up, run, release. */
#define MU__ENGINE_CALL(fn, ...)                                  \
    do {                                                          \
        mu__eng *eng;                                             \
        int rc_ = mu__acquire(h, "mu_engine_" #fn, &eng);         \
        if (rc_) return rc_;                                      \
        rc_ = eng_##fn(eng, __VA_ARGS__);                         \
        mu__release(eng);                                         \
        return rc_;                                               \
    } while (0)

int mu_engine_add_param(mu_engine *h, const char *name, int dtype, int ndim, const int64_t *shape,
                        void *data, void *grad)
{
    MU__ENGINE_CALL(add_param, name, dtype, ndim, shape, data, grad);
}

int mu_engine_set_comm(mu_engine *h, void *mpi_comm_ptr) { MU__ENGINE_CALL(set_comm, mpi_comm_ptr); }

int mu_engine_add_param_sharded(mu_engine *h, const char *name, int dtype, int ndim,
                                const int64_t *global_shape, int naxes,
                                const mu_placement *placements, void *local_data, void *local_grad)
{
    MU__ENGINE_CALL(add_param_sharded, name, dtype, ndim, global_shape, naxes, placements,
                    local_data, local_grad);
}

int mu_engine_step(mu_engine *h)
{
    mu__eng *eng;
    int rc = mu__acquire(h, "mu_engine_step", &eng);
    if (rc) return rc;
    rc = eng_step(eng);
    mu__release(eng);
    return rc;
}

int mu_engine_set(mu_engine *h, const char *key, double value) { MU__ENGINE_CALL(set, key, value); }
int mu_engine_get(mu_engine *h, const char *key, double *out) { MU__ENGINE_CALL(get, key, out); }

int mu_engine_set_signal(mu_engine *h, const char *name, const double *values, int64_t n)
{
    MU__ENGINE_CALL(set_signal, name, values, n);
}

int mu_engine_save(mu_engine *h, const char *path) { MU__ENGINE_CALL(save, path); }
int mu_engine_load(mu_engine *h, const char *path) { MU__ENGINE_CALL(load, path, 0); }
int mu_engine_load_ex(mu_engine *h, const char *path, int flags) { MU__ENGINE_CALL(load, path, flags); }

/* ------------------------------------------------------------- scripts */

static int mu__script(const char *fn, const char *target, int argc, char **argv, int flags,
                      int *status)
{
    int dummy;
    if (!status) status = &dummy;
    *status = 1;
    if (!target || !*target) return mu__fail(MU_EINVAL, "%s: script or module name is empty", fn);
    if (argc < 0 || (argc > 0 && !argv)) return mu__fail(MU_EINVAL, "%s: bad argc/argv", fn);
    lua_State *L = mu__new_state(NULL);
    if (!L) return MU_ENOMEM;
    int rc = MU_OK;
    lua_pushcfunction(L, mu__msgh_script);
    lua_replace(L, 1);
    int st = mu__require(L, "muon.host");
    const char *hint = st != 0 ? "set MUON_LUA_PATH to the directory that holds muon/init.lua: " : "";
    if (st == 0) {
        const char *entry = strcmp(fn, "mu_script_run") == 0 ? "run_script" : "run_module";
        lua_getfield(L, -1, entry);
        lua_remove(L, -2);
        lua_pushstring(L, target);
        lua_createtable(L, argc, 0);
        for (int i = 0; i < argc; i++) {
            lua_pushstring(L, argv[i]);
            lua_rawseti(L, -2, i + 1);
        }
        lua_pushboolean(L, (flags & MU_SCRIPT_TRUSTED) != 0);
        st = lua_pcall(L, 3, 1, 1);
    }
    if (st != 0) {
        /* message + traceback into mu_last_error() */
        const char *msg = NULL, *tb = NULL;
        if (lua_istable(L, -1)) {
            lua_getfield(L, -1, "msg");
            lua_getfield(L, -2, "tb");
            msg = lua_tostring(L, -2);
            tb = lua_tostring(L, -1);
        } else {
            msg = lua_tostring(L, -1);
        }
        /* an empty traceback: a clean one-line error (a script that cannot be loaded) */
        if (tb && !*tb) tb = NULL;
        rc = mu__fail(st == LUA_ERRMEM ? MU_ENOMEM : MU_ELUA, "%s%s%s%s", hint, msg ? msg : "unknown Lua error",
                      tb ? "\n" : "", tb ? tb : "");
        if (flags & MU_SCRIPT_MPI) {
            fprintf(stderr, "muon: %s\n", mu_last_error());
            fflush(stderr);
            mu_comm_abort(1); /* returns when not running under MPI with > 1 rank */
        }
    } else {
        *status = lua_isnumber(L, -1) ? (int)lua_tointeger(L, -1)
                  : (lua_isboolean(L, -1) && !lua_toboolean(L, -1)) ? 1 : 0;
    }
    lua_close(L);
    if (flags & MU_SCRIPT_MPI) mu_comm_finalize();
    return rc;
}

int mu_script_run(const char *path, int argc, char **argv, int flags, int *status)
{
    return mu__script("mu_script_run", path, argc, argv, flags, status);
}

int mu_script_run_module(const char *module, int argc, char **argv, int flags, int *status)
{
    return mu__script("mu_script_run_module", module, argc, argv, flags, status);
}

/* ------------------------------------------------------- OpenBLAS core */

/* OpenBLAS core for this CPU's flags, as lua/muon/core.lua cpu_core_type. */
static const char *mu__cpu_core_type(void)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return NULL;
    char line[8192];
    const char *core = NULL;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "flags", 5) != 0) continue;
        char *colon = strchr(line, ':');
        if (!colon) break;
        /* whole-word matches: pad with spaces */
        char *nl = strchr(colon, '\n');
        if (nl) *nl = ' ';
        int f512 = strstr(colon, " avx512f ") && strstr(colon, " avx512bw ") && strstr(colon, " avx512vl ");
        if (f512) core = "SkylakeX";
        else if (strstr(colon, " avx2 ")) core = "Haswell";
        break;
    }
    fclose(f);
    return core;
}

int mu_blas_fix_core(char **argv)
{
    if (!argv || !argv[0]) return mu__fail(MU_EINVAL, "mu_blas_fix_core: argv is NULL or empty");
    const char *cur = getenv("OPENBLAS_CORETYPE");
    if ((cur && *cur) || getenv("MUON_BLAS_REEXEC")) return MU_OK;
    const char *want = mu__cpu_core_type();
    if (!want) return MU_OK;
    mu_blas_info info;
    if (mu_blas_get_info(&info) == MU_OK && strcasecmp(info.core, want) == 0) return MU_OK;
    setenv("OPENBLAS_CORETYPE", want, 1);
    setenv("MUON_BLAS_REEXEC", "1", 1);
    execv("/proc/self/exe", argv);
    /* exec failed: continue with the current core */
    return MU_OK;
}
