/*
 * Scripts (mu_script_run, mu_script_run_module in muon.h): a Lua file or a
 * module function run in a fresh LuaJIT state set up like an engine's
 * (src/lua_host.c), on a C stack of its own; what the muon CLI runs.
 */
#include "lua_host.h"

#include <stdio.h>
#include <string.h>

/* ------------------------------------------------------------- scripts */

/* mu_script_run's Lua part, protected on the script's stack. */
typedef struct mu__script_job {
    const char *entry;  /* muon.host function: run_script or run_module */
    const char *target;
    int argc;
    char **argv;
    int trusted;
    int rc, status;
} mu__script_job;

static int mu__script_body(lua_State *L)
{
    mu__script_job *j = lua_touserdata(L, 1);
    int st = mu__host_begin(L, mu__msgh_script);
    const char *hint = st != 0 ? "set MUON_LUA_PATH to the directory that holds muon/init.lua: " : "";
    if (st == 0) {
        lua_getfield(L, -1, j->entry);
        lua_remove(L, -2);
        lua_pushstring(L, j->target);
        lua_createtable(L, j->argc, 0);
        for (int i = 0; i < j->argc; i++) {
            lua_pushstring(L, j->argv[i]);
            lua_rawseti(L, -2, i + 1);
        }
        lua_pushboolean(L, j->trusted);
        st = lua_pcall(L, 3, 1, 1);
    }
    if (st == 0) {
        /* muon.host gives the exit status, 0..255 (exit_status) */
        lua_Number v = lua_tonumber(L, -1);
        j->status = lua_isnumber(L, -1) && v >= 0 && v <= 255 ? (int)v : 1;
        j->rc = MU_OK;
        return 0;
    }
    /* message + traceback into mu_last_error() */
    const char *msg, *tb;
    int code = mu__lua_error(L, st, MU_ELUA, &msg, &tb);
    /* an empty traceback: a clean one-line error (a script that cannot be loaded) */
    if (tb && !*tb) tb = NULL;
    j->rc = mu__fail(code, "%s%s%s%s", hint, msg, tb ? "\n" : "", tb ? tb : "");
    j->status = 1;
    return 0;
}

static int mu__script(const char *fn, const char *target, int argc, char **argv, int flags,
                      int *status)
{
    int dummy;
    if (!status) status = &dummy;
    *status = 1;
    int rc = MU_OK;
    if (!target || !*target)
        rc = mu__fail(MU_EINVAL, "%s: the %s is empty", fn,
                      strcmp(fn, "mu_script_run") == 0 ? "script path" : "module name");
    else if (argc < 0 || (argc > 0 && !argv))
        rc = mu__fail(MU_EINVAL, "%s: bad argc/argv", fn);
    mu__stack stack = {NULL, 0};
    lua_State *L = NULL;
    if (rc == MU_OK) rc = mu__stack_new(&stack, fn);
    if (rc == MU_OK) rc = mu__new_state(NULL, &L);
    if (rc == MU_OK) {
        mu__script_job j = {strcmp(fn, "mu_script_run") == 0 ? "run_script" : "run_module", target, argc, argv,
                            (flags & MU_SCRIPT_TRUSTED) != 0, MU_OK, 1};
        int st = mu__protected(&stack, L, mu__script_body, &j);
        if (st != 0) j.rc = mu__body_fail(L, st, fn);
        rc = j.rc;
        *status = j.status;
        mu__on_stack(&stack, mu__close_thunk, L);
    }
    mu__stack_free(&stack);
    if (rc != MU_OK && (flags & MU_SCRIPT_MPI)) {
        fprintf(stderr, "muon: %s\n", mu_last_error());
        fflush(stderr);
        mu_comm_abort(1); /* returns when not running under MPI with > 1 rank */
    }
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
