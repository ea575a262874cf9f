/*
 * The per-matrix Newton-Schulz entry a scheduler uses (mu__ns_matrix, in
 * src/ns_gram.c) against mu_ns_zeropower, bit for bit, for both
 * iterations; mu__ns_cost against the cost model; mu_ns_method_for.
 * TAP output; exit 1 on any failure.
 */
#include "muon_internal.h"
#include "tap.h"

#include <cblas.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static mu_tensor *random_matrix(int64_t rows, int64_t cols, unsigned seed)
{
    const int64_t shape[2] = {rows, cols};
    mu_tensor *t = NULL;
    if (mu_tensor_new(MU_F32, 2, shape, &t) != MU_OK) exit(1);
    float *p = t->data;
    for (int64_t i = 0; i < rows * cols; i++) {
        seed = seed * 1103515245u + 12345u;
        p[i] = (float)((double)(seed >> 8) / (1 << 24) - 0.5);
    }
    return t;
}

int main(void)
{
    double coeffs[15];
    double scale;
    int steps;
    if (mu_ns_preset("asym5", 5, coeffs, 5, &scale, &steps) != MU_OK) return 1;
    mu_ns_opts o = {.steps = steps, .coeffs = coeffs, .eps = 1e-7, .norm_scale = scale};
    openblas_set_num_threads(1);

    const int64_t shapes[][2] = {{40, 160}, {160, 40}, {48, 48}};
    for (int si = 0; si < 3; si++) {
        const int64_t r = shapes[si][0], c = shapes[si][1];
        for (int method = MU_NS_STANDARD; method <= MU_NS_AUTO; method++) {
            o.method = method;
            mu_tensor *x = random_matrix(r, c, 7u + (unsigned)si), *want = NULL, *got = NULL;
            mu_tensor_clone(x, MU_F32, &want);
            mu_tensor_clone(x, MU_F32, &got);
            int rc = mu_ns_zeropower(x, want, &o, NULL);
            mu_ns_workspace *ws = NULL;
            mu_ns_workspace_new(MU_F32, r, c, &ws);
            double norm = 0.0;
            mu_tensor_norm(x, &norm);
            /* in place, as a scheduler's slot would run it */
            int rc2 = mu__ns_matrix(&o, MU_F32, r, c, got->data, got->data, norm, ws, 0);
            ok(rc == MU_OK && rc2 == MU_OK &&
                   memcmp(want->data, got->data, (size_t)(r * c) * sizeof(float)) == 0,
               "mu__ns_matrix %lldx%lld method %d: the bits of mu_ns_zeropower", (long long)r,
               (long long)c, method);
            ok(mu__ns_matrix(&o, MU_F32, r, c, x->data, got->data, norm, ws, 1) == MU_EINVAL,
               "an unallocated slot is refused");
            mu_ns_workspace_free(ws);
            mu_tensor_free(x);
            mu_tensor_free(want);
            mu_tensor_free(got);
        }
    }

    /* the cost model: s (3 n^2 m + n^3) and 3 (r + 1) n^2 m + (6 s - 5 (r + 1)) n^3, r = 1 */
    const double n = 768, m = 3072;
    o.method = MU_NS_STANDARD;
    ok(fabs(mu__ns_cost(768, 3072, &o) - 5 * (3 * n * n * m + n * n * n)) < 1, "standard cost");
    o.method = MU_NS_AUTO;
    ok(mu_ns_method_for(3072, 768, &o) == MU_NS_GRAM, "auto: gram at 3072x768");
    ok(fabs(mu__ns_cost(3072, 768, &o) - (6 * n * n * m + 20 * n * n * n)) < 1, "gram cost");
    ok(mu_ns_method_for(768, 768, &o) == MU_NS_STANDARD, "auto: standard at 768x768");
    o.method = 3;
    ok(mu_ns_method_for(4, 4, &o) == MU_EINVAL && strstr(mu_last_error(), "ns: method must be"),
       "a bad method is refused: %s", mu_last_error());
    printf("1..%d\n", n_test);
    return n_fail ? 1 : 0;
}
