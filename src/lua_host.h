/*
 * The LuaJIT host shared by engines (src/engine.c) and scripts
 * (src/script.c), in src/lua_host.c: fresh Lua states with muon's modules
 * on package.path, the C stack their Lua runs on, protected calls, and the
 * error values those calls leave. Only the embedding files include this
 * header (and the Lua headers with it); nothing here is exported.
 */
#ifndef MUON_LUA_HOST_H
#define MUON_LUA_HOST_H

#include "muon_internal.h"

#include <lua.h>

/* The C stack that an engine's or a script's Lua runs on. */
typedef struct mu__stack {
    char *base;    /* mmap'd: guard region, then the stack; NULL: the caller's stack */
    unsigned vgid; /* valgrind's id of the stack */
} mu__stack;

/* Reserve a stack (what: the public call, in messages); MU_ENOMEM when it
 * cannot. Where stacks are not switched (not x86-64 Linux) it reserves
 * nothing and calls run on the caller's stack. */
int mu__stack_new(mu__stack *s, const char *what);
/* Give a stack back (one never reserved, or already freed, is a no-op). */
void mu__stack_free(mu__stack *s);
/* fn(arg) on stack s (on the caller's stack when s has none). */
void mu__on_stack(const mu__stack *s, void (*fn)(void *), void *arg);
/* A protected call on stack s: body(L) with ud as its light userdata
 * argument, by lua_cpcall, so even an allocation failure while pushing
 * arguments is a status, not a panic. Returns lua_cpcall's status. */
int mu__protected(const mu__stack *s, lua_State *L, lua_CFunction body, void *ud);
/* lua_close(L) for mu__on_stack: finalizers run Lua code too. */
void mu__close_thunk(void *L);

/* A fresh state (*out) with the standard libraries, muon's modules on
 * package.path (explicit_dir, else the search described at
 * mu_engine_open_ex in muon.h) and the registry's "muon.library"; its stack
 * empty. On failure a status code (and mu_last_error), *out NULL. */
int mu__new_state(const char *explicit_dir, lua_State **out);
/* How an engine's or a script's protected body starts: L's stack emptied,
 * the message handler msgh at index 1, then muon.host loaded (left on the
 * stack) and the metatable of muon's error objects, as muon.core makes
 * them, recorded, so that only those objects choose the status code of a
 * call (see mu__msgh). Returns the lua_pcall status (a string error when
 * the metatable is missing). */
int mu__host_begin(lua_State *L, lua_CFunction msgh);

/* Message handlers for lua_pcall: turn any error value into a table
 * { msg =, code = <MU_E* or nil>, tb = <traceback or nil> }. mu__msgh
 * gives a traceback only where the error carries one (a config hook's);
 * mu__msgh_script always (a script is the user's own code). */
int mu__msgh(lua_State *L);
int mu__msgh_script(lua_State *L);
/* After a failed lua_pcall (status != 0, the error value on top): its
 * message and traceback (*tb NULL if none; both point into values left on
 * the Lua stack) and its status code: the code a message handler's table
 * carries, fallback for a plain error, MU_ENOMEM when memory or the stack
 * ran out. */
int mu__lua_error(lua_State *L, int status, int fallback, const char **msg, const char **tb);
/* Failure of a protected body itself (not of the Lua it called, which the
 * body reports): out of memory or stack while pushing arguments or
 * recording a failure. Empties L's stack, records "what: ..." in
 * mu_last_error() without allocating in Lua, returns the status code. */
int mu__body_fail(lua_State *L, int status, const char *what);

#endif
