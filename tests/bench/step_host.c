/*
 * The C side of tests/bench/python_bench.lua: a GPT-2-small parameter set
 * (12 layers of four 768x768, one 768x3072 and one 3072x768 matrices, Muon;
 * the 50257x768 embedding, AdamW) registered through the public C API with
 * fixed gradients, then STEPS timed mu_engine_step calls after one warm-up.
 * Prints "RESULT <median seconds per step>".
 *   step_host CONFIG STEPS
 */
#include "muon.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static float *filled(int64_t n, double phase)
{
    float *p = malloc((size_t)n * sizeof *p);
    if (!p) exit(1);
    for (int64_t i = 0; i < n; i++) p[i] = (float)(0.02 * sin(0.37 * (double)i + phase));
    return p;
}

static void fail(mu_engine *eng)
{
    fprintf(stderr, "step_host: %s\n", eng ? mu_engine_error(eng) : mu_last_error());
    exit(1);
}

int main(int argc, char **argv)
{
    mu_blas_fix_core(argv);
    if (argc != 3) {
        fprintf(stderr, "usage: step_host CONFIG STEPS\n");
        return 2;
    }
    int steps = atoi(argv[2]);
    mu_engine *eng;
    if (mu_engine_open(&eng, argv[1]) != MU_OK) fail(NULL);
    static const int64_t shapes[6][2] = {{768, 768}, {768, 768}, {768, 768}, {768, 768}, {768, 3072}, {3072, 768}};
    char name[64];
    int k = 0;
    for (int l = 0; l < 12; l++)
        for (int s = 0; s < 6; s++, k++) {
            int64_t n = shapes[s][0] * shapes[s][1];
            snprintf(name, sizeof name, "h.%d.w%d", l, s);
            if (mu_engine_add_param(eng, name, MU_F32, 2, shapes[s], filled(n, k), filled(n, 1000 + k)) != MU_OK)
                fail(eng);
        }
    int64_t wte[2] = {50257, 768};
    if (mu_engine_add_param(eng, "wte", MU_F32, 2, wte, filled(wte[0] * wte[1], 7), filled(wte[0] * wte[1], 8)))
        fail(eng);
    if (mu_engine_step(eng) != MU_OK) fail(eng); /* warm-up: state and buffers */
    double *t = malloc((size_t)steps * sizeof *t);
    for (int i = 0; i < steps; i++) {
        double t0 = now();
        if (mu_engine_step(eng) != MU_OK) fail(eng);
        t[i] = now() - t0;
    }
    qsort(t, (size_t)steps, sizeof *t, cmp);
    printf("RESULT %.9f\n", t[(steps - 1) / 2]);
    mu_engine_close(eng);
    return 0;
}
