/*
 * The LuaJIT host of engines (src/engine.c) and scripts (src/script.c):
 * fresh Lua states with muon's modules on package.path, the C stack their
 * Lua runs on, protected calls and their message handlers (src/lua_host.h
 * declares what the two use). With those two, the only files of the library
 * that include the Lua headers. Every call into Lua is protected (lua_pcall
 * with a traceback handler), so no Lua error escapes as a longjmp.
 */
#define _GNU_SOURCE /* dladdr */
#include "lua_host.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <lauxlib.h>
#include <lualib.h>

/* Registry key (its address) of the metatable of muon's own error objects
 * (lua/muon/core.lua), captured when the modules load (mu__load_host): only
 * those objects choose the status code of a call. */
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

int mu__msgh(lua_State *L)
{
    return mu__msgh_ex(L, 0);
}

/* For scripts (mu_script_run*): the script is the user's own code, so a
 * traceback always comes, cut to the user's frames like a hook's. */
int mu__msgh_script(lua_State *L)
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

/* Fails when the Lua stack cannot grow by 64 slots (LuaJIT 2.1 raises from
 * lua_checkstack then: called under lua_cpcall). */
static int mu__probe_stack(lua_State *L)
{
    lua_pushboolean(L, lua_checkstack(L, 64));
    if (!lua_toboolean(L, -1)) lua_error(L);
    return 0;
}

static int mu__msgh_ex(lua_State *L, int always_tb)
{
    /* The Lua stack is exhausted when the handler runs with no room to grow
     * (LuaJIT gives a handler a few extra slots after a "stack overflow" and
     * grows no further): whatever was raised, that is the failure, and
     * there is no room for a traceback. Decided by the stack, not by the
     * message. */
    int probe = lua_cpcall(L, mu__probe_stack, NULL);
    if (probe != 0) {
        const char *what = lua_type(L, 1) == LUA_TSTRING ? lua_tostring(L, 1) : "stack overflow";
        lua_createtable(L, 0, 2);
        lua_pushfstring(L, probe == LUA_ERRMEM ? "out of memory in the Lua state (%s)"
                                               : "out of Lua stack: calls nested too deeply (%s)", what);
        lua_setfield(L, -2, "msg");
        lua_pushinteger(L, MU_ENOMEM);
        lua_setfield(L, -2, "code");
        return 1;
    }
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

int mu__lua_error(lua_State *L, int status, int fallback, const char **msg, const char **tb)
{
    int rc = fallback; /* for plain errors; an error object brings its code */
    *msg = NULL;
    *tb = NULL;
    if (status == LUA_ERRMEM) {
        rc = MU_ENOMEM;
        *msg = "out of memory in the Lua state";
    } else if (status == LUA_ERRERR) { /* the message handler itself failed: no stack or memory left */
        rc = MU_ENOMEM;
        *msg = "out of Lua stack or memory while handling an error";
    } else if (lua_istable(L, -1)) { /* made by mu__msgh_ex */
        lua_getfield(L, -1, "msg");
        lua_getfield(L, -2, "code");
        lua_getfield(L, -3, "tb");
        *msg = lua_tostring(L, -3);
        if (lua_isnumber(L, -2)) rc = (int)lua_tointeger(L, -2);
        *tb = lua_tostring(L, -1);
    } else {
        *msg = lua_tostring(L, -1);
    }
    if (!*msg) *msg = "unknown Lua error";
    return rc;
}

int mu__body_fail(lua_State *L, int status, const char *what)
{
    lua_settop(L, 0);
    int rc = status == LUA_ERRRUN ? MU_ELUA : MU_ENOMEM;
    return mu__fail(rc, "%s: %s", what,
                    status == LUA_ERRMEM ? "out of memory in the Lua state"
                    : status == LUA_ERRERR ? "out of Lua stack or memory while reporting an error"
                                           : "the Lua state failed while preparing the call");
}

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

/*
 * Lua C modules (lua-cjson, which muon's checkpoints use) take the Lua API
 * from the process's global symbols: Debian builds them without a link to
 * any Lua library. A host that loaded libmuon with dlopen(RTLD_LOCAL), as
 * Python's ctypes does, keeps the LuaJIT that libmuon links out of that
 * scope, and loading cjson fails ("undefined symbol: lua_checkstack"). So,
 * once per process, the LuaJIT library that this code calls is promoted to
 * the global scope (dlopen RTLD_NOLOAD | RTLD_GLOBAL: the object already
 * loaded, nothing new). When another Lua runtime's symbols are global
 * first, C modules would bind to that one: refused (mu__lua_scope_err).
 */
static pthread_once_t mu__lua_scope_once = PTHREAD_ONCE_INIT;
static char mu__lua_scope_err[512]; /* written once, by mu__lua_scope_init */

static void mu__lua_scope_init(void)
{
    void *ours = (void *)lua_checkstack;
    void *global = dlopen(NULL, RTLD_LAZY); /* dlsym on it: the global scope only */
    void *seen = global ? dlsym(global, "lua_checkstack") : NULL;
    if (global) dlclose(global);
    if (seen == ours) return; /* a host linked it, or loaded it globally */
    Dl_info info;
    if (!seen && dladdr(ours, &info) && info.dli_fname && dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD | RTLD_GLOBAL))
        return;
    Dl_info other;
    snprintf(mu__lua_scope_err, sizeof mu__lua_scope_err,
             seen ? "another Lua runtime (%s) provides the global Lua symbols of this process: Lua C modules "
                    "such as cjson would bind to it, not to muon's LuaJIT"
                  : "cannot make muon's LuaJIT symbols global (%s): Lua C modules such as cjson cannot load",
             seen ? (dladdr(seen, &other) && other.dli_fname ? other.dli_fname : "?") : dlerror());
}

/* The object holding this code, for the Lua loader (lua/muon/core.lua) so
 * that it uses this very library instead of finding another copy: its
 * name as the dynamic linker knows it (dlopen of that name returns this
 * object), or true when it is the host program itself (a static link). */
static void mu__push_library(lua_State *L)
{
    Dl_info info;
    struct link_map *map = NULL;
    if (dladdr1((void *)&mu_cdef, &info, (void **)&map, RTLD_DL_LINKMAP) && map && map->l_name && map->l_name[0])
        lua_pushstring(L, map->l_name);
    else
        lua_pushboolean(L, 1);
}

/* The standard libraries, the registry's "muon.library" and package.path
 * (templ, the light userdata argument, prepended). Protected (lua_cpcall). */
static int mu__setup_body(lua_State *L)
{
    const char *templ = lua_touserdata(L, 1);
    luaL_openlibs(L);
    mu__push_library(L);
    lua_setfield(L, LUA_REGISTRYINDEX, "muon.library");
    if (templ[0]) {
        lua_getglobal(L, "package");
        lua_getfield(L, -1, "path");
        lua_pushfstring(L, "%s%s", templ, lua_tostring(L, -1));
        lua_setfield(L, -3, "path");
    }
    return 0;
}

/* A fresh state (*out) set up by mu__setup_body, its stack empty; on
 * failure a status code (and mu_last_error), *out NULL. */
int mu__new_state(const char *explicit_dir, lua_State **out)
{
    char templ[2 * PATH_MAX + 64];
    *out = NULL;
    pthread_once(&mu__lua_scope_once, mu__lua_scope_init);
    if (mu__lua_scope_err[0]) return mu__fail(MU_ESTATE, "%s", mu__lua_scope_err);
    lua_State *L = luaL_newstate();
    if (!L) return mu__fail(MU_ENOMEM, "cannot create a Lua state");
    mu__lua_path(explicit_dir, templ, sizeof templ);
    if (lua_cpcall(L, mu__setup_body, templ) != 0) {
        lua_close(L);
        return mu__fail(MU_ENOMEM, "cannot set up a Lua state: out of memory");
    }
    lua_settop(L, 0);
    *out = L;
    return MU_OK;
}

/* Calls require(module) protected (message handler at index 1); leaves
 * the module on the stack. */
static int mu__require(lua_State *L, const char *module)
{
    lua_getglobal(L, "require");
    lua_pushstring(L, module);
    return lua_pcall(L, 1, 1, 1);
}

/* Loads muon.host (left on the stack) and records the metatable of muon's
 * error objects, as muon.core makes them, in the registry under
 * mu__errmt_key. Message handler at index 1; returns the lua_pcall status
 * (a string error when the metatable is missing). */
static int mu__load_host(lua_State *L)
{
    int status = mu__require(L, "muon.host");
    if (status != 0) return status;
    int host = lua_gettop(L);
    lua_getglobal(L, "require");
    lua_pushliteral(L, "muon.core");
    status = lua_pcall(L, 1, 1, 1);
    if (status == 0) {
        lua_getfield(L, -1, "error_object");
        lua_pushinteger(L, MU_ELUA);
        lua_pushliteral(L, "");
        status = lua_pcall(L, 2, 1, 1);
    }
    if (status != 0) return status;
    lua_pushlightuserdata(L, (void *)&mu__errmt_key);
    if (!lua_getmetatable(L, -2)) {
        lua_pushliteral(L, "muon.core made an error object without a metatable");
        return LUA_ERRRUN;
    }
    lua_rawset(L, LUA_REGISTRYINDEX);
    lua_settop(L, host);
    return 0;
}

int mu__host_begin(lua_State *L, lua_CFunction msgh)
{
    lua_settop(L, 0);
    lua_pushcfunction(L, msgh);
    return mu__load_host(L);
}

/* ------------------------------------------------------------ C stacks */

/*
 * Every call into an engine's or a script's Lua runs on a C stack of its
 * own, whatever stack the calling thread has (a host thread may have a
 * small one). LuaJIT has no C-stack check: a Lua function that re-enters a
 * C library function (a string.gsub replacement function that calls gsub,
 * a table.sort comparator that sorts, a load reader that loads) nests C
 * frames until they run out, and the process dies (SIGSEGV). Each such
 * level also takes Lua stack slots, and LuaJIT stops at its limit of 65500
 * slots with a clean "stack overflow" error. Measured on LuaJIT 2.1 (x86-64),
 * the costliest level, gsub's, takes 8.8 KB of C stack for 10 slots, so it
 * needs about 58 MB to reach that limit: with MU__STACK_BYTES = 128 MB the
 * Lua limit always comes first. (Coroutines are the exception: each has
 * its own Lua stack. The sandbox bounds how deep configs nest them, and
 * every re-entrant call.) The stack is reserved, not committed: pages are
 * used only as deep as a call goes. A guard region below it faults instead
 * of writing into other memory.
 *
 * The switch keeps the thread: thread-locals, the caller's MPI and OpenMP
 * identity stay as they are. It is a call on another stack (x86-64 only;
 * elsewhere calls run on the caller's stack), announced to valgrind (a
 * registered stack) and to AddressSanitizer (fibers) whenever its runtime
 * is in the process, this library instrumented or not (a host built with
 * ASan, or libasan preloaded): its functions are looked up once, so that
 * it never mistakes LuaJIT's error unwinding on this stack for a corrupt one.
 */
enum { MU__STACK_BYTES = 128 << 20, MU__GUARD_BYTES = 64 << 10 };

#if defined(__x86_64__) && defined(__linux__)
#define MU__SWITCH_STACKS 1
#endif
#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#endif
#endif
#ifndef VALGRIND_STACK_REGISTER
#define VALGRIND_STACK_REGISTER(lo, hi) 0u
#define VALGRIND_STACK_DEREGISTER(id) ((void)(id))
#endif

int mu__stack_new(mu__stack *s, const char *what)
{
    s->base = NULL;
#ifdef MU__SWITCH_STACKS
    void *p = mmap(NULL, (size_t)MU__GUARD_BYTES + MU__STACK_BYTES, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (p == MAP_FAILED)
        return mu__fail(MU_ENOMEM, "%s: cannot reserve the %d MB C stack that muon's Lua runs on: %s", what,
                        MU__STACK_BYTES >> 20, strerror(errno));
    if (mprotect(p, MU__GUARD_BYTES, PROT_NONE) != 0) {
        int e = errno;
        munmap(p, (size_t)MU__GUARD_BYTES + MU__STACK_BYTES);
        return mu__fail(MU_ENOMEM, "%s: cannot protect the guard page of muon's C stack: %s", what, strerror(e));
    }
    s->base = p;
    s->vgid = VALGRIND_STACK_REGISTER(s->base + MU__GUARD_BYTES, s->base + MU__GUARD_BYTES + MU__STACK_BYTES);
#else
    (void)what;
#endif
    return MU_OK;
}

void mu__stack_free(mu__stack *s)
{
    if (!s->base) return;
    VALGRIND_STACK_DEREGISTER(s->vgid);
    munmap(s->base, (size_t)MU__GUARD_BYTES + MU__STACK_BYTES);
    s->base = NULL;
}

/* fn(arg) on stack s (on the caller's stack when s has none). */
typedef struct mu__switch {
    void (*fn)(void *);
    void *arg;
    void *fake;            /* ASan: the caller's fake stack */
    const void *caller_lo; /* ASan: the caller's stack */
    size_t caller_size;
} mu__switch;

#ifdef MU__SWITCH_STACKS
/* AddressSanitizer's fiber calls (sanitizer/common_interface_defs.h), when
 * its runtime is loaded; NULL otherwise. Set once. */
static void (*mu__asan_start)(void **fake, const void *bottom, size_t size);
static void (*mu__asan_finish)(void *fake, const void **bottom, size_t *size);
static pthread_once_t mu__asan_once = PTHREAD_ONCE_INIT;

static void mu__asan_init(void)
{
    void *s = dlsym(RTLD_DEFAULT, "__sanitizer_start_switch_fiber");
    void *f = dlsym(RTLD_DEFAULT, "__sanitizer_finish_switch_fiber");
    if (s && f) {
        memcpy(&mu__asan_start, &s, sizeof s);
        memcpy(&mu__asan_finish, &f, sizeof f);
    }
}

/* fn(arg) with the stack pointer at top (16-byte aligned); the caller's
 * frame pointer keeps the way back, described for unwinders (CFI). */
__attribute__((visibility("hidden"))) void mu__call_on_stack(void (*fn)(void *), void *arg, void *top);
__asm__(".text\n"
        ".globl mu__call_on_stack\n"
        ".hidden mu__call_on_stack\n"
        ".type mu__call_on_stack, @function\n"
        ".p2align 4\n"
        "mu__call_on_stack:\n"
        ".cfi_startproc\n"
        "    pushq %rbp\n"
        ".cfi_def_cfa_offset 16\n"
        ".cfi_offset %rbp, -16\n"
        "    movq %rsp, %rbp\n"
        ".cfi_def_cfa_register %rbp\n"
        "    movq %rdx, %rsp\n"
        "    movq %rdi, %rax\n"
        "    movq %rsi, %rdi\n"
        "    callq *%rax\n"
        "    movq %rbp, %rsp\n"
        "    popq %rbp\n"
        ".cfi_def_cfa %rsp, 8\n"
        "    ret\n"
        ".cfi_endproc\n"
        ".size mu__call_on_stack, .-mu__call_on_stack\n");

static void mu__switched(void *p)
{
    mu__switch *sw = p;
    if (mu__asan_finish) mu__asan_finish(NULL, &sw->caller_lo, &sw->caller_size);
    sw->fn(sw->arg);
    if (mu__asan_start) mu__asan_start(NULL, sw->caller_lo, sw->caller_size); /* these frames are done */
}
#endif

void mu__on_stack(const mu__stack *s, void (*fn)(void *), void *arg)
{
#ifdef MU__SWITCH_STACKS
    if (s && s->base) {
        mu__switch sw = {.fn = fn, .arg = arg};
        pthread_once(&mu__asan_once, mu__asan_init);
        if (mu__asan_start) mu__asan_start(&sw.fake, s->base + MU__GUARD_BYTES, MU__STACK_BYTES);
        mu__call_on_stack(mu__switched, &sw, s->base + MU__GUARD_BYTES + MU__STACK_BYTES);
        if (mu__asan_finish) mu__asan_finish(sw.fake, NULL, NULL);
        return;
    }
#else
    (void)s;
#endif
    fn(arg);
}

/* A protected call on stack s: body(L) with ud as its light userdata
 * argument, by lua_cpcall, so even an allocation failure while pushing
 * arguments is a status, not a panic. Returns lua_cpcall's status. */
typedef struct mu__cpcall {
    lua_State *L;
    lua_CFunction body;
    void *ud;
    int status;
} mu__cpcall;

static void mu__cpcall_thunk(void *p)
{
    mu__cpcall *c = p;
    c->status = lua_cpcall(c->L, c->body, c->ud);
}

int mu__protected(const mu__stack *s, lua_State *L, lua_CFunction body, void *ud)
{
    mu__cpcall c = {L, body, ud, 0};
    mu__on_stack(s, mu__cpcall_thunk, &c);
    return c.status;
}

/* lua_close runs finalizers, Lua code too: on the state's stack. */
void mu__close_thunk(void *L) { lua_close(L); }
