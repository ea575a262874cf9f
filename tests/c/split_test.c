/*
 * Split Newton-Schulz machines (mu__split_*) driven from C: g ranks in one
 * process whose exchanges are copies in memory, with two workers per
 * machine, against one process (mu_ns_zeropower), bit for bit; the
 * machines made and freed (leak and thread checkers run this test too).
 * TAP output; exit 1 on any failure.
 */
#include "muon_ffi.h"
#include "tap.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { ROWS = 40, COLS = 100, MAXG = 7 };

static size_t esize(int dtype) { return dtype == MU_F64 ? 8 : dtype == MU_BF16 ? 2 : 4; }

/* One exchange of g ranks' requests, copied in memory. */
static void exchange(mu__split_xfer *x, int g)
{
    const size_t es = esize(x[0].dtype);
    for (int q = 0; q < g; q++)
        for (int p = 0; p < g; p++) {
            const int a2a = x[q].op == MU__SPLIT_ALLTOALLV;
            const int64_t n = a2a ? x[q].sendcounts[p] : x[q].sendcount;
            const char *src = (const char *)x[q].send + (a2a ? x[q].sdispls[p] : 0) * (int64_t)es;
            if (n > 0) memcpy((char *)x[p].recv + x[p].rdispls[q] * (int64_t)es, src, (size_t)n * es);
        }
}

/* The iteration of x over g ranks (columns dealt as the machines say),
 * assembled into y; MU_OK or the status every rank returned. */
static int run_group(const mu_tensor *x, const mu_ns_opts *o, int g, mu_tensor *y)
{
    mu__split *m[MAXG] = {0};
    mu_tensor *piece[MAXG] = {0};
    mu__split_info info[MAXG];
    mu__split_xfer xf[MAXG];
    int rc = MU_OK;
    for (int q = 0; q < g && rc == MU_OK; q++) {
        rc = mu__split_new(MU_F32, ROWS, COLS, o, g, q, &m[q]);
        if (rc == MU_OK) rc = mu__split_get_info(m[q], &info[q]);
        const int64_t shape[2] = {ROWS, rc == MU_OK ? info[q].length : 0};
        if (rc == MU_OK) rc = mu_tensor_new(MU_F32, 2, shape, &piece[q]);
        for (int64_t i = 0; rc == MU_OK && i < ROWS; i++)
            memcpy((float *)piece[q]->data + i * shape[1],
                   (const float *)x->data + i * COLS + info[q].start, (size_t)shape[1] * sizeof(float));
        if (rc == MU_OK) mu__split_begin(m[q], piece[q], piece[q]);
    }
    for (int more = rc == MU_OK; more;) {
        int first = 0;
        for (int q = 0; q < g; q++) {
            const int r = mu__split_next(m[q], &xf[q]);
            if (q == 0) first = r;
            else if (r != first) first = MU_ECOMM; /* the ranks disagree */
        }
        if (first == 1) exchange(xf, g);
        else more = 0, rc = first;
    }
    for (int q = 0; q < g; q++) {
        for (int64_t i = 0; rc == MU_OK && i < ROWS; i++)
            memcpy((float *)y->data + i * COLS + info[q].start,
                   (const float *)piece[q]->data + i * info[q].length, (size_t)info[q].length * sizeof(float));
        mu_tensor_free(piece[q]);
        mu__split_free(m[q]);
    }
    return rc;
}

int main(void)
{
    setenv("MU_NS_SPLIT_PLAN", "64,16,16", 1); /* 7 blocks of 16, 3 stripes of 16 rows */
    setenv("MU_NS_THREADS", "2", 1);
    double coeffs[15];
    int steps;
    double scale;
    if (mu_ns_preset("asym5", 5, coeffs, 5, &scale, &steps) != MU_OK) return 1;
    const int64_t shape[2] = {ROWS, COLS};
    mu_tensor *x = NULL, *want = NULL, *y = NULL;
    if (mu_tensor_new(MU_F32, 2, shape, &x) || mu_tensor_new(MU_F32, 2, shape, &want) ||
        mu_tensor_new(MU_F32, 2, shape, &y))
        return 1;
    unsigned seed = 7;
    for (int64_t i = 0; i < ROWS * COLS; i++) {
        seed = seed * 1103515245u + 12345u;
        ((float *)x->data)[i] = (float)((double)(seed >> 8) / (1 << 24) - 0.5);
    }
    for (int method = MU_NS_STANDARD; method <= MU_NS_GRAM; method++) {
        const mu_ns_opts o = {.steps = steps, .coeffs = coeffs, .eps = 1e-7, .norm_scale = scale,
                              .method = method};
        int64_t blocks = 0;
        ok(mu__split_plan(ROWS, COLS, &o, &blocks, NULL) == MU_OK && blocks == 7, "7 blocks");
        ok(mu_ns_zeropower(x, want, &o, NULL) == MU_OK, "one process");
        for (int g = 1; g <= MAXG; g += 2) {
            memset(y->data, 0, sizeof(float) * ROWS * COLS);
            const int rc = run_group(x, &o, g, y);
            ok(rc == MU_OK && memcmp(y->data, want->data, sizeof(float) * ROWS * COLS) == 0,
               "%s, %d ranks: one process's bits (status %d)", method ? "gram" : "standard", g, rc);
        }
    }
    mu_tensor_free(x);
    mu_tensor_free(want);
    mu_tensor_free(y);
    return n_fail != 0;
}
