/*
 * Newton-Schulz in an OpenMP host (built with -fopenmp, see Makefile): the
 * engine's workers then run as a parallel region of the host's OpenMP
 * runtime. mu_ns_zeropower_many must give the bits of mu_ns_zeropower on
 * each tensor alone with one worker, whether its workers are the host's
 * OpenMP team, threads of its own (MU_NS_OPENMP=0), or a call made inside
 * one of the host's parallel regions (a team of one). TAP output.
 */
#include "muon_ffi.h"
#include "tap.h"

#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { NT = 5 };
/* Shapes: whole ones, batches, a tall one (small enough for valgrind; the
 * tile-shared path is tested with threads of our own in tests/ns_spec.lua:
 * the scheduler's code is the same whichever threads run it). */
static const int64_t shapes[NT][3] = {
    {1, 64, 96}, {3, 48, 80}, {1, 130, 40}, {1, 200, 260}, {2, 32, 32}};

static mu_tensor *random_tensor(int i, unsigned seed)
{
    const int64_t *s = shapes[i];
    mu_tensor *t;
    if (mu_tensor_new(MU_F32, 3, s, &t) != MU_OK) return NULL;
    float *p = t->data;
    const int64_t n = s[0] * s[1] * s[2];
    for (int64_t k = 0; k < n; k++) {
        seed = seed * 1664525u + 1013904223u;
        p[k] = (float)(seed >> 8) / 16777216.0f - 0.5f;
    }
    return t;
}

static int same(mu_tensor *const *a, mu_tensor *const *b)
{
    for (int i = 0; i < NT; i++)
        if (memcmp(a[i]->data, b[i]->data,
                   (size_t)(shapes[i][0] * shapes[i][1] * shapes[i][2]) * sizeof(float)) != 0)
            return 0;
    return 1;
}

int main(void)
{
    double coeffs[15];
    double norm_scale;
    int steps;
    if (mu_ns_preset("asym5", 5, coeffs, 5, &norm_scale, &steps) != MU_OK) return 1;
    mu_ns_opts o5 = {.steps = 5, .coeffs = coeffs, .eps = 1e-10, .norm_scale = norm_scale,
                     .path = MU_NS_SYMMETRIC};
    mu_ns_opts o1 = o5;
    o1.steps = 2; /* options differ per tensor */
    const mu_ns_opts *opts[NT];
    mu_tensor *in[NT], *ref[NT], *out[NT];
    for (int i = 0; i < NT; i++) {
        opts[i] = i == 3 ? &o1 : &o5;
        in[i] = random_tensor(i, 100u + (unsigned)i);
        if (mu_tensor_new(MU_F32, 3, shapes[i], &ref[i]) != MU_OK ||
            mu_tensor_new(MU_F32, 3, shapes[i], &out[i]) != MU_OK || !in[i])
            return 1;
    }
    mu_ns_workspace *ws;
    if (mu_ns_workspace_new(MU_F32, 260, 200, &ws) != MU_OK) return 1;

    /* The reference: each tensor alone, one worker. */
    setenv("MU_NS_THREADS", "1", 1);
    int rc = MU_OK;
    for (int i = 0; i < NT && rc == MU_OK; i++) rc = mu_ns_zeropower(in[i], ref[i], opts[i], ws);
    ok(rc == MU_OK, "reference: each tensor alone, one worker (%s)", mu_last_error());

    setenv("MU_NS_THREADS", "2", 1);
#pragma omp parallel
    { /* the host's team exists and has run a region */
    }
    rc = mu_ns_zeropower_many(NT, (const mu_tensor *const *)in, out, opts, ws);
    ok(rc == MU_OK && same(out, ref), "two workers on the host's OpenMP team: the bits of each alone");

    for (int i = 0; i < NT; i++) memset(out[i]->data, 0, sizeof(float));
    setenv("MU_NS_OPENMP", "0", 1);
    rc = mu_ns_zeropower_many(NT, (const mu_tensor *const *)in, out, opts, ws);
    ok(rc == MU_OK && same(out, ref), "two workers of its own (MU_NS_OPENMP=0): the same bits");
    unsetenv("MU_NS_OPENMP");

    for (int i = 0; i < NT; i++) memset(out[i]->data, 0, sizeof(float));
    int team = 0;
#pragma omp parallel num_threads(2)
    {
#pragma omp single
        {
            team = omp_get_num_threads();
            rc = mu_ns_zeropower_many(NT, (const mu_tensor *const *)in, out, opts, ws);
        }
    }
    ok(rc == MU_OK && same(out, ref),
       "called inside a host parallel region of %d threads (nested: a team of one): the same bits",
       team);

    /* in place, the host's team again */
    for (int i = 0; i < NT; i++) memcpy(out[i]->data, in[i]->data,
                                        (size_t)(shapes[i][0] * shapes[i][1] * shapes[i][2]) * 4);
    rc = mu_ns_zeropower_many(NT, (const mu_tensor *const *)out, out, opts, ws);
    ok(rc == MU_OK && same(out, ref), "in place on the host's OpenMP team: the same bits");

    mu_ns_workspace_free(ws);
    for (int i = 0; i < NT; i++) {
        mu_tensor_free(in[i]);
        mu_tensor_free(ref[i]);
        mu_tensor_free(out[i]);
    }
    printf("1..%d\n", n_test);
    return n_fail ? 1 : 0;
}
