/*
 * demo_trainer -- a C trainer that embeds the muon engine (`make demo`).
 *
 * Trains a character-level language model on the Debian word list
 * (/usr/share/dict/words, package wamerican): an MLP that reads the previous
 * CTX characters through an embedding table, then hidden layers
 * (tanh(W x + b)), then an output head over 27 symbols (a-z and '.', which
 * marks the word boundary). Forward and backward are written here with
 * OpenBLAS sgemm; the optimizer is the muon engine, driven by a config file:
 * the same model is trained twice from the same seed and the same batches,
 * once with configs/muon.lua (Muon for the hidden matrices, AdamW for the
 * embedding, head and biases) and once with configs/adamw.lua, each at the
 * learning-rate multiplier (mu_engine_set "lr_scale") that a small sweep
 * found best for it: 0.5 for Muon, 2.0 for AdamW.
 *
 * The backward pass is checked against finite differences: --gradcheck.
 *
 * Writes <out>/loss.csv and <out>/loss.svg (default out: muon-demo in the
 * current directory; `make demo` passes build/demo) and prints a final table
 * and a few sampled words. The default configs are the source tree's
 * (found from this program's location), so it runs from any directory.
 * Every muon call is checked: a failure prints the engine's message and
 * the program exits with status 1.
 *
 *   build/examples/demo_trainer [--steps N] [--batch B] [--hidden H]
 *       [--layers L] [--seed S] [--out DIR] [--words FILE]
 *       [--muon-config F] [--adamw-config F] [--muon-lr-scale X]
 *       [--adamw-lr-scale X] [--gradcheck]      (--help for all)
 */
#include "muon.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { V = 27, MAX_LAYERS = 8, MAX_WORD = 32 };

/* ------------------------------------------------------------------ rng */

typedef struct { uint64_t s; } rng_t;

static uint64_t rng_next(rng_t *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
static double rng_uniform(rng_t *r) { return (rng_next(r) >> 11) * (1.0 / 9007199254740992.0); }
static double rng_normal(rng_t *r)
{
    double u1 = rng_uniform(r), u2 = rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
static uint64_t rng_below(rng_t *r, uint64_t n) { return rng_next(r) % n; }

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size);
    if (!p) {
        fprintf(stderr, "demo_trainer: out of memory\n");
        exit(1);
    }
    return p;
}

/* ----------------------------------------------------------------- data */

typedef struct {
    int ctx;
    int64_t n;       /* examples */
    uint8_t *x;      /* n * ctx previous characters (0 = '.') */
    uint8_t *y;      /* n next characters */
} dataset;

typedef struct {
    char **words;
    int n;
} wordlist;

static int load_words(const char *path, wordlist *wl)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "demo_trainer: cannot open %s: %s\n"
                "  (the word list comes with Debian's wamerican package: run `make deps`)\n",
                path, strerror(errno));
        return -1;
    }
    int cap = 1 << 16;
    wl->words = xcalloc((size_t)cap, sizeof(char *));
    wl->n = 0;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        size_t len = strcspn(line, "\r\n");
        line[len] = '\0';
        if (len == 0 || len >= MAX_WORD) continue;
        int ok = 1;
        for (size_t i = 0; i < len; i++)
            if (line[i] < 'a' || line[i] > 'z') { ok = 0; break; }
        if (!ok) continue;
        if (wl->n == cap) {
            cap *= 2;
            char **w = realloc(wl->words, (size_t)cap * sizeof(char *));
            if (!w) { fclose(f); return -1; }
            wl->words = w;
        }
        wl->words[wl->n] = strdup(line);
        if (!wl->words[wl->n]) { fclose(f); return -1; }
        wl->n++;
    }
    fclose(f);
    return 0;
}

static void build_dataset(char **words, int nwords, int ctx, dataset *d)
{
    int64_t n = 0;
    for (int i = 0; i < nwords; i++) n += (int64_t)strlen(words[i]) + 1;
    d->ctx = ctx;
    d->n = n;
    d->x = xcalloc((size_t)(n * ctx), 1);
    d->y = xcalloc((size_t)n, 1);
    int64_t k = 0;
    for (int i = 0; i < nwords; i++) {
        const char *w = words[i];
        int len = (int)strlen(w);
        for (int pos = 0; pos <= len; pos++, k++) {
            for (int c = 0; c < ctx; c++) {
                int j = pos - ctx + c;
                d->x[k * ctx + c] = (uint8_t)(j < 0 ? 0 : w[j] - 'a' + 1);
            }
            d->y[k] = (uint8_t)(pos < len ? w[pos] - 'a' + 1 : 0);
        }
    }
}

/* ---------------------------------------------------------------- model */

typedef struct {
    int ctx, emb, hidden, layers, maxb;
    int in0; /* ctx * emb */
    /* parameters and gradients, C-contiguous, W as (out, in) like torch */
    float *E, *dE;                           /* V x emb */
    float *W[MAX_LAYERS], *dW[MAX_LAYERS];   /* hidden x in_l */
    float *b[MAX_LAYERS], *db[MAX_LAYERS];   /* hidden */
    float *Wh, *dWh, *bh, *dbh;              /* V x hidden, V */
    /* activations for up to maxb rows */
    float *x0, *h[MAX_LAYERS], *logits, *dh, *dh2, *dx0;
} model;

static int layer_in(const model *m, int l) { return l == 0 ? m->in0 : m->hidden; }

static void model_init(model *m, int ctx, int emb, int hidden, int layers, int maxb)
{
    memset(m, 0, sizeof *m);
    m->ctx = ctx; m->emb = emb; m->hidden = hidden; m->layers = layers; m->maxb = maxb;
    m->in0 = ctx * emb;
    m->E = xcalloc((size_t)V * emb, sizeof(float));
    m->dE = xcalloc((size_t)V * emb, sizeof(float));
    for (int l = 0; l < layers; l++) {
        size_t n = (size_t)hidden * layer_in(m, l);
        m->W[l] = xcalloc(n, sizeof(float)); m->dW[l] = xcalloc(n, sizeof(float));
        m->b[l] = xcalloc((size_t)hidden, sizeof(float)); m->db[l] = xcalloc((size_t)hidden, sizeof(float));
        m->h[l] = xcalloc((size_t)maxb * hidden, sizeof(float));
    }
    m->Wh = xcalloc((size_t)V * hidden, sizeof(float)); m->dWh = xcalloc((size_t)V * hidden, sizeof(float));
    m->bh = xcalloc(V, sizeof(float)); m->dbh = xcalloc(V, sizeof(float));
    m->x0 = xcalloc((size_t)maxb * m->in0, sizeof(float));
    m->logits = xcalloc((size_t)maxb * V, sizeof(float));
    int wmax = hidden > m->in0 ? hidden : m->in0;
    m->dh = xcalloc((size_t)maxb * wmax, sizeof(float));
    m->dh2 = xcalloc((size_t)maxb * wmax, sizeof(float));
    m->dx0 = xcalloc((size_t)maxb * m->in0, sizeof(float));
}

static void model_free(model *m)
{
    free(m->E); free(m->dE);
    for (int l = 0; l < m->layers; l++) { free(m->W[l]); free(m->dW[l]); free(m->b[l]); free(m->db[l]); free(m->h[l]); }
    free(m->Wh); free(m->dWh); free(m->bh); free(m->dbh);
    free(m->x0); free(m->logits); free(m->dh); free(m->dh2); free(m->dx0);
}

/* Embedding N(0, 1); hidden W uniform(+-1/sqrt(in)) * 5/3 (tanh gain);
 * head uniform(+-1/sqrt(hidden)) * 0.1 so the first loss is near ln 27. */
static void model_randomize(model *m, uint64_t seed)
{
    rng_t r = {seed};
    for (int i = 0; i < V * m->emb; i++) m->E[i] = (float)rng_normal(&r);
    for (int l = 0; l < m->layers; l++) {
        int in = layer_in(m, l);
        double a = (5.0 / 3.0) / sqrt((double)in);
        for (int64_t i = 0; i < (int64_t)m->hidden * in; i++) m->W[l][i] = (float)(a * (2 * rng_uniform(&r) - 1));
        for (int i = 0; i < m->hidden; i++) m->b[l][i] = 0.0f;
    }
    double a = 0.1 / sqrt((double)m->hidden);
    for (int i = 0; i < V * m->hidden; i++) m->Wh[i] = (float)(a * (2 * rng_uniform(&r) - 1));
    for (int i = 0; i < V; i++) m->bh[i] = 0.0f;
}

/* Forward over rows idx[0..B-1] (or rows 0..B-1 of d from `first` when idx is
 * NULL). Returns the summed cross-entropy (nats); with backward, fills the
 * gradients of the mean loss. */
static double model_run(model *m, const dataset *d, const int64_t *idx, int64_t first, int B, int backward)
{
    const int ctx = m->ctx, emb = m->emb, H = m->hidden, in0 = m->in0;
    for (int r = 0; r < B; r++) {
        int64_t k = idx ? idx[r] : first + r;
        for (int c = 0; c < ctx; c++)
            memcpy(m->x0 + (size_t)r * in0 + (size_t)c * emb, m->E + (size_t)d->x[k * ctx + c] * emb,
                   (size_t)emb * sizeof(float));
    }
    const float *in = m->x0;
    for (int l = 0; l < m->layers; l++) {
        int nin = layer_in(m, l);
        float *h = m->h[l];
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, H, nin, 1.0f, in, nin, m->W[l], nin, 0.0f, h, H);
        for (int r = 0; r < B; r++)
            for (int j = 0; j < H; j++) h[(size_t)r * H + j] = tanhf(h[(size_t)r * H + j] + m->b[l][j]);
        in = h;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, V, H, 1.0f, in, H, m->Wh, H, 0.0f, m->logits, V);
    double loss = 0.0;
    const float inv_b = 1.0f / (float)B;
    for (int r = 0; r < B; r++) {
        float *z = m->logits + (size_t)r * V;
        int64_t k = idx ? idx[r] : first + r;
        float mx = -INFINITY;
        for (int j = 0; j < V; j++) { z[j] += m->bh[j]; if (z[j] > mx) mx = z[j]; }
        double s = 0.0;
        for (int j = 0; j < V; j++) s += exp((double)(z[j] - mx));
        double lse = mx + log(s);
        loss += lse - z[d->y[k]];
        if (backward) { /* dlogits = (softmax - onehot) / B, in place */
            for (int j = 0; j < V; j++) z[j] = (float)exp((double)z[j] - lse) * inv_b;
            z[d->y[k]] -= inv_b;
        }
    }
    if (!backward) return loss;

    /* head */
    const float *hl = m->h[m->layers - 1];
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, V, H, B, 1.0f, m->logits, V, hl, H, 0.0f, m->dWh, H);
    for (int j = 0; j < V; j++) m->dbh[j] = 0.0f;
    for (int r = 0; r < B; r++)
        for (int j = 0; j < V; j++) m->dbh[j] += m->logits[(size_t)r * V + j];
    float *dh = m->dh, *dprev = m->dh2;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B, H, V, 1.0f, m->logits, V, m->Wh, H, 0.0f, dh, H);
    for (int l = m->layers - 1; l >= 0; l--) {
        const float *h = m->h[l];
        int nin = layer_in(m, l);
        const float *x = l == 0 ? m->x0 : m->h[l - 1];
        for (int64_t i = 0; i < (int64_t)B * H; i++) dh[i] *= 1.0f - h[i] * h[i];
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, H, nin, B, 1.0f, dh, H, x, nin, 0.0f, m->dW[l], nin);
        for (int j = 0; j < H; j++) m->db[l][j] = 0.0f;
        for (int r = 0; r < B; r++)
            for (int j = 0; j < H; j++) m->db[l][j] += dh[(size_t)r * H + j];
        float *dst = l == 0 ? m->dx0 : dprev;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B, nin, H, 1.0f, dh, H, m->W[l], nin, 0.0f, dst, nin);
        if (l > 0) { float *t = dh; dh = dprev; dprev = t; }
    }
    memset(m->dE, 0, (size_t)V * emb * sizeof(float));
    for (int r = 0; r < B; r++) {
        int64_t k = idx ? idx[r] : first + r;
        for (int c = 0; c < ctx; c++) {
            float *g = m->dE + (size_t)d->x[k * ctx + c] * emb;
            const float *s = m->dx0 + (size_t)r * in0 + (size_t)c * emb;
            for (int e = 0; e < emb; e++) g[e] += s[e];
        }
    }
    return loss;
}

/* Mean loss over up to `limit` examples of d, in chunks of maxb rows. */
static double model_eval(model *m, const dataset *d, int64_t limit)
{
    int64_t n = d->n < limit ? d->n : limit;
    double total = 0.0;
    for (int64_t first = 0; first < n; first += m->maxb) {
        int B = (int)(n - first < m->maxb ? n - first : m->maxb);
        total += model_run(m, d, NULL, first, B, 0);
    }
    return total / (double)n;
}

static void model_sample(model *m, rng_t *r, char *out, int cap)
{
    dataset one = {m->ctx, 1, NULL, NULL};
    uint8_t x[64] = {0}, y = 0;
    one.x = x; one.y = &y;
    int len = 0;
    while (len < cap - 1) {
        model_run(m, &one, NULL, 0, 1, 0);
        float *z = m->logits;
        float mx = -INFINITY;
        for (int j = 0; j < V; j++) if (z[j] > mx) mx = z[j];
        double s = 0.0;
        for (int j = 0; j < V; j++) s += exp((double)(z[j] - mx));
        double u = rng_uniform(r) * s, acc = 0.0;
        int c = V - 1;
        for (int j = 0; j < V; j++) { acc += exp((double)(z[j] - mx)); if (u < acc) { c = j; break; } }
        if (c == 0) break;
        out[len++] = (char)('a' + c - 1);
        memmove(x, x + 1, (size_t)(m->ctx - 1));
        x[m->ctx - 1] = (uint8_t)c;
    }
    out[len] = '\0';
}

/* ------------------------------------------------------------ gradcheck */

/* Central differences in float32 on a tiny model; every parameter entry.
 * Prints the worst relative error; returns 0 when below 1e-2. */
static int gradcheck(const dataset *train)
{
    model m;
    const int B = 6;
    model_init(&m, train->ctx, 3, 7, 3, B);
    model_randomize(&m, 7);
    /* make the tiny head large enough that its gradients are not tiny */
    for (int i = 0; i < V * m.hidden; i++) m.Wh[i] *= 20.0f;
    int64_t idx[6];
    for (int i = 0; i < B; i++) idx[i] = 1000 + 37 * i;
    model_run(&m, train, idx, 0, B, 1);
    struct pg { const char *name; float *p, *g; int n; } ps[2 * MAX_LAYERS + 3];
    int np = 0;
    ps[np++] = (struct pg){"embed.weight", m.E, m.dE, V * m.emb};
    for (int l = 0; l < m.layers; l++) {
        ps[np++] = (struct pg){"hidden.weight", m.W[l], m.dW[l], m.hidden * layer_in(&m, l)};
        ps[np++] = (struct pg){"hidden.bias", m.b[l], m.db[l], m.hidden};
    }
    ps[np++] = (struct pg){"head.weight", m.Wh, m.dWh, V * m.hidden};
    ps[np++] = (struct pg){"head.bias", m.bh, m.dbh, V};
    /* copy the analytic gradients: model_run(backward=0) leaves them alone */
    double worst = 0.0;
    int checked = 0;
    const float eps = 1e-2f;
    for (int k = 0; k < np; k++) {
        for (int i = 0; i < ps[k].n; i++) {
            float keep = ps[k].p[i];
            ps[k].p[i] = keep + eps;
            double lp = model_run(&m, train, idx, 0, B, 0) / B;
            ps[k].p[i] = keep - eps;
            double lm = model_run(&m, train, idx, 0, B, 0) / B;
            ps[k].p[i] = keep;
            double num = (lp - lm) / (2.0 * eps);
            double ana = ps[k].g[i];
            /* float32 forward: the difference quotient carries ~1e-5 of noise */
            double err = fabs(num - ana) / fmax(5e-3, fabs(num) + fabs(ana));
            if (err > worst) {
                worst = err;
                if (getenv("GRADCHECK_VERBOSE"))
                    printf("  %s[%d] analytic %.6e numeric %.6e err %.2e\n", ps[k].name, i, ana, num, err);
            }
            checked++;
        }
    }
    printf("gradcheck: %d entries, max relative error %.2e\n", checked, worst);
    model_free(&m);
    if (worst < 1e-2) {
        printf("gradcheck ok\n");
        return 0;
    }
    printf("gradcheck FAILED\n");
    return 1;
}

/* ---------------------------------------------------------------- runs */

typedef struct {
    int steps, batch, hidden, layers, emb, ctx, eval_every, print_every, eval_limit;
    uint64_t seed;
    double lr_scale[2];
    const char *out, *words, *cfg[2], *cfg_shown[2]; /* config paths; as printed */
} options;

typedef struct {
    const char *label, *config, *shown;
    double *train, *lr, *heldout; /* per step (heldout NaN when not evaluated) */
    double final_train, final_heldout, seconds, ms_step, ms_opt;
    char samples[8][MAX_WORD + 1];
} run_result;

/* 0 for MU_OK; else prints the failure (eng NULL: mu_last_error()) and
 * returns 1. */
static int check(int rc, mu_engine *eng, const char *what)
{
    if (rc != MU_OK) {
        fprintf(stderr, "demo_trainer: %s failed: %s (%s)\n", what, mu_engine_error(eng), mu_strerror(rc));
        return 1;
    }
    return 0;
}

/* A shipped config of the source tree this program was built in
 * (build/examples/demo_trainer -> configs/NAME); configs/NAME relative to
 * the current directory if there is none. */
static void shipped_config(const char *name, char *buf, size_t cap)
{
    char exe[1024];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) *slash = '\0';
        snprintf(buf, cap, "%s/../../configs/%s", exe, name);
        if (access(buf, R_OK) == 0) return;
    }
    snprintf(buf, cap, "configs/%s", name);
}

static int train_run(const options *o, const dataset *train, const dataset *held, run_result *res, int k)
{
    model m;
    int maxb = o->batch > 1024 ? o->batch : 1024;
    model_init(&m, o->ctx, o->emb, o->hidden, o->layers, maxb);
    model_randomize(&m, o->seed);
    mu_engine *eng = NULL;
    if (check(mu_engine_open(&eng, res->config), NULL, "mu_engine_open")) { model_free(&m); return 1; }
    int64_t se[2] = {V, m.emb};
    int rc = mu_engine_add_param(eng, "embed.weight", MU_F32, 2, se, m.E, m.dE);
    char name[64];
    for (int l = 0; l < m.layers && rc == MU_OK; l++) {
        int64_t sw[2] = {m.hidden, layer_in(&m, l)}, sb[1] = {m.hidden};
        snprintf(name, sizeof name, "hidden.%d.weight", l);
        rc = mu_engine_add_param(eng, name, MU_F32, 2, sw, m.W[l], m.dW[l]);
        snprintf(name, sizeof name, "hidden.%d.bias", l);
        if (rc == MU_OK) rc = mu_engine_add_param(eng, name, MU_F32, 1, sb, m.b[l], m.db[l]);
    }
    int64_t sh[2] = {V, m.hidden}, sbh[1] = {V};
    if (rc == MU_OK) rc = mu_engine_add_param(eng, "head.weight", MU_F32, 2, sh, m.Wh, m.dWh);
    if (rc == MU_OK) rc = mu_engine_add_param(eng, "head.bias", MU_F32, 1, sbh, m.bh, m.dbh);
    if (rc == MU_OK && o->lr_scale[k] != 1.0) rc = mu_engine_set(eng, "lr_scale", o->lr_scale[k]);
    if (check(rc, eng, "mu_engine_add_param")) { mu_engine_close(eng); model_free(&m); return 1; }

    printf("\n== %s (%s", res->label, res->shown);
    if (o->lr_scale[k] != 1.0) printf(", lr_scale %g", o->lr_scale[k]);
    printf("): %d steps, batch %d\n", o->steps, o->batch);
    rng_t r = {o->seed ^ 0x5eedULL};
    int64_t *idx = xcalloc((size_t)o->batch, sizeof(int64_t));
    double t0 = now_ms(), opt_ms = 0.0, window_ms = 0.0, window_loss = 0.0;
    int window = 0;
    for (int step = 1; step <= o->steps; step++) {
        double ts = now_ms();
        for (int i = 0; i < o->batch; i++) idx[i] = (int64_t)rng_below(&r, (uint64_t)train->n);
        double loss = model_run(&m, train, idx, 0, o->batch, 1) / o->batch;
        double to = now_ms();
        /* A data-parallel (HSDP) trainer averages its gradients over the
         * replicas before the step; with one process (no dist section in
         * the config) this changes nothing. */
        if (check(mu_engine_reduce_grads(eng, MU_REDUCE_MEAN), eng, "mu_engine_reduce_grads")) {
            free(idx);
            mu_engine_close(eng);
            model_free(&m);
            return 1;
        }
        if (check(mu_engine_step(eng), eng, "mu_engine_step")) { free(idx); mu_engine_close(eng); model_free(&m); return 1; }
        double te = now_ms();
        opt_ms += te - to;
        double lr = NAN;
        if (check(mu_engine_get(eng, "lr", &lr), eng, "mu_engine_get")) { free(idx); mu_engine_close(eng); model_free(&m); return 1; }
        res->train[step - 1] = loss;
        res->lr[step - 1] = lr;
        res->heldout[step - 1] = NAN;
        window_ms += te - ts;
        window_loss += loss;
        window++;
        if (step % o->eval_every == 0 || step == o->steps)
            res->heldout[step - 1] = model_eval(&m, held, 8192);
        if (step % o->print_every == 0 || step == o->steps) {
            printf("%-6s step %5d  train loss %.4f", res->label, step, window_loss / window);
            if (!isnan(res->heldout[step - 1])) printf("  held-out %.4f", res->heldout[step - 1]);
            printf("  lr %.3g  %.1f ms/step\n", lr, window_ms / window);
            fflush(stdout);
            window = 0; window_ms = 0.0; window_loss = 0.0;
        }
    }
    double t1 = now_ms();
    res->seconds = (t1 - t0) / 1e3;
    res->ms_step = (t1 - t0) / o->steps;
    res->ms_opt = opt_ms / o->steps;
    res->final_train = model_eval(&m, train, o->eval_limit);
    res->final_heldout = model_eval(&m, held, o->eval_limit);
    rng_t sr = {o->seed + 99};
    for (int i = 0; i < 8; i++) model_sample(&m, &sr, res->samples[i], MAX_WORD);
    free(idx);
    mu_engine_close(eng);
    model_free(&m);
    return 0;
}

/* --------------------------------------------------------------- output */

static int write_csv(const char *path, const options *o, run_result *rs)
{
    FILE *f = fopen(path, "w");
    if (!f) { fprintf(stderr, "demo_trainer: cannot write %s: %s\n", path, strerror(errno)); return 1; }
    fprintf(f, "step,muon_train_loss,muon_heldout_loss,muon_lr,adamw_train_loss,adamw_heldout_loss,adamw_lr\n");
    for (int s = 0; s < o->steps; s++) {
        fprintf(f, "%d", s + 1);
        for (int k = 0; k < 2; k++) {
            fprintf(f, ",%.6f,", rs[k].train[s]);
            if (!isnan(rs[k].heldout[s])) fprintf(f, "%.6f", rs[k].heldout[s]);
            fprintf(f, ",%.6g", rs[k].lr[s]);
        }
        fprintf(f, "\n");
    }
    return fclose(f) != 0;
}

/* The loss plot: the CSV drawn by muon's plotter (lua/muon/plot.lua, what
 * `muon plot` runs), the train losses as moving averages over a 50th of
 * the steps, each run in one color. */
static int write_svg(const char *csv, const char *path, const options *o)
{
    char win[16];
    snprintf(win, sizeof win, "%d", o->steps / 50 > 1 ? o->steps / 50 : 1);
    char *args[] = {(char *)csv, "--out", (char *)path, "--title",
                    "Character-level MLP on /usr/share/dict/words: Muon vs AdamW", "--ylabel",
                    "cross-entropy loss (nats per character)", "--smooth", win,
                    "--y", "muon_train_loss=muon train", "--y", "muon_heldout_loss=muon held-out",
                    "--y", "adamw_train_loss=adamw train", "--y", "adamw_heldout_loss=adamw held-out"};
    int status = 1;
    int rc = mu_script_run_module("muon.plot", (int)(sizeof args / sizeof args[0]), args, 0, &status);
    if (rc != MU_OK) fprintf(stderr, "demo_trainer: plotting %s: %s\n", csv, mu_last_error());
    return rc != MU_OK || status != 0;
}

static int mkdirs(const char *path)
{
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p == '/') {
            *p = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST) return -1;
            *p = '/';
        }
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST) return -1;
    return 0;
}

/* ----------------------------------------------------------------- main */

static void usage(FILE *f)
{
    fprintf(f, "usage: demo_trainer [--steps N] [--batch B] [--hidden H] [--layers L] [--emb E]\n"
               "                    [--ctx C] [--seed S] [--out DIR] [--words FILE]\n"
               "                    [--muon-config F] [--adamw-config F] [--muon-lr-scale X]\n"
               "                    [--adamw-lr-scale X] [--eval-every N] [--print-every N] [--gradcheck]\n"
               "defaults: 1000 steps, batch 512, hidden 384, 3 layers, emb 16, ctx 8, seed 42,\n"
               "          lr scales 0.5 (muon) and 2.0 (adamw), out muon-demo,\n"
               "          configs muon.lua and adamw.lua of the source tree\n");
}

int main(int argc, char **argv)
{
    if (check(mu_blas_fix_core(argv), NULL, "mu_blas_fix_core")) return 1; /* OpenBLAS's fast core (re-exec once) */
    static char muon_cfg[2048], adamw_cfg[2048];
    shipped_config("muon.lua", muon_cfg, sizeof muon_cfg);
    shipped_config("adamw.lua", adamw_cfg, sizeof adamw_cfg);

    /* lr_scale: the best of a sweep over {0.25, 0.35, 0.5, 1, 2} (Muon) and
     * {1, 1.5, 2, 2.5, 3} (AdamW), held-out loss after 1000 steps; the
     * configs' schedules are written for 1000 steps. */
    options o = {.steps = 1000, .batch = 512, .hidden = 384, .layers = 3, .emb = 16, .ctx = 8,
                 .eval_every = 100, .print_every = 100, .eval_limit = 60000, .seed = 42,
                 .lr_scale = {0.5, 2.0}, .out = "muon-demo", .words = "/usr/share/dict/words",
                 .cfg = {muon_cfg, adamw_cfg}, .cfg_shown = {"configs/muon.lua", "configs/adamw.lua"}};
    int do_gradcheck = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        #define INTOPT(flag, field, min) \
            if (strcmp(a, flag) == 0) { if (!v || atoi(v) < (min)) { fprintf(stderr, "demo_trainer: %s needs an integer >= %d\n", flag, min); return 2; } o.field = atoi(v); i++; continue; }
        INTOPT("--steps", steps, 1)
        INTOPT("--batch", batch, 1)
        INTOPT("--hidden", hidden, 1)
        INTOPT("--layers", layers, 1)
        INTOPT("--emb", emb, 1)
        INTOPT("--ctx", ctx, 1)
        INTOPT("--eval-every", eval_every, 1)
        INTOPT("--print-every", print_every, 1)
        #undef INTOPT
        if (strcmp(a, "--seed") == 0 && v) { o.seed = strtoull(v, NULL, 10); i++; continue; }
        if (strcmp(a, "--out") == 0 && v) { o.out = v; i++; continue; }
        if (strcmp(a, "--words") == 0 && v) { o.words = v; i++; continue; }
        if (strcmp(a, "--muon-config") == 0 && v) { o.cfg[0] = o.cfg_shown[0] = v; i++; continue; }
        if (strcmp(a, "--adamw-config") == 0 && v) { o.cfg[1] = o.cfg_shown[1] = v; i++; continue; }
        if (strcmp(a, "--muon-lr-scale") == 0 && v) { o.lr_scale[0] = atof(v); i++; continue; }
        if (strcmp(a, "--adamw-lr-scale") == 0 && v) { o.lr_scale[1] = atof(v); i++; continue; }
        if (strcmp(a, "--gradcheck") == 0) { do_gradcheck = 1; continue; }
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) { usage(stdout); return 0; }
        fprintf(stderr, "demo_trainer: unknown or incomplete option '%s'\n", a);
        usage(stderr);
        return 2;
    }
    if (o.layers > MAX_LAYERS || o.ctx > 64) { fprintf(stderr, "demo_trainer: --layers <= %d, --ctx <= 64\n", MAX_LAYERS); return 2; }

    wordlist wl;
    if (load_words(o.words, &wl) != 0) return 1;
    rng_t r = {o.seed};
    for (int i = wl.n - 1; i > 0; i--) { /* Fisher-Yates */
        int j = (int)rng_below(&r, (uint64_t)i + 1);
        char *t = wl.words[i]; wl.words[i] = wl.words[j]; wl.words[j] = t;
    }
    int nheld = wl.n / 10;
    dataset train, held;
    build_dataset(wl.words + nheld, wl.n - nheld, o.ctx, &train);
    build_dataset(wl.words, nheld, o.ctx, &held);

    int status = 0;
    if (do_gradcheck) {
        status = gradcheck(&train);
    } else {
        mu_blas_info bi;
        if (check(mu_blas_get_info(&bi), NULL, "mu_blas_get_info")) return 1;
        printf("muon %s demo: %d words (%d train, %d held-out), %lld / %lld characters; OpenBLAS %s, %d threads\n",
               mu_version(), wl.n, wl.n - nheld, nheld, (long long)train.n, (long long)held.n, bi.core, bi.threads);
        printf("model: context %d, embedding %d, %d hidden layers of %d (tanh), head %d; %d params\n",
               o.ctx, o.emb, o.layers, o.hidden, V,
               V * o.emb + o.hidden * (o.ctx * o.emb + 1) + (o.layers - 1) * o.hidden * (o.hidden + 1) + V * (o.hidden + 1));
        run_result rs[2] = {{.label = "muon", .config = o.cfg[0], .shown = o.cfg_shown[0]},
                            {.label = "adamw", .config = o.cfg[1], .shown = o.cfg_shown[1]}};
        for (int k = 0; k < 2 && status == 0; k++) {
            rs[k].train = xcalloc((size_t)o.steps, sizeof(double));
            rs[k].lr = xcalloc((size_t)o.steps, sizeof(double));
            rs[k].heldout = xcalloc((size_t)o.steps, sizeof(double));
            status = train_run(&o, &train, &held, &rs[k], k);
        }
        if (status == 0) {
            printf("\n%-7s %-20s %10s %10s %9s %9s %8s\n", "run", "config", "train", "held-out", "ms/step", "opt ms", "time s");
            for (int k = 0; k < 2; k++)
                printf("%-7s %-20s %10.4f %10.4f %9.2f %9.2f %8.1f\n", rs[k].label, rs[k].shown,
                       rs[k].final_train, rs[k].final_heldout, rs[k].ms_step, rs[k].ms_opt, rs[k].seconds);
            printf("(loss: mean cross-entropy in nats per character over %d train / %lld held-out characters)\n",
                   (int)(train.n < o.eval_limit ? train.n : o.eval_limit), (long long)(held.n < o.eval_limit ? held.n : o.eval_limit));
            double d = rs[1].final_heldout - rs[0].final_heldout;
            printf("held-out loss: muon %s adamw by %.4f nats/char after %d steps\n", d > 0 ? "beats" : "does NOT beat", fabs(d), o.steps);
            for (int k = 0; k < 2; k++) {
                printf("samples (%s):", rs[k].label);
                for (int i = 0; i < 8; i++) printf(" %s", rs[k].samples[i]);
                printf("\n");
            }
            char path[1100];
            if (mkdirs(o.out) != 0) {
                fprintf(stderr, "demo_trainer: cannot create %s: %s\n", o.out, strerror(errno));
                status = 1;
            } else {
                snprintf(path, sizeof path, "%s/loss.csv", o.out);
                status |= write_csv(path, &o, rs);
                printf("wrote %s\n", path);
                char svg[1100];
                snprintf(svg, sizeof svg, "%s/loss.svg", o.out);
                fflush(stdout);
                status |= write_svg(path, svg, &o); /* (prints "wrote <svg>") */
            }
        }
        for (int k = 0; k < 2; k++) { free(rs[k].train); free(rs[k].lr); free(rs[k].heldout); }
    }
    free(train.x); free(train.y); free(held.x); free(held.y);
    for (int i = 0; i < wl.n; i++) free(wl.words[i]);
    free(wl.words);
    return status;
}
