/*
 * The embedding API (mu_engine_* in muon.h): a mu_engine owns a LuaJIT
 * state (src/lua_host.c) that runs the Lua engine (lua/muon/engine.lua
 * through lua/muon/host.lua). Handles are tokens checked on every call;
 * failures become status codes with a per-engine detail message.
 */
#include "lua_host.h"

#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>

/* The engine behind a handle (the handle itself is a token, see
 * "handles" below). */
typedef struct mu__eng {
    lua_State *L;
    mu__stack stack;
    int host_ref;   /* registry: the muon.host module table */
    int engine_ref; /* registry: the Lua engine object */
    char *err;      /* detail of the last failure, "" if none */
    int busy;       /* a call is running (registry lock) */
    int close_pending; /* closed during that call: freed when it returns */
} mu__eng;

/* ------------------------------------------------------------ messages */

static void mu__set_err(mu__eng *eng, const char *s);

/* After a failed lua_pcall (status != 0, error value on top): record the
 * message in mu_last_error() ("what: msg") and, with the traceback, in the
 * engine's detail. Pops the error value and returns the status code: the
 * error object's, or fallback for a plain error (a string). */
static int mu__lua_fail(lua_State *L, mu__eng *eng, int status, int fallback, const char *what)
{
    const char *msg, *tb;
    int rc = mu__lua_error(L, status, fallback, &msg, &tb);
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

/* ------------------------------------------------------------- engines */

/*
 * One call of the host glue, host[fn](engine, args...), made by body
 * mu__call_body under mu__protected on the engine's stack: push(L, args)
 * pushes the arguments; a numeric result goes to *out when out is set.
 */
typedef struct mu__call {
    mu__eng *eng;
    const char *fn;   /* the muon.host function */
    const char *what; /* "mu_engine_step": the call, in messages */
    int fallback;     /* the status of a plain (string) error */
    int (*push)(lua_State *L, const void *args); /* returns how many it pushed */
    const void *args;
    double *out;
    int rc;
    char *text;       /* with text_len: a string result, copied here (text_cap bytes) */
    size_t text_cap;
    size_t *text_len;
} mu__call;

static int mu__call_body(lua_State *L)
{
    mu__call *c = lua_touserdata(L, 1);
    lua_settop(L, 0);
    lua_pushcfunction(L, mu__msgh);
    lua_rawgeti(L, LUA_REGISTRYINDEX, c->eng->host_ref);
    lua_getfield(L, -1, c->fn);
    lua_remove(L, -2);
    lua_rawgeti(L, LUA_REGISTRYINDEX, c->eng->engine_ref);
    int n = c->push ? c->push(L, c->args) : 0;
    int status = lua_pcall(L, n + 1, c->out || c->text_len ? 1 : 0, 1);
    if (status != 0) {
        c->rc = mu__lua_fail(L, c->eng, status, c->fallback, c->what);
    } else if (c->text_len) {
        size_t len = 0;
        const char *s = lua_type(L, -1) == LUA_TSTRING ? lua_tolstring(L, -1, &len) : NULL;
        if (!s) {
            c->rc = MU__EFAIL(c->eng, MU_EINVAL, "%s: the result is not a string", c->what);
            return 0;
        }
        *c->text_len = len;
        if (c->text_cap > 0) {
            size_t k = len < c->text_cap ? len : 0; /* all of it or nothing: never a cut answer */
            memcpy(c->text, s, k);
            c->text[k] = '\0';
        }
        c->rc = MU_OK;
    } else if (c->out && !lua_isnumber(L, -1)) {
        c->rc = MU__EFAIL(c->eng, MU_EINVAL, "%s: the result is not a number", c->what);
    } else {
        if (c->out) *c->out = (double)lua_tonumber(L, -1);
        c->rc = MU_OK;
    }
    return 0;
}

/* mu__body_fail (src/lua_host.c), recorded on the engine too. */
static int mu__eng_body_fail(lua_State *L, mu__eng *eng, int status, const char *what)
{
    int rc = mu__body_fail(L, status, what);
    mu__set_err(eng, mu_last_error());
    return rc;
}

/* Runs c (mu__call_body) on the engine's stack. */
static int mu__call_do(mu__call *c)
{
    int status = mu__protected(&c->eng->stack, c->eng->L, mu__call_body, c);
    if (status != 0) return mu__eng_body_fail(c->eng->L, c->eng, status, c->what);
    lua_settop(c->eng->L, 0);
    return c->rc;
}

static int mu__call_run(mu__eng *eng, const char *fn, const char *what, int fallback,
                        int (*push)(lua_State *L, const void *args), const void *args, double *out)
{
    mu__call c = {eng, fn, what, fallback, push, args, out, MU_OK, NULL, 0, NULL};
    return mu__call_do(&c);
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
 * call on the engine from any thread (mu_engine_error_copy is the safe
 * form: it copies under the registry lock, which also guards each swap of
 * the message).
 */
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

/* Replace the engine's detail message. The swap happens under the
 * registry lock, so mu_engine_error_copy on another thread reads either
 * the old message or the new one, never freed memory. */
static void mu__set_err(mu__eng *eng, const char *s)
{
    if (!eng) return;
    char *p = strdup(s);
    pthread_mutex_lock(&mu__reg_lock);
    char *old = eng->err;
    if (p) eng->err = p;
    else if (old) old[0] = '\0'; /* out of memory: keep the buffer, cut it */
    pthread_mutex_unlock(&mu__reg_lock);
    if (p) free(old);
}

static void mu__eng_free(mu__eng *eng)
{
    if (eng->L) mu__on_stack(&eng->stack, mu__close_thunk, eng->L);
    mu__stack_free(&eng->stack);
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

/* mu_engine_open's Lua part, protected on the engine's stack: load
 * muon.host (mu__host_begin) and open the config. */
typedef struct mu__open {
    mu__eng *eng;
    const char *config_path; /* with source: the config's name */
    const char *source;      /* NULL: read config_path */
    const mu_engine_opts *opts;
    const char *what; /* the call, in messages */
    int rc;
} mu__open;

static int mu__open_body(lua_State *L)
{
    mu__open *o = lua_touserdata(L, 1);
    int status = mu__host_begin(L, mu__msgh);
    if (status != 0) {
        o->rc = mu__lua_fail(L, NULL, status, MU_ELUA,
                             "mu_engine_open: loading muon.host (set MUON_LUA_PATH to the directory that holds "
                             "muon/init.lua, or pass mu_engine_opts.lua_path)");
        return 0;
    }
    o->eng->host_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_settop(L, 1);
    lua_rawgeti(L, LUA_REGISTRYINDEX, o->eng->host_ref);
    lua_getfield(L, -1, "open");
    lua_remove(L, -2);
    lua_pushstring(L, o->config_path);
    lua_createtable(L, 0, 2);
    if (o->opts) {
        lua_pushboolean(L, o->opts->trusted != 0);
        lua_setfield(L, -2, "trusted");
    }
    if (o->source) {
        lua_pushstring(L, o->source);
        lua_setfield(L, -2, "source");
    }
    status = lua_pcall(L, 2, 1, 1);
    if (status != 0) {
        o->rc = mu__lua_fail(L, NULL, status, MU_EINVAL, o->what);
        return 0;
    }
    o->eng->engine_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    o->rc = MU_OK;
    return 0;
}

/* A new engine on the config at config_path, or on source (then named
 * config_path); what: the public call, in messages. */
static int mu__open_engine(mu_engine **out, const char *config_path, const char *source,
                           const mu_engine_opts *opts, const char *what)
{
    mu__eng *eng = calloc(1, sizeof *eng);
    if (!eng) return mu__fail(MU_ENOMEM, "%s: out of memory", what);
    eng->host_ref = eng->engine_ref = LUA_NOREF;
    int rc = mu__stack_new(&eng->stack, what);
    if (rc == MU_OK) rc = mu__new_state(opts ? opts->lua_path : NULL, &eng->L);
    if (rc != MU_OK) {
        mu__eng_free(eng);
        return rc;
    }
    mu__open o = {eng, config_path, source, opts, what, MU_OK};
    int status = mu__protected(&eng->stack, eng->L, mu__open_body, &o);
    if (status != 0) o.rc = mu__body_fail(eng->L, status, what);
    lua_settop(eng->L, 0);
    rc = o.rc;
    if (rc == MU_OK) rc = mu__reg_add(eng, out);
    if (rc != MU_OK) mu__eng_free(eng);
    return rc;
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

    return mu__open_engine(out, config_path, NULL, opts, "mu_engine_open");
}

int mu_engine_open_source(mu_engine **out, const char *source, const char *name, const mu_engine_opts *opts)
{
    if (!out) return mu__fail(MU_EINVAL, "mu_engine_open_source: out is NULL");
    *out = NULL;
    if (!source) return mu__fail(MU_EINVAL, "mu_engine_open_source: source is NULL");
    return mu__open_engine(out, name && *name ? name : "<string>", source, opts, "mu_engine_open_source");
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

/* n bytes of src into buf (n > 0), cut at a UTF-8 character boundary. */
static void mu__copy_cut(char *buf, size_t n, const char *src)
{
    size_t len = strlen(src);
    if (len >= n) {
        len = n - 1;
        while (len > 0 && ((unsigned char)src[len] & 0xC0) == 0x80) len--; /* src[len] continues a character */
    }
    memcpy(buf, src, len);
    buf[len] = '\0';
}

int mu_engine_error_copy(const mu_engine *h, char *buf, size_t n)
{
    if (!buf && n > 0) return mu__fail(MU_EINVAL, "mu_engine_error_copy: buf is NULL and n = %zu", n);
    if (!h) {
        if (n > 0) mu__copy_cut(buf, n, mu_last_error());
        return MU_OK;
    }
    pthread_mutex_lock(&mu__reg_lock);
    mu__slot *slot = mu__reg_find(h);
    if (slot && n > 0) mu__copy_cut(buf, n, slot->eng->err ? slot->eng->err : "");
    pthread_mutex_unlock(&mu__reg_lock);
    if (!slot) {
        mu__fail(MU_ESTATE, "mu_engine_error_copy: eng is not an open engine (closed, or not a handle "
                 "from mu_engine_open)");
        if (n > 0) mu__copy_cut(buf, n, mu_last_error());
        return MU_ESTATE;
    }
    return MU_OK;
}

/* The arguments of mu_engine_add_param and _sharded, as the glue takes them. */
typedef struct mu__param_args {
    const char *name;
    int dtype, ndim, naxes;
    const int64_t *shape;
    const mu_placement *placements; /* NULL: mu_engine_add_param */
    void *data, *grad;
} mu__param_args;

static int mu__push_param(lua_State *L, const void *p)
{
    const mu__param_args *a = p;
    lua_pushstring(L, a->name);
    lua_pushinteger(L, a->dtype);
    lua_createtable(L, a->ndim, 0);
    for (int i = 0; i < a->ndim; i++) {
        lua_pushnumber(L, (lua_Number)a->shape[i]);
        lua_rawseti(L, -2, i + 1);
    }
    if (a->placements) {
        lua_createtable(L, a->naxes, 0);
        for (int i = 0; i < a->naxes; i++) {
            lua_createtable(L, 2, 0);
            lua_pushinteger(L, a->placements[i].kind);
            lua_rawseti(L, -2, 1);
            lua_pushinteger(L, a->placements[i].dim);
            lua_rawseti(L, -2, 2);
            lua_rawseti(L, -2, i + 1);
        }
    }
    if (a->data) lua_pushlightuserdata(L, a->data); else lua_pushnil(L);
    if (a->grad) lua_pushlightuserdata(L, a->grad); else lua_pushnil(L);
    return a->placements ? 6 : 5;
}

/* The offset of the first byte of s[0..n) that does not begin a valid
 * UTF-8 character (no overlongs, no surrogates, at most U+10FFFF), or n. */
static size_t mu__utf8_bad(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t len;
        unsigned lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) len = 1;
        else if (c == 0xE0) len = 2, lo = 0xA0;
        else if (c == 0xED) len = 2, hi = 0x9F;
        else if (c >= 0xE1 && c <= 0xEF) len = 2;
        else if (c == 0xF0) len = 3, lo = 0x90;
        else if (c >= 0xF1 && c <= 0xF3) len = 3;
        else if (c == 0xF4) len = 3, hi = 0x8F;
        else return i;
        if (n - i <= len || s[i + 1] < lo || s[i + 1] > hi) return i;
        for (size_t k = 2; k <= len; k++)
            if ((s[i + k] & 0xC0) != 0x80) return i;
        i += len + 1;
    }
    return n;
}

/* A name add_param takes (fn: the call, for the message): non-empty, at
 * most MU_MAX_NAME bytes of valid UTF-8 (checkpoints store names as
 * text); else MU_EINVAL showing its first 60 bytes, control characters
 * and bytes above 0x7E as \xNN (as the Lua side's muon.param.check_name). */
static int mu__check_name(mu__eng *eng, const char *fn, const char *name)
{
    if (!name || !*name) return MU__EFAIL(eng, MU_EINVAL, "%s: name is NULL or empty", fn);
    size_t n = strnlen(name, (size_t)MU_MAX_NAME + 1);
    size_t bad = n > MU_MAX_NAME ? n : mu__utf8_bad((const unsigned char *)name, n);
    if (bad == n && n <= MU_MAX_NAME) return MU_OK;
    char shown[60 * 4 + 4];
    size_t k = 0;
    for (size_t i = 0; i < n && i < 60; i++) {
        unsigned char c = (unsigned char)name[i];
        if (c < 0x20 || c > 0x7E) k += (size_t)snprintf(shown + k, sizeof shown - k, "\\x%02X", c);
        else shown[k++] = (char)c;
    }
    shown[k] = '\0';
    if (n > MU_MAX_NAME)
        return MU__EFAIL(eng, MU_EINVAL, "%s: parameter name '%s...' is longer than %d bytes (MU_MAX_NAME)", fn, shown,
                         (int)MU_MAX_NAME);
    return MU__EFAIL(eng, MU_EINVAL, "%s: parameter name '%s%s' is not valid UTF-8 (byte %zu is 0x%02X): "
                     "checkpoints store names as UTF-8 text", fn, shown, n > 60 ? "..." : "", bad + 1,
                     (unsigned)(unsigned char)name[bad]);
}

static int eng_add_param(mu__eng *eng, const char *name, int dtype, int ndim,
                        const int64_t *shape, void *data, void *grad)
{
    if (!eng) return mu__fail(MU_EINVAL, "mu_engine_add_param: eng is NULL");
    int rc = mu__check_name(eng, "mu_engine_add_param", name);
    if (rc) return rc;
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

    mu__param_args a = {name, dtype, ndim, 0, shape, NULL, data, grad};
    return mu__call_run(eng, "add_param", "mu_engine_add_param", MU_EINVAL, mu__push_param, &a, NULL);
}

static int mu__push_ptr(lua_State *L, const void *p)
{
    lua_pushlightuserdata(L, (void *)p);
    return 1;
}

static int eng_set_comm(mu__eng *eng, void *mpi_comm_ptr)
{
    if (!eng) return mu__fail(MU_EINVAL, "mu_engine_set_comm: eng is NULL");
    if (!mpi_comm_ptr) return MU__EFAIL(eng, MU_EINVAL, "mu_engine_set_comm: mpi_comm_ptr is NULL");
    return mu__call_run(eng, "set_comm", "mu_engine_set_comm", MU_ESTATE, mu__push_ptr, mpi_comm_ptr, NULL);
}

static int eng_add_param_sharded(mu__eng *eng, const char *name, int dtype, int ndim,
                                const int64_t *global_shape, int naxes,
                                const mu_placement *placements, void *local_data, void *local_grad)
{
    if (!eng) return mu__fail(MU_EINVAL, "mu_engine_add_param_sharded: eng is NULL");
    int rc = mu__check_name(eng, "mu_engine_add_param_sharded", name);
    if (rc) return rc;
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
    static const mu_placement none[1] = {{0, 0}}; /* naxes = 0: an empty list, not NULL */
    mu__param_args a = {name, dtype, ndim, naxes, global_shape, naxes > 0 ? placements : none, local_data, local_grad};
    return mu__call_run(eng, "add_param_sharded", "mu_engine_add_param_sharded", MU_EINVAL, mu__push_param, &a,
                        NULL);
}

static int eng_step(mu__eng *eng)
{
    if (!eng) return mu__fail(MU_EINVAL, "mu_engine_step: eng is NULL");
    return mu__call_run(eng, "step", "mu_engine_step", MU_ELUA, NULL, NULL, NULL);
}

static int mu__push_op(lua_State *L, const void *p)
{
    lua_pushstring(L, *(const int *)p == MU_REDUCE_SUM ? "sum" : "mean");
    return 1;
}

static int eng_reduce_grads(mu__eng *eng, int op)
{
    if (!eng) return mu__fail(MU_EINVAL, "mu_engine_reduce_grads: eng is NULL");
    if (op != MU_REDUCE_MEAN && op != MU_REDUCE_SUM)
        return MU__EFAIL(eng, MU_EINVAL, "mu_engine_reduce_grads: op %d is neither MU_REDUCE_MEAN nor MU_REDUCE_SUM",
                         op);
    return mu__call_run(eng, "reduce_grads", "mu_engine_reduce_grads", MU_EINVAL, mu__push_op, &op, NULL);
}

/* A key (or name, or path) and a number, or a boolean (flag >= 0). */
typedef struct mu__key_args {
    const char *key;
    double value;
    int nvalues; /* 0: the key alone; 1: value; 2: flag as a boolean */
    int flag;
    const double *values; /* mu_engine_set_signal: a list of n */
    int64_t n;
} mu__key_args;

static int mu__push_key(lua_State *L, const void *p)
{
    const mu__key_args *a = p;
    lua_pushstring(L, a->key);
    if (a->values || a->nvalues == 3) {
        lua_createtable(L, (int)a->n, 0);
        for (int64_t i = 0; i < a->n; i++) {
            lua_pushnumber(L, (lua_Number)a->values[i]);
            lua_rawseti(L, -2, (int)(i + 1));
        }
        return 2;
    }
    if (a->nvalues == 1) lua_pushnumber(L, a->value);
    if (a->nvalues == 2) lua_pushboolean(L, a->flag);
    return a->nvalues ? 2 : 1;
}

static int eng_set(mu__eng *eng, const char *key, double value)
{
    if (!eng) return mu__fail(MU_EINVAL, "mu_engine_set: eng is NULL");
    if (!key) return MU__EFAIL(eng, MU_EINVAL, "mu_engine_set: key is NULL");
    mu__key_args a = {.key = key, .value = value, .nvalues = 1};
    return mu__call_run(eng, "set", "mu_engine_set", MU_EINVAL, mu__push_key, &a, NULL);
}

static int eng_get(mu__eng *eng, const char *key, double *out)
{
    if (!eng) return mu__fail(MU_EINVAL, "mu_engine_get: eng is NULL");
    if (!key) return MU__EFAIL(eng, MU_EINVAL, "mu_engine_get: key is NULL");
    if (!out) return MU__EFAIL(eng, MU_EINVAL, "mu_engine_get: out is NULL");
    mu__key_args a = {.key = key};
    return mu__call_run(eng, "get", "mu_engine_get", MU_EINVAL, mu__push_key, &a, out);
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
    mu__key_args a = {.key = name, .nvalues = 3, .values = values, .n = n};
    return mu__call_run(eng, "set_signal", "mu_engine_set_signal", MU_EINVAL, mu__push_key, &a, NULL);
}

static int eng_zero_grad(mu__eng *eng, int unused)
{
    (void)unused;
    if (!eng) return mu__fail(MU_EINVAL, "mu_engine_zero_grad: eng is NULL");
    return mu__call_run(eng, "zero_grad", "mu_engine_zero_grad", MU_EINVAL, NULL, NULL, NULL);
}

static int mu__push_number(lua_State *L, const void *p)
{
    lua_pushnumber(L, *(const double *)p);
    return 1;
}

static int eng_clip_grad_norm(mu__eng *eng, double max_norm, double *norm)
{
    if (!eng) return mu__fail(MU_EINVAL, "mu_engine_clip_grad_norm: eng is NULL");
    double v = 0;
    int rc = mu__call_run(eng, "clip_grad_norm", "mu_engine_clip_grad_norm", MU_EINVAL, mu__push_number,
                          &max_norm, &v);
    if (norm) *norm = rc == MU_OK ? v : 0;
    return rc;
}

static int eng_set_lr(mu__eng *eng, const char *group, double lr)
{
    if (!eng) return mu__fail(MU_EINVAL, "mu_engine_set_lr: eng is NULL");
    if (!group || !*group) return MU__EFAIL(eng, MU_EINVAL, "mu_engine_set_lr: group is NULL or empty");
    mu__key_args a = {.key = group, .value = lr, .nvalues = 1};
    return mu__call_run(eng, "set_lr", "mu_engine_set_lr", MU_EINVAL, mu__push_key, &a, NULL);
}

/* An argument error of a collective call (op "save" or "load"), already
 * recorded by mu__fail: raised through the Lua side (host.fail_collective)
 * so that on a distributed engine every rank fails the call with it instead
 * of the others waiting in it. */
typedef struct mu__fail_args {
    const char *op;
    int code;
    const char *msg;
} mu__fail_args;

static int mu__push_fail(lua_State *L, const void *p)
{
    const mu__fail_args *a = p;
    lua_pushstring(L, a->op);
    lua_pushinteger(L, a->code);
    lua_pushstring(L, a->msg);
    return 3;
}

static int mu__fail_collective(mu__eng *eng, const char *op, const char *what, int code)
{
    char msg[512];
    snprintf(msg, sizeof msg, "%s", mu_last_error());
    mu__fail_args a = {op, code, msg};
    return mu__call_run(eng, "fail_collective", what, code, mu__push_fail, &a, NULL);
}

static int eng_save(mu__eng *eng, const char *path, int flags)
{
    if (!eng) return mu__fail(MU_EINVAL, "mu_engine_save: eng is NULL");
    /* (an argument error fails the call the other ranks make: the same flags) */
    const char *op = (flags & MU_SAVE_SHARDED) ? "save_sharded" : "save";
    if (!path || !*path)
        return mu__fail_collective(eng, op, "mu_engine_save",
                                   mu__fail(MU_EINVAL, "mu_engine_save: path is NULL or empty"));
    if (flags & ~MU_SAVE_SHARDED)
        return mu__fail_collective(eng, op, "mu_engine_save_ex",
                                   mu__fail(MU_EINVAL, "mu_engine_save_ex: unknown flags 0x%x", (unsigned)flags));
    mu__key_args a = {.key = path, .nvalues = 2, .flag = (flags & MU_SAVE_SHARDED) != 0};
    return mu__call_run(eng, "save", "mu_engine_save", MU_EIO, mu__push_key, &a, NULL);
}

static int eng_load(mu__eng *eng, const char *path, int flags)
{
    if (!eng) return mu__fail(MU_EINVAL, "mu_engine_load: eng is NULL");
    if (!path || !*path)
        return mu__fail_collective(eng, "load", "mu_engine_load",
                                   mu__fail(MU_EINVAL, "mu_engine_load: path is NULL or empty"));
    if (flags & ~MU_LOAD_NO_CHECKSUM)
        return mu__fail_collective(eng, "load", "mu_engine_load_ex",
                                   mu__fail(MU_EINVAL, "mu_engine_load_ex: unknown flags 0x%x", (unsigned)flags));
    mu__key_args a = {.key = path, .nvalues = 2, .flag = (flags & MU_LOAD_NO_CHECKSUM) != 0};
    return mu__call_run(eng, "load", "mu_engine_load", MU_EFORMAT, mu__push_key, &a, NULL);
}

/* mu_engine_set_grads's lists. */
typedef struct mu__grads_args {
    int64_t n;
    const char *const *names;
    void *const *grads;
} mu__grads_args;

static int mu__push_grads(lua_State *L, const void *p)
{
    const mu__grads_args *a = p;
    lua_createtable(L, (int)a->n, 0);
    for (int64_t i = 0; i < a->n; i++) {
        lua_createtable(L, 2, 0);
        lua_pushstring(L, a->names[i]);
        lua_rawseti(L, -2, 1);
        if (a->grads[i]) lua_pushlightuserdata(L, a->grads[i]); else lua_pushboolean(L, 0);
        lua_rawseti(L, -2, 2);
        lua_rawseti(L, -2, (int)(i + 1));
    }
    return 1;
}

static int eng_set_grads(mu__eng *eng, int64_t n, const char *const *names, void *const *grads)
{
    if (!eng) return mu__fail(MU_EINVAL, "mu_engine_set_grads: eng is NULL");
    if (n < 0 || n > (1 << 24))
        return MU__EFAIL(eng, MU_EINVAL, "mu_engine_set_grads: n = %lld is outside 0..%d", (long long)n, 1 << 24);
    if (n > 0 && (!names || !grads))
        return MU__EFAIL(eng, MU_EINVAL, "mu_engine_set_grads: names or grads is NULL with n = %lld", (long long)n);
    for (int64_t i = 0; i < n; i++)
        if (!names[i] || !*names[i])
            return MU__EFAIL(eng, MU_EINVAL, "mu_engine_set_grads: names[%lld] is NULL or empty", (long long)i);
    mu__grads_args a = {n, names, grads};
    return mu__call_run(eng, "set_grads", "mu_engine_set_grads", MU_EINVAL, mu__push_grads, &a, NULL);
}

static int eng_query(mu__eng *eng, const char *what, char *buf, size_t cap, size_t *len)
{
    if (!eng) return mu__fail(MU_EINVAL, "mu_engine_query: eng is NULL");
    if (len) *len = 0;
    if (buf && cap > 0) buf[0] = '\0';
    if (!what) return MU__EFAIL(eng, MU_EINVAL, "mu_engine_query: what is NULL");
    if (!len) return MU__EFAIL(eng, MU_EINVAL, "mu_engine_query: len is NULL");
    if (!buf && cap > 0) return MU__EFAIL(eng, MU_EINVAL, "mu_engine_query: buf is NULL and cap = %zu", cap);
    mu__key_args a = {.key = what};
    mu__call c = {eng, "query", "mu_engine_query", MU_EINVAL, mu__push_key, &a, NULL, MU_OK, buf, cap, len};
    return mu__call_do(&c);
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

int mu_engine_reduce_grads(mu_engine *h, int op) { MU__ENGINE_CALL(reduce_grads, op); }
int mu_engine_set(mu_engine *h, const char *key, double value) { MU__ENGINE_CALL(set, key, value); }
int mu_engine_get(mu_engine *h, const char *key, double *out) { MU__ENGINE_CALL(get, key, out); }

int mu_engine_set_signal(mu_engine *h, const char *name, const double *values, int64_t n)
{
    MU__ENGINE_CALL(set_signal, name, values, n);
}

int mu_engine_zero_grad(mu_engine *h) { MU__ENGINE_CALL(zero_grad, 0); }
int mu_engine_clip_grad_norm(mu_engine *h, double max_norm, double *norm)
{
    MU__ENGINE_CALL(clip_grad_norm, max_norm, norm);
}
int mu_engine_set_lr(mu_engine *h, const char *group, double lr) { MU__ENGINE_CALL(set_lr, group, lr); }
int mu_engine_save(mu_engine *h, const char *path) { MU__ENGINE_CALL(save, path, 0); }
int mu_engine_save_ex(mu_engine *h, const char *path, int flags) { MU__ENGINE_CALL(save, path, flags); }
int mu_engine_load(mu_engine *h, const char *path) { MU__ENGINE_CALL(load, path, 0); }
int mu_engine_load_ex(mu_engine *h, const char *path, int flags) { MU__ENGINE_CALL(load, path, flags); }
int mu_engine_set_grads(mu_engine *h, int64_t n, const char *const *names, void *const *grads)
{
    MU__ENGINE_CALL(set_grads, n, names, grads);
}
int mu_engine_query(mu_engine *h, const char *what, char *buf, size_t cap, size_t *len)
{
    MU__ENGINE_CALL(query, what, buf, cap, len);
}
