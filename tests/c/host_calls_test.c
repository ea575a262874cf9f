/*
 * The calls a host with its own tensor framework needs (the Python
 * package): mu_engine_open_source, mu_engine_set_grads, mu_engine_query and
 * mu_blas_switch_core. Steps are checked against values computed here (one
 * AdamW step from zero moments, no decay: w - lr g / (|g| + eps)). TAP
 * output; exit 1 on any failure.
 */
#include "muon.h"
#include "tap.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *ADAMW = "return { groups = { { name = 'mats', optimizer = 'muon', min_dim = 2 }, "
                           "{ optimizer = 'adamw', lr = 0.01, betas = { 0.9, 0.999 }, eps = 1e-8, "
                           "weight_decay = 0 } } }";

/* One AdamW step of w (n elements) from zero moments with gradient g. */
static int adamw_once_ok(const float *before, const float *after, const float *g, int n)
{
    for (int i = 0; i < n; i++) {
        double want = before[i] - 0.01 * g[i] / (fabs(g[i]) + 1e-8);
        if (fabs(after[i] - want) > 1e-6) return 0;
    }
    return 1;
}

static void test_open_source(void)
{
    mu_engine *eng = NULL;
    ok(mu_engine_open_source(&eng, ADAMW, "kw", NULL) == MU_OK && eng, "open_source: a config from source text");
    mu_engine_close(eng);
    int rc = mu_engine_open_source(&eng, "return { groups = { { optimizer = 'muon', momentm = 1 } } }", NULL, NULL);
    ok(rc == MU_EINVAL && !eng && contains(mu_last_error(), "config '<string>'") &&
           contains(mu_last_error(), "did you mean 'momentum'"),
       "open_source: a bad option is MU_EINVAL naming '<string>' and the option (%s)", mu_last_error());
    rc = mu_engine_open_source(&eng, "return {", "mine", NULL);
    ok(rc == MU_EFORMAT && contains(mu_last_error(), "config 'mine': syntax error"),
       "open_source: a syntax error is MU_EFORMAT naming the config (%s)", mu_last_error());
    rc = mu_engine_open_source(&eng, "return { groups = { {} }, x = io.open('/etc/passwd') }", "s", NULL);
    ok(rc != MU_OK && contains(mu_last_error(), "io.open is blocked"), "open_source: sandboxed like a file");
    mu_engine_opts opts = {0};
    opts.trusted = 1;
    rc = mu_engine_open_source(&eng, "local f = io.open('/dev/null') f:close() return { groups = { {} } }", "t", &opts);
    ok(rc == MU_OK, "open_source: opts.trusted runs it with full Lua (%s)", rc ? mu_last_error() : "ok");
    mu_engine_close(eng);
    ok(mu_engine_open_source(&eng, NULL, "x", NULL) == MU_EINVAL && mu_engine_open_source(NULL, ADAMW, "x", NULL) ==
           MU_EINVAL, "open_source: NULL source or out is MU_EINVAL");
}

static void test_set_grads(void)
{
    mu_engine *eng = NULL;
    if (mu_engine_open_source(&eng, ADAMW, "kw", NULL) != MU_OK) {
        ok(0, "set_grads: open (%s)", mu_last_error());
        return;
    }
    float w[3] = {1, 2, 3}, v[2] = {5, 6}, g1[3] = {1, 1, 1}, g2[3] = {-2, 0.5, 4}, gv[2] = {1, -1};
    int64_t s3[1] = {3}, s2[1] = {2};
    int rc = mu_engine_add_param(eng, "w", MU_F32, 1, s3, w, g1);
    rc = rc ? rc : mu_engine_add_param(eng, "v", MU_F32, 1, s2, v, NULL);
    ok(rc == MU_OK, "set_grads: two parameters, v without a grad");

    const char *names[2] = {"w", "v"};
    void *grads[2] = {g2, gv};
    float w0[3], v0[2];
    memcpy(w0, w, sizeof w);
    memcpy(v0, v, sizeof v);
    rc = mu_engine_set_grads(eng, 2, names, grads);
    g1[0] = g1[1] = g1[2] = 1e6f; /* the old buffer must not be read */
    rc = rc ? rc : mu_engine_step(eng);
    ok(rc == MU_OK && adamw_once_ok(w0, w, g2, 3) && adamw_once_ok(v0, v, gv, 2),
       "set_grads: the next step reads the new buffers (w and v)");

    /* v's grad to NULL (skipped), w's to a buffer overlapping v: refused, nothing changed */
    void *bad[2] = {v, NULL};
    const char *rev[2] = {"w", "v"};
    rc = mu_engine_set_grads(eng, 2, rev, bad);
    ok(rc == MU_EINVAL && contains(mu_engine_error(eng), "parameter 'w'") &&
           contains(mu_engine_error(eng), "value of parameter 'v'"),
       "set_grads: a grad overlapping another value is MU_EINVAL naming both (%s)", mu_engine_error(eng));
    float w1[3];
    memcpy(w1, w, sizeof w);
    memcpy(v0, v, sizeof v);
    rc = mu_engine_step(eng);
    ok(rc == MU_OK && memcmp(w, w1, sizeof w) != 0 && memcmp(v, v0, sizeof v) != 0,
       "set_grads: after a refused call both grads are still the old ones");

    /* swapping two grads between parameters at once is fine */
    float ga[3] = {1, 2, 3}, gb[3] = {3, 2, 1};
    void *ab[2] = {ga, NULL};
    const char *one[2] = {"w", "v"};
    ok(mu_engine_set_grads(eng, 2, one, ab) == MU_OK, "set_grads: w to a new buffer, v to NULL");
    memcpy(v0, v, sizeof v);
    rc = mu_engine_step(eng);
    ok(rc == MU_OK && memcmp(v, v0, sizeof v) == 0, "set_grads: a NULL grad skips the parameter");
    void *ba[1] = {gb};
    ok(mu_engine_set_grads(eng, 1, one, ba) == MU_OK, "set_grads: one parameter alone");

    const char *unknown[1] = {"nope"};
    ok(mu_engine_set_grads(eng, 1, unknown, ba) == MU_EINVAL && contains(mu_engine_error(eng), "'nope'"),
       "set_grads: an unknown name is MU_EINVAL naming it");
    const char *twice[2] = {"w", "w"};
    void *two[2] = {ga, gb};
    ok(mu_engine_set_grads(eng, 2, twice, two) == MU_EINVAL && contains(mu_engine_error(eng), "given twice"),
       "set_grads: a name given twice is MU_EINVAL");
    ok(mu_engine_set_grads(eng, 1, NULL, ba) == MU_EINVAL && mu_engine_set_grads(eng, -1, one, ba) == MU_EINVAL &&
           mu_engine_set_grads(eng, 0, NULL, NULL) == MU_OK,
       "set_grads: NULL lists or n < 0 are MU_EINVAL; n = 0 does nothing");
    mu_engine_close(eng);
    ok(mu_engine_set_grads(eng, 0, NULL, NULL) == MU_ESTATE, "set_grads: a closed engine is MU_ESTATE");
}

static void test_query(void)
{
    mu_engine *eng = NULL;
    if (mu_engine_open_source(&eng, ADAMW, "kw", NULL) != MU_OK) {
        ok(0, "query: open (%s)", mu_last_error());
        return;
    }
    float w[6] = {0}, b[3] = {0};
    int64_t s[2] = {2, 3};
    mu_engine_add_param(eng, "layer.w", MU_F32, 2, s, w, NULL);
    mu_engine_add_param(eng, "layer.b", MU_F32, 1, s + 1, b, NULL);
    mu_engine_set_lr(eng, "mats", 0.5);
    size_t len = 0;
    int rc = mu_engine_query(eng, "groups", NULL, 0, &len);
    ok(rc == MU_OK && len > 50, "query: the length alone (%zu)", len);
    char *buf = malloc(len + 1);
    rc = mu_engine_query(eng, "groups", buf, len + 1, &len);
    ok(rc == MU_OK && strlen(buf) == len, "query: the text fits in len + 1 bytes");
    ok(contains(buf, "\"name\":\"mats\"") && contains(buf, "\"params\":[\"layer.w\"]") &&
           contains(buf, "\"params\":[\"layer.b\"]") && contains(buf, "\"lr\":0.5") &&
           contains(buf, "\"optimizer\":\"adamw\"") && contains(buf, "\"hooks\":[]"),
       "query: groups with their names, parameters, options (set_lr applied) (%.200s)", buf);
    char small[8] = "xxxxxxx";
    rc = mu_engine_query(eng, "groups", small, sizeof small, &len);
    ok(rc == MU_OK && small[0] == '\0' && len > sizeof small, "query: a short buffer gets \"\", never cut JSON");
    rc = mu_engine_query(eng, "stats", buf, len + 1, &len);
    ok(rc == MU_EINVAL && contains(mu_engine_error(eng), "unknown key 'stats'"), "query: an unknown key is MU_EINVAL");
    ok(mu_engine_query(eng, "groups", NULL, 4, &len) == MU_EINVAL &&
           mu_engine_query(eng, "groups", buf, 4, NULL) == MU_EINVAL,
       "query: a NULL buf with cap > 0, or a NULL len, is MU_EINVAL");
    free(buf);
    mu_engine_close(eng);
}

static void test_switch_core(void)
{
    /* OpenBLAS is linked into this program, so already loaded: preset
     * refuses, switch re-selects its kernels (unless the variable is set,
     * which stays the user's choice) */
    const char *want = mu_blas_cpu_core();
    const char *env = getenv("OPENBLAS_CORETYPE");
    int user = env && *env;
    mu_blas_info info;
    mu_blas_get_info(&info);
    /* OpenBLAS may have picked that core itself (under valgrind, whose
     * CPUID it reads as Haswell's): then nothing changes, the variable
     * included */
    int already = strcasecmp(info.core, want) == 0;
    int rc = mu_blas_switch_core();
    mu_blas_get_info(&info);
    const char *now = getenv("OPENBLAS_CORETYPE");
    if (user || !*want)
        ok(rc == MU_OK, "switch_core: nothing to do (OPENBLAS_CORETYPE=%s, cpu core '%s')", env ? env : "", want);
    else if (already)
        ok(rc == MU_OK && strcasecmp(info.core, want) == 0 && !(now && *now),
           "switch_core: OpenBLAS already runs %s, the variable stays unset (%s)", want, info.core);
    else
        ok(rc == MU_OK && strcasecmp(info.core, want) == 0 && now && strcmp(now, want) == 0,
           "switch_core: OpenBLAS runs %s, the variable says it (%s)", want, info.core);
    ok(mu_blas_switch_core() == MU_OK, "switch_core: a second call has nothing to do");
}

int main(void)
{
    test_open_source();
    test_set_grads();
    test_query();
    test_switch_core();
    return n_fail != 0;
}
