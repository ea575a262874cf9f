/*
 * Configs that recurse through C frames never crash the host. A Lua
 * function that re-enters a C library function (string.gsub whose
 * replacement calls gsub, a replacement table whose __index calls gsub,
 * table.sort whose comparator sorts) nests C frames; LuaJIT has no C-stack
 * check, so on a thread's stack this ends in SIGSEGV. The engine runs its
 * Lua on a C stack of its own, big enough that LuaJIT's Lua-stack limit
 * (a clean "stack overflow" error) always comes first, whatever stack the
 * calling thread has: mu_engine_open, mu_engine_step and `muon check` fail
 * with a status and a message (MU_ENOMEM naming the stack: the sandbox's
 * limit on nested library calls, or LuaJIT's "stack overflow"), from the
 * main thread and from a thread with a 256 KB stack, and a failed step
 * changes nothing; a hook that runs out of memory is MU_ENOMEM naming it.
 * Each case runs in a forked child, so a crash is one failed line. TAP
 * output; exit 1 on failure.
 */
#include "muon.h"
#include "tap.h"

#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#endif
#endif
#ifndef RUNNING_ON_VALGRIND
#define RUNNING_ON_VALGRIND 0
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZER_BUILD 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SANITIZER_BUILD 1
#endif
#endif

#include <limits.h>
#include <pthread.h>
#include <sys/resource.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[256];
static char cli[PATH_MAX];

#define GROUPS "return { groups = { { optimizer = 'muon', match = '.*', lr = 0.02, momentum = 0.9 } } }\n"

/* Recursion through C frames at load time, sandboxed by default. */
static const char *GSUB = "local function f() return (('ab'):gsub('.', f)) end\nf()\n" GROUPS;
static const char *GSUB_TABLE =
    "local t\nt = setmetatable({}, { __index = function() return (('ab'):gsub('.', t)) end })\n"
    "local _ = ('x'):gsub('.', t)\n" GROUPS;
static const char *SORT =
    "local function f() table.sort({3, 1, 2}, function(a, b) f() return a < b end) end\nf()\n" GROUPS;
/* The same at step time, in a hook: the first call recurses, later ones
 * return nil (no transform: a second step shows the engine still works). */
static const char *HOOK =
    "local calls = 0\n"
    "local function f() return (('ab'):gsub('.', f)) end\n"
    "return { groups = { { optimizer = 'muon', match = '.*', lr = 0.02, momentum = 0.9,\n"
    "  ns_transform_fn = function(name, x) calls = calls + 1 if calls == 1 then f() end return nil end } } }\n";
/* Coroutines have a Lua stack each, so LuaJIT's limit never comes: on any
 * C stack these end in SIGSEGV, unless the sandbox stops them (it blocks
 * coroutines). A trusted config or a script that nests coroutines without
 * end still crashes, as under luajit. */
static const char *COWRAP = "local function f() coroutine.wrap(f)() end\nf()\n" GROUPS;
static const char *CORESUME =
    "local function f() local ok, e = coroutine.resume(coroutine.create(f)) if not ok then error(e, 0) end end\n"
    "f()\n" GROUPS;

typedef struct {
    const char *cfg;
    int trusted;
    int step;         /* 1: also add a parameter and step; 2: then step again (see run_job) */
    const char *want; /* open's message names it (NULL: "stack"), and the code may be any */
} job;

/* In the child: open (and step) job j; exit 0 when every call failed or
 * worked as documented (see below), else a code naming what went wrong. */
static int run_job(const job *j)
{
    mu_engine *e = NULL;
    mu_engine_opts o = {.trusted = j->trusted, .lua_path = NULL};
    int rc = mu_engine_open_ex(&e, j->cfg, &o);
    if (!j->step) {
        /* a config that recursed until the stack ran out does not open:
         * a failure status and a message about the stack (LuaJIT's "stack
         * overflow", or the sandbox's limit on nested library calls) */
        if (rc == MU_OK) return 10;
        if (e || !contains(mu_last_error(), j->want ? j->want : "stack")) return 11;
        if (!j->want && rc != MU_ENOMEM) return 20;
        printf("# %s: %.160s\n", mu_errname(rc), mu_last_error());
        return 0;
    }
    if (rc != MU_OK) {
        printf("# open: %s\n", mu_last_error());
        return 12;
    }
    float w[6] = {1, 2, 3, 4, 5, 6}, g[6] = {0.5f, -1, 2, 0.25f, -3, 1}, w0[6];
    int64_t shape[2] = {2, 3};
    memcpy(w0, w, sizeof w);
    if (mu_engine_add_param(e, "w", MU_F32, 2, shape, w, g) != MU_OK) return 13;
    rc = mu_engine_step(e);
    double step = -1;
    mu_engine_get(e, "step", &step);
    printf("# step: %s: %.*s\n", mu_errname(rc), (int)strcspn(mu_engine_error(e), "\n"), mu_engine_error(e));
    if (rc == MU_OK || !mu_engine_error(e)[0]) return 14;
    if (rc != MU_ENOMEM || !contains(mu_engine_error(e), "stack")) return 21;
    if (memcmp(w, w0, sizeof w) != 0 || step != 0) return 15; /* a failed step changes nothing */
    if (j->step == 1) {
        mu_engine_close(e);
        return 0;
    }
    /* the engine still works: the next step (the hook returns nil) moves w
     * exactly as an engine without the hook does. (Run in the test's own
     * process, after a child showed that the first step does not crash: in
     * a forked child, OpenBLAS would restart its thread pool, whose thread
     * blocks valgrind counts as lost when the child exits.) */
    if (mu_engine_step(e) != MU_OK) return 16;
    mu_engine *ref = NULL;
    float r[6];
    memcpy(r, w0, sizeof r);
    if (mu_engine_open(&ref, tap_write(dir, "ref.lua", GROUPS)) != MU_OK) return 17;
    if (mu_engine_add_param(ref, "w", MU_F32, 2, shape, r, g) != MU_OK || mu_engine_step(ref) != MU_OK) return 18;
    int same = memcmp(w, r, sizeof w) == 0 && memcmp(w, w0, sizeof w) != 0;
    mu_engine_close(ref);
    mu_engine_close(e);
    return same ? 0 : 19;
}

#ifndef SANITIZER_BUILD
/* A hook that allocates until memory runs out, in a child whose address
 * space is capped: the step fails with a status and a message (never a
 * crash), changes nothing, and the engine still closes. Not under ASan,
 * TSan or valgrind, whose shadow memory cannot live under a cap. */
static const char *MEM_HOOK =
    "local t = {}\n"
    "return { groups = { { optimizer = 'muon', match = '.*', lr = 0.02, momentum = 0.9,\n"
    "  ns_transform_fn = function(name, x) for i = 1, 1e9 do t[i] = { i, i, i, i } end end } } }\n";

static int run_out_of_memory(const char *cfg)
{
    mu_engine *e = NULL;
    if (mu_engine_open(&e, cfg) != MU_OK) return 30;
    float w[6] = {1, 2, 3, 4, 5, 6}, g[6] = {0.5f, -1, 2, 0.25f, -3, 1}, w0[6];
    int64_t shape[2] = {2, 3};
    memcpy(w0, w, sizeof w);
    if (mu_engine_add_param(e, "w", MU_F32, 2, shape, w, g) != MU_OK) return 31;
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long pages = 0;
    if (!f || fscanf(f, "%lu", &pages) != 1) return 32;
    fclose(f);
    struct rlimit r = {.rlim_cur = pages * (unsigned long)sysconf(_SC_PAGESIZE) + (256ul << 20)};
    r.rlim_max = RLIM_INFINITY;
    if (setrlimit(RLIMIT_AS, &r) != 0) return 33;
    int rc = mu_engine_step(e);
    printf("# out of memory: %s: %.*s\n", mu_errname(rc), (int)strcspn(mu_engine_error(e), "\n"), mu_engine_error(e));
    if (rc == MU_OK || !mu_engine_error(e)[0]) return 34;
    if (memcmp(w, w0, sizeof w) != 0) return 35;
    if (rc != MU_ENOMEM || !contains(mu_engine_error(e), "memory")) return 36;
    mu_engine_close(e);
    return 0;
}
#endif

static void *thread_job(void *p)
{
    return (void *)(intptr_t)run_job(p);
}

/* Runs j in a child, on the main thread or on a thread with a 256 KB
 * stack; one TAP line. */
static void check(const char *what, const job *j, int small_stack)
{
    pid_t pid = fork();
    if (pid == 0) {
        int code;
        if (small_stack) {
            pthread_t t;
            pthread_attr_t a;
            void *res;
            pthread_attr_init(&a);
            pthread_attr_setstacksize(&a, 256 << 10);
            if (pthread_create(&t, &a, thread_job, (void *)j) != 0) _exit(2);
            pthread_join(t, &res);
            code = (int)(intptr_t)res;
        } else {
            code = run_job(j);
        }
        fflush(stdout);
        _exit(code);
    }
    int st = -1;
    waitpid(pid, &st, 0);
    if (WIFSIGNALED(st))
        ok(0, "%s%s: crashed (signal %d)", what, small_stack ? " (256 KB thread)" : "", WTERMSIG(st));
    else
        ok(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s%s: fails cleanly%s (child status %d)", what,
           small_stack ? " (256 KB thread)" : "", j->step ? ", the failed step changes nothing" : "",
           WIFEXITED(st) ? WEXITSTATUS(st) : -1);
}

/* `muon check CFG --params SHAPES` in a child: exit status 1 (problems
 * found) with a message, not a signal. */
static void check_cli(const char *what, const char *cfg)
{
    if (access(cli, X_OK) != 0) {
        ok(1, "%s # SKIP no %s", what, cli);
        return;
    }
    const char *shapes = tap_write(dir, "shapes.txt", "w 2 3\n");
    char cmd[3 * PATH_MAX];
    snprintf(cmd, sizeof cmd, "'%s' check '%s' --params '%s' >'%s/check.out' 2>&1", cli, cfg, shapes, dir);
    int st = system(cmd);
    char out[PATH_MAX + 16];
    snprintf(out, sizeof out, "%s/check.out", dir);
    FILE *f = fopen(out, "r");
    char line[400] = "";
    while (f && !line[0] && fgets(line, sizeof line, f)) line[strcspn(line, "\n")] = '\0'; /* the first non-empty line */
    if (f) fclose(f);
    ok(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 1 && line[0],
       "%s: muon check exits 1 with a message (status %d: %.120s)", what,
       WIFEXITED(st) ? WEXITSTATUS(st) : -1, line);
}

int main(int argc, char **argv)
{
    (void)argc;
    /* one Newton-Schulz worker: a forked child starts no worker threads
     * (valgrind would count their thread blocks at the child's exit) */
    setenv("MU_NS_THREADS", "1", 1);
    snprintf(dir, sizeof dir, "/tmp/muon_cstack_test.XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    /* the CLI of the same build: <build>/tests/cstack_test -> <build>/muon */
    snprintf(cli, sizeof cli, "%s", argv[0]);
    char *slash = strrchr(cli, '/');
    if (slash) *slash = '\0';
    slash = strrchr(cli, '/');
    if (slash) snprintf(slash, cli + sizeof cli - slash, "/muon");
    else snprintf(cli, sizeof cli, "../muon");

    job gsub = {tap_write(dir, "gsub.lua", GSUB), 0, 0, NULL};
    job gsub_trusted = {gsub.cfg, 1, 0, "stack"}; /* unsandboxed: LuaJIT's error, whatever code the loader gives it */
    job gsub_table = {tap_write(dir, "gsub_table.lua", GSUB_TABLE), 0, 0, NULL};
    job sort = {tap_write(dir, "sort.lua", SORT), 0, 0, NULL};
    job hook = {tap_write(dir, "hook.lua", HOOK), 0, 1, NULL};
    job hook_again = {hook.cfg, 0, 2, NULL};
    for (int small = 0; small <= 1; small++) {
        check("mu_engine_open: gsub replacement calling gsub", &gsub, small);
        check("mu_engine_open (trusted): gsub replacement calling gsub", &gsub_trusted, small);
        check("mu_engine_open: gsub replacement table whose __index calls gsub", &gsub_table, small);
        check("mu_engine_open: sort comparator that sorts", &sort, small);
        check("mu_engine_step: a hook recursing through gsub", &hook, small);
    }
    for (int small = 0; small <= 1; small++) { /* in this process (see run_job) */
        int code = -1;
        if (small) {
            pthread_t t;
            pthread_attr_t a;
            void *res = (void *)(intptr_t)-1;
            pthread_attr_init(&a);
            pthread_attr_setstacksize(&a, 256 << 10);
            if (pthread_create(&t, &a, thread_job, &hook_again) == 0) pthread_join(t, &res);
            code = (int)(intptr_t)res;
        } else {
            code = run_job(&hook_again);
        }
        ok(code == 0, "mu_engine_step after a failed step that recursed through gsub%s: moves w as an engine "
           "without the hook (code %d)", small ? " (256 KB thread)" : "", code);
    }
    check_cli("muon check: gsub replacement calling gsub", gsub.cfg);
    check_cli("muon check: sort comparator that sorts", sort.cfg);

    job cowrap = {tap_write(dir, "cowrap.lua", COWRAP), 0, 0, "coroutine"};
    job coresume = {tap_write(dir, "coresume.lua", CORESUME), 0, 0, "coroutine"};
    check("mu_engine_open: coroutine.wrap nesting (refused by the sandbox)", &cowrap, 0);
    check("mu_engine_open: coroutine.resume nesting (refused by the sandbox)", &coresume, 0);
    check_cli("muon check: coroutine.wrap nesting", cowrap.cfg);
#ifdef SANITIZER_BUILD
    ok(1, "a hook that runs out of memory # SKIP sanitizer build");
#else
    if (RUNNING_ON_VALGRIND) {
        ok(1, "a hook that runs out of memory # SKIP under valgrind");
    } else {
        const char *mem = tap_write(dir, "mem.lua", MEM_HOOK);
        pid_t pid = fork();
        if (pid == 0) {
            int code = run_out_of_memory(mem);
            fflush(stdout);
            _exit(code);
        }
        int st = -1;
        waitpid(pid, &st, 0);
        ok(WIFEXITED(st) && WEXITSTATUS(st) == 0,
           "mu_engine_step: a hook that runs out of memory fails with a message, changes nothing (child %s %d)",
           WIFSIGNALED(st) ? "signal" : "status", WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
    }
#endif

    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) printf("# could not remove %s\n", dir);
    printf("1..%d\n", n_test);
    return n_fail != 0;
}
