/*
 * Newton-Schulz, both iterations: a matrix of a batch, in place, with one
 * or two workers, against the same matrix alone, bit for bit; mu__ns_cost
 * against the cost model; mu_ns_method_for.
 * TAP output; exit 1 on any failure.
 */
#include "ns_internal.h"
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

    /* Each matrix of a batch of 3, run in place with 1 and with 2 workers,
     * has the bits of the same matrix alone (out of place, 1 worker). */
    const int64_t shapes[][2] = {{40, 160}, {160, 40}, {48, 48}};
    for (int si = 0; si < 3; si++) {
        const int64_t r = shapes[si][0], c = shapes[si][1], len = r * c;
        for (int method = MU_NS_STANDARD; method <= MU_NS_AUTO; method++) {
            o.method = method;
            const int64_t shape3[3] = {3, r, c};
            mu_tensor *batch = NULL, *want = NULL;
            if (mu_tensor_new(MU_F32, 3, shape3, &batch) != MU_OK) return 1;
            for (int k = 0; k < 3; k++) {
                mu_tensor *x = random_matrix(r, c, 7u + (unsigned)(si * 3 + k));
                memcpy((float *)batch->data + k * len, x->data, (size_t)len * sizeof(float));
                mu_tensor_free(x);
            }
            mu_tensor_clone(batch, MU_F32, &want);
            int rc = MU_OK;
            setenv("MU_NS_THREADS", "1", 1);
            for (int k = 0; k < 3 && rc == MU_OK; k++) {
                const int64_t shape2[2] = {r, c};
                mu_tensor *in = NULL, *out = NULL;
                mu_tensor_wrap(MU_F32, 2, shape2, NULL, (float *)batch->data + k * len, &in);
                mu_tensor_wrap(MU_F32, 2, shape2, NULL, (float *)want->data + k * len, &out);
                rc = mu_ns_zeropower(in, out, &o, NULL);
                mu_tensor_free(in);
                mu_tensor_free(out);
            }
            for (int workers = 1; workers <= 2; workers++) {
                mu_tensor *got = NULL;
                mu_tensor_clone(batch, MU_F32, &got);
                setenv("MU_NS_THREADS", workers == 1 ? "1" : "2", 1);
                int rc2 = mu_ns_zeropower(got, got, &o, NULL);
                ok(rc == MU_OK && rc2 == MU_OK &&
                       memcmp(want->data, got->data, (size_t)(3 * len) * sizeof(float)) == 0,
                   "a batch of 3 %lldx%lld, method %d, in place, %d worker(s): the bits of each "
                   "matrix alone", (long long)r, (long long)c, method, workers);
                mu_tensor_free(got);
            }
            unsetenv("MU_NS_THREADS");
            mu_tensor_free(batch);
            mu_tensor_free(want);
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
