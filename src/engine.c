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

struct mu_engine {
    lua_State *L;
    int host_ref;   /* registry: the muon.host module table */
    int engine_ref; /* registry: the Lua engine object */
    char *err;      /* detail of the last failure, "" if none */
};

/* ------------------------------------------------------------ messages */

/* The failure code named by name ("EFORMAT" or "MU_EFORMAT"), 0 if none. */
static int mu__code_of_name(const char *name)
{
    if (strncmp(name, "MU_", 3) == 0) name += 3;
#define MU__NAME_CASE(n, value, desc) \
    if ((value) < 0 && strcmp(name, #n) == 0) return (value);
    MU_ERRORS(MU__NAME_CASE)
#undef MU__NAME_CASE
    return 0;
}

/* The status code carried by the error object at idx: its `code` field, a
 * MU_E* number (lua/muon/errors.lua) or the code's name (as older Lua code
 * raises { code = "EFORMAT", msg = ... }). 0 for a plain value, or a table
 * without a failure code: the caller's fallback applies. Raw reads only:
 * the value may come from a config, and its metamethods are not called. */
static int mu__code_of(lua_State *L, int idx)
{
    int code = 0;
    if (!lua_istable(L, idx)) return 0;
    lua_pushliteral(L, "code");
    lua_rawget(L, idx);
    if (lua_type(L, -1) == LUA_TNUMBER) {
        lua_Number n = lua_tonumber(L, -1);
        if (n < 0 && n >= INT_MIN && n == (lua_Number)(int)n && strcmp(mu_errname((int)n), "UNKNOWN") != 0)
            code = (int)n;
    } else if (lua_type(L, -1) == LUA_TSTRING) {
        code = mu__code_of_name(lua_tostring(L, -1));
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
 * { msg = <string>, code = <MU_E* number or nil>, tb = <traceback> }.
 * Error objects (lua/muon/errors.lua: { code =, msg = [, tb =] }) choose the
 * status code; a tb they carry (or that muon.errors kept for a string),
 * captured where a config's hook raised, replaces the traceback of this
 * point. */
static int mu__msgh(lua_State *L)
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
    if (tb)
        lua_pushstring(L, tb);
    else
        luaL_traceback(L, L, NULL, 1);
    lua_setfield(L, t, "tb");
    lua_pushvalue(L, t);
    return 1;
}

static void mu__set_err(mu_engine *eng, const char *s)
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
static int mu__lua_fail(lua_State *L, mu_engine *eng, int status, int fallback, const char *what)
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
static void mu__push_call(mu_engine *eng, const char *fn)
{
    lua_State *L = eng->L;
    lua_settop(L, 1); /* keep the message handler */
    lua_rawgeti(L, LUA_REGISTRYINDEX, eng->host_ref);
    lua_getfield(L, -1, fn);
    lua_remove(L, -2);
    lua_rawgeti(L, LUA_REGISTRYINDEX, eng->engine_ref);
}

static int mu__call(mu_engine *eng, int nargs, int nres, int fallback, const char *what)
{
    int status = lua_pcall(eng->L, nargs + 1, nres, 1);
    if (status != 0) return mu__lua_fail(eng->L, eng, status, fallback, what);
    return MU_OK;
}

int mu_engine_open(mu_engine **out, const char *config_path)
{
    return mu_engine_open_ex(out, config_path, NULL);
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

    mu_engine *eng = calloc(1, sizeof *eng);
    if (!eng) return mu__fail(MU_ENOMEM, "mu_engine_open: out of memory");
    eng->host_ref = eng->engine_ref = LUA_NOREF;
    eng->L = mu__new_state(opts ? opts->lua_path : NULL);
    if (!eng->L) {
        free(eng);
        return MU_ENOMEM;
    }
    lua_State *L = eng->L;
    int status = mu__require(L, "muon.host");
    if (status != 0) {
        int rc = mu__lua_fail(L, NULL, status, MU_ELUA, "mu_engine_open: loading muon.host");
        mu_engine_close(eng);
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
        mu_engine_close(eng);
        return rc;
    }
    eng->engine_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_settop(L, 1);
    *out = eng;
    return MU_OK;
}

void mu_engine_close(mu_engine *eng)
{
    if (!eng) return;
    if (eng->L) lua_close(eng->L);
    free(eng->err);
    free(eng);
}

const char *mu_engine_error(const mu_engine *eng)
{
    if (!eng) return mu_last_error();
    return eng->err ? eng->err : "";
}

int mu_engine_add_param(mu_engine *eng, const char *name, int dtype, int ndim,
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

int mu_engine_set_comm(mu_engine *eng, void *mpi_comm_ptr)
{
    if (!eng) return mu__fail(MU_EINVAL, "mu_engine_set_comm: eng is NULL");
    if (!mpi_comm_ptr) return MU__EFAIL(eng, MU_EINVAL, "mu_engine_set_comm: mpi_comm_ptr is NULL");
    mu__push_call(eng, "set_comm");
    lua_pushlightuserdata(eng->L, mpi_comm_ptr);
    return mu__call(eng, 1, 0, MU_ESTATE, "mu_engine_set_comm");
}

int mu_engine_add_param_sharded(mu_engine *eng, const char *name, int dtype, int ndim,
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

int mu_engine_step(mu_engine *eng)
{
    if (!eng) return mu__fail(MU_EINVAL, "mu_engine_step: eng is NULL");
    mu__push_call(eng, "step");
    return mu__call(eng, 0, 0, MU_ELUA, "mu_engine_step");
}

int mu_engine_set(mu_engine *eng, const char *key, double value)
{
    if (!eng) return mu__fail(MU_EINVAL, "mu_engine_set: eng is NULL");
    if (!key) return MU__EFAIL(eng, MU_EINVAL, "mu_engine_set: key is NULL");
    mu__push_call(eng, "set");
    lua_pushstring(eng->L, key);
    lua_pushnumber(eng->L, value);
    return mu__call(eng, 2, 0, MU_EINVAL, "mu_engine_set");
}

int mu_engine_get(mu_engine *eng, const char *key, double *out)
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

int mu_engine_set_signal(mu_engine *eng, const char *name, const double *values, int64_t n)
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

int mu_engine_save(mu_engine *eng, const char *path)
{
    if (!eng) return mu__fail(MU_EINVAL, "mu_engine_save: eng is NULL");
    if (!path || !*path) return MU__EFAIL(eng, MU_EINVAL, "mu_engine_save: path is NULL or empty");
    mu__push_call(eng, "save");
    lua_pushstring(eng->L, path);
    return mu__call(eng, 1, 0, MU_EIO, "mu_engine_save");
}

int mu_engine_load(mu_engine *eng, const char *path)
{
    if (!eng) return mu__fail(MU_EINVAL, "mu_engine_load: eng is NULL");
    if (!path || !*path) return MU__EFAIL(eng, MU_EINVAL, "mu_engine_load: path is NULL or empty");
    mu__push_call(eng, "load");
    lua_pushstring(eng->L, path);
    return mu__call(eng, 1, 0, MU_EFORMAT, "mu_engine_load");
}

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
    int st = mu__require(L, "muon.host");
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
        rc = mu__fail(st == LUA_ERRMEM ? MU_ENOMEM : MU_ELUA, "%s%s%s", msg ? msg : "unknown Lua error",
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
    const char *cur = getenv("OPENBLAS_CORETYPE");
    if ((cur && *cur) || getenv("MUON_BLAS_REEXEC")) return MU_OK;
    const char *want = mu__cpu_core_type();
    if (!want) return MU_OK;
    mu_blas_info info;
    if (mu_blas_get_info(&info) == MU_OK && strcasecmp(info.core, want) == 0) return MU_OK;
    if (!argv || !argv[0]) return MU_OK;
    setenv("OPENBLAS_CORETYPE", want, 1);
    setenv("MUON_BLAS_REEXEC", "1", 1);
    execv("/proc/self/exe", argv);
    /* exec failed: continue with the current core */
    return MU_OK;
}
