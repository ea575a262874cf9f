/*
 * The engine API from several threads at once, as hosts with threads use
 * it: concurrent mu_engine_open/step/close with OPENBLAS_CORETYPE unset
 * (the OpenBLAS core is decided without touching the environment),
 * mu_engine_error_copy on one thread while another thread calls and closes
 * the engine, and the OpenBLAS core functions. Meant for ThreadSanitizer
 * (make test TSAN=1) and AddressSanitizer (SAN=1); the values are checked
 * in every build. TAP output; exit 1 on failure.
 */
#include "muon.h"
#include "tap.h"

#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[256];
static const char *good_cfg, *bad_cfg;

/* AdamW, lr 0.01, no decay: one step moves each element by
 * -0.01 * g / (|g| + 1e-8) (bias-corrected moments of one gradient). */
static const char *GOOD =
    "return { groups = { { optimizer = 'adamw', match = '.*', lr = 0.01, betas = { 0.9, 0.999 },\n"
    "  eps = 1e-8, weight_decay = 0 } } }\n";
static const char *BAD = "return { groups = { { optimizer = 'adamw', match = '.*', lr = -1 } } }\n";

enum { THREADS = 4, ROUNDS = 3 };

typedef struct {
    int id;
    int opened, stepped_right, refused_bad;
    char err[256];
} worker;

static void *open_step_close(void *p)
{
    worker *w = p;
    for (int r = 0; r < ROUNDS; r++) {
        mu_engine *e = NULL;
        int rc = mu_engine_open(&e, bad_cfg);
        if (rc == MU_EINVAL && !e && contains(mu_last_error(), "lr")) w->refused_bad++;
        rc = mu_engine_open(&e, good_cfg);
        if (rc != MU_OK) {
            snprintf(w->err, sizeof w->err, "open: %s", mu_last_error());
            continue;
        }
        w->opened++;
        float v[3] = {1, 2, 3}, g[3] = {0.5f, -2.0f, (float)(w->id + 1)};
        int64_t shape[1] = {3};
        rc = mu_engine_add_param(e, "b", MU_F32, 1, shape, v, g);
        if (rc == MU_OK) rc = mu_engine_step(e);
        double step = 0;
        if (rc == MU_OK) rc = mu_engine_get(e, "step", &step);
        int right = rc == MU_OK && step == 1;
        const float want[3] = {1 - 0.01f, 2 + 0.01f, 3 - 0.01f};
        for (int i = 0; i < 3; i++) right = right && fabsf(v[i] - want[i]) < 1e-6f;
        if (right) w->stepped_right++;
        else if (rc != MU_OK) snprintf(w->err, sizeof w->err, "step: %s", mu_engine_error(e));
        mu_engine_close(e);
    }
    return NULL;
}

/* One thread makes calls that fail with messages of changing length while
 * another copies the engine's message out, then closes the engine. */
static mu_engine *shared_eng;
static atomic_int calls_done;
static atomic_int copier_copied; /* the copier has made one copy: under a
                                  * serializing tool (valgrind) the calls and
                                  * the close could otherwise end before it ran */
static const char *KEYS[2] = {"k", "a_much_longer_key_that_does_not_exist_either_and_makes_a_longer_message"};

static void *failing_calls(void *p)
{
    (void)p;
    double v;
    for (int i = 0; i < 200; i++) {
        mu_engine_get(shared_eng, KEYS[i & 1], &v);
        if (i == 100)
            while (!atomic_load(&copier_copied)) sched_yield();
    }
    mu_engine_close(shared_eng);
    atomic_store(&calls_done, 1);
    return NULL;
}

typedef struct {
    int copies, well_formed, closed_seen, cut_ok;
} copier;

static void *copy_errors(void *p)
{
    copier *c = p;
    char buf[512], small[12];
    for (;;) {
        int done = atomic_load(&calls_done);
        int rc = mu_engine_error_copy(shared_eng, buf, sizeof buf);
        if (rc == MU_ESTATE) {
            c->closed_seen = contains(buf, "not an open engine");
            break;
        }
        c->copies++;
        atomic_store(&copier_copied, 1);
        /* either nothing yet, or one of the two messages whole */
        if (buf[0] == '\0' || (contains(buf, "mu_engine_get") && (contains(buf, KEYS[0]) || contains(buf, KEYS[1]))))
            c->well_formed++;
        rc = mu_engine_error_copy(shared_eng, small, sizeof small);
        if ((rc == MU_OK && strlen(small) < sizeof small) || rc == MU_ESTATE) c->cut_ok++;
        if (done) break;
        sched_yield();
    }
    return NULL;
}

int main(void)
{
    /* The environment is as a host has it at start (OpenBLAS, loaded with
     * this program, already read it); unset here before any thread of ours. */
    unsetenv("OPENBLAS_CORETYPE");
    snprintf(dir, sizeof dir, "/tmp/muon_threads_test.XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    good_cfg = tap_write(dir, "good.lua", GOOD);
    bad_cfg = tap_write(dir, "bad.lua", BAD);

    /* the OpenBLAS core functions */
    const char *core = mu_blas_cpu_core();
    ok(core && (strcmp(core, "SkylakeX") == 0 || strcmp(core, "Haswell") == 0 || strcmp(core, "") == 0),
       "mu_blas_cpu_core: a core of the table or \"\" (%s)", core ? core : "NULL");
    int rc = mu_blas_preset_core();
    ok((*core == '\0' && rc == MU_OK) ||
           (rc == MU_ESTATE && contains(mu_last_error(), "already loaded") && !getenv("OPENBLAS_CORETYPE")),
       "mu_blas_preset_core after OpenBLAS loaded: refused, environment unchanged (%s)", mu_last_error());
    setenv("OPENBLAS_CORETYPE", "Haswell", 1);
    rc = mu_blas_preset_core();
    ok(rc == MU_OK && strcmp(getenv("OPENBLAS_CORETYPE"), "Haswell") == 0,
       "mu_blas_preset_core keeps a value the user set");
    unsetenv("OPENBLAS_CORETYPE");

    /* concurrent open / step / close */
    pthread_t t[THREADS];
    worker w[THREADS];
    memset(w, 0, sizeof w);
    for (int i = 0; i < THREADS; i++) {
        w[i].id = i;
        pthread_create(&t[i], NULL, open_step_close, &w[i]);
    }
    int opened = 0, right = 0, refused = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        opened += w[i].opened;
        right += w[i].stepped_right;
        refused += w[i].refused_bad;
        if (w[i].err[0]) printf("# thread %d: %s\n", i, w[i].err);
    }
    ok(opened == THREADS * ROUNDS && right == THREADS * ROUNDS,
       "%d threads x %d rounds: every engine opened, stepped to the hand-computed values, closed (%d, %d)",
       THREADS, ROUNDS, opened, right);
    ok(refused == THREADS * ROUNDS, "concurrent opens of a bad config: each refused with its own message (%d)",
       refused);
    ok(!getenv("OPENBLAS_CORETYPE"), "the environment was not changed by opening engines");

    /* mu_engine_error_copy while another thread calls and closes the engine */
    rc = mu_engine_open(&shared_eng, good_cfg);
    ok(rc == MU_OK, "open the shared engine");
    if (rc == MU_OK) {
        pthread_t a, b;
        copier c = {0};
        pthread_create(&b, NULL, copy_errors, &c);
        pthread_create(&a, NULL, failing_calls, NULL);
        pthread_join(a, NULL);
        pthread_join(b, NULL);
        ok(c.copies > 0 && c.well_formed == c.copies, "every copy is a whole message (%d of %d)", c.well_formed,
           c.copies);
        ok(c.cut_ok == c.copies, "copies into 12 bytes are cut and terminated (%d of %d)", c.cut_ok, c.copies);
        char buf[256];
        rc = mu_engine_error_copy(shared_eng, buf, sizeof buf);
        ok(rc == MU_ESTATE && contains(buf, "not an open engine"),
           "after close: MU_ESTATE, buf names why (%s)", buf);
    }
    char buf[8];
    ok(mu_engine_error_copy(NULL, NULL, 0) == MU_OK, "mu_engine_error_copy(NULL, NULL, 0): nothing to do");
    ok(mu_engine_error_copy(NULL, NULL, 8) == MU_EINVAL, "mu_engine_error_copy with a NULL buf and n > 0: MU_EINVAL");
    mu_engine_get(NULL, "x", NULL);
    ok(mu_engine_error_copy(NULL, buf, sizeof buf) == MU_OK && strlen(buf) == 7 &&
           strncmp(buf, mu_last_error(), 7) == 0,
       "mu_engine_error_copy(NULL, ...): this thread's mu_last_error, cut (%s)", buf);
    {
        /* a cut never splits a UTF-8 character: 'é' is 2 bytes */
        mu_engine *e = NULL;
        rc = mu_engine_open(&e, tap_write(dir, "u.lua", "error('ééééééé')\n"));
        ok(rc != MU_OK, "a config raising a UTF-8 message fails");
        char u[400];
        const char *full = mu_last_error(); /* "mu_engine_open: config ..." */
        size_t i = strstr(full, "\xc3\xa9") ? (size_t)(strstr(full, "\xc3\xa9") - full) : 0;
        if (i > 0 && i + 2 < sizeof u) {
            mu_engine_error_copy(NULL, u, i + 2); /* room for i bytes and 1 of the 2 */
            ok(strlen(u) == i, "a cut inside a character backs off to its start (%zu bytes)", strlen(u));
        } else {
            ok(0, "no 'é' in the message to cut: %s", full);
        }
    }
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) printf("# could not remove %s\n", dir);
    printf("1..%d\n", n_test);
    return n_fail != 0;
}
