/*
 * An OpenMP host around the engine step (tests/bench/omp_bench.lua runs it):
 * a llm.c-style trainer loop, an OpenMP parallel loop of host work, then
 * mu_engine_step on the width-128 GPT block set (4 layers of qkv 384x128,
 * proj 128x128, fc 512x128, fc-proj 128x512, Muon). Prints the median step
 * time and the median host-work time.
 *
 *   omp_host MODE CONFIG STEPS [HOST_N]
 *     MODE alone: the steps only (no OpenMP region ever runs)
 *     MODE host:  each step after an OpenMP parallel loop of host work
 *                 (HOST_N elements, default 65536: ~8 ms on 2 cores)
 */
#include <muon.h>
#include <omp.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp);
    return v[n / 2];
}

/* Host work: an elementwise pass like a trainer's activation kernels. */


static void host_work(float *x, float *y, int n)
{
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) {
        float v = x[i];
        for (int k = 0; k < 8; k++) v = v * 0.999f + tanhf(y[i] + v) * 1e-3f;
        y[i] = v;
    }
}

int main(int argc, char **argv)
{
    mu_blas_fix_core(argv);
    if (argc < 4) {
        fprintf(stderr, "usage: %s alone|host CONFIG STEPS [HOST_N]\n", argv[0]);
        return 2;
    }
    const int host = strcmp(argv[1], "host") == 0;
    const int steps = atoi(argv[3]);
    const int host_n = argc > 4 ? atoi(argv[4]) : 1 << 16;
    mu_engine *eng;
    if (mu_engine_open(&eng, argv[2]) != MU_OK) {
        fprintf(stderr, "%s\n", mu_last_error());
        return 1;
    }
    static const int64_t shapes[4][2] = {{384, 128}, {128, 128}, {512, 128}, {128, 512}};
    float *bufs[32];
    int nb = 0;
    unsigned seed = 1;
    for (int l = 0; l < 4; l++)
        for (int s = 0; s < 4; s++) {
            const int64_t n = shapes[s][0] * shapes[s][1];
            float *w = malloc((size_t)n * sizeof *w), *g = malloc((size_t)n * sizeof *g);
            for (int64_t i = 0; i < n; i++) {
                seed = seed * 1664525u + 1013904223u;
                w[i] = (float)(seed >> 8) / 16777216.0f - 0.5f;
                g[i] = (float)((seed >> 4) & 0xffff) / 65536.0f - 0.5f;
            }
            char name[32];
            snprintf(name, sizeof name, "h.%d.w%d", l, s);
            if (mu_engine_add_param(eng, name, MU_F32, 2, shapes[s], w, g) != MU_OK) {
                fprintf(stderr, "%s\n", mu_engine_error(eng));
                return 1;
            }
            bufs[nb++] = w;
            bufs[nb++] = g;
        }
    float *x = calloc((size_t)host_n, sizeof *x), *y = calloc((size_t)host_n, sizeof *y);
    for (int i = 0; i < host_n; i++) x[i] = (float)(i % 97) * 0.01f;
    double *st = calloc((size_t)steps, sizeof *st), *ht = calloc((size_t)steps, sizeof *ht);
    for (int k = -3; k < steps; k++) { /* 3 warm-up steps */
        double h = 0;
        if (host) {
            const double t0 = now();
            host_work(x, y, host_n);
            h = now() - t0;
        }
        const double t0 = now();
        if (mu_engine_step(eng) != MU_OK) {
            fprintf(stderr, "%s\n", mu_engine_error(eng));
            return 1;
        }
        if (k >= 0) {
            st[k] = now() - t0;
            ht[k] = h;
        }
    }
    printf("RESULT %.9f %.9f %d\n", median(st, steps), median(ht, steps), omp_get_max_threads());
    mu_engine_close(eng);
    for (int i = 0; i < nb; i++) free(bufs[i]);
    free(x);
    free(y);
    free(st);
    free(ht);
    return 0;
}
