/*
 * A C trainer under mpirun: it initializes MPI itself, hands the engine its
 * own communicator (mu_engine_set_comm), registers its shards with
 * mu_engine_add_param_sharded, and checks after 10 steps that every shard is
 * bitwise equal to a second, non-distributed engine stepping the full
 * tensors in the same process. Prints "@@ rank ok|fail name" lines.
 *   c_engine DIST_CONFIG PLAIN_CONFIG REPLICAS SHARDS
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "muon.h"

static int rank;

static void report(const char *name, int ok, const char *detail) {
    printf("@@ %d %s %s%s%s\n", rank, ok ? "ok" : "fail", name, detail ? " # " : "", detail ? detail : "");
    fflush(stdout);
}

/* torch.chunk piece i of n into k */
static void chunk(int64_t n, int k, int i, int64_t *start, int64_t *len) {
    int64_t cs = (n + k - 1) / k;
    int64_t s = (int64_t)i * cs < n ? (int64_t)i * cs : n;
    int64_t l = n - (int64_t)i * cs;
    if (l > cs) l = cs;
    if (l < 0) l = 0;
    *start = s;
    *len = l;
}

typedef struct {
    const char *name;
    int ndim;
    int64_t shape[3];
    mu_placement pl[2];
    int64_t start[3], len[3];
    float *full, *fgrad, *loc, *lgrad;
    int64_t n, ln;
} param;

static void box_copy(const param *p, const float *src_full, float *dst_local) {
    /* general up to 3-D: iterate local indices */
    int64_t L0 = p->len[0], L1 = p->ndim > 1 ? p->len[1] : 1, L2 = p->ndim > 2 ? p->len[2] : 1;
    int64_t S1 = p->ndim > 1 ? p->shape[1] : 1, S2 = p->ndim > 2 ? p->shape[2] : 1;
    int64_t k = 0;
    for (int64_t a = 0; a < L0; a++)
        for (int64_t b = 0; b < L1; b++)
            for (int64_t c = 0; c < L2; c++) {
                int64_t ia = p->start[0] + a, ib = p->ndim > 1 ? p->start[1] + b : 0,
                        ic = p->ndim > 2 ? p->start[2] + c : 0;
                dst_local[k++] = src_full[(ia * S1 + ib) * S2 + ic];
            }
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: c_engine DIST_CONFIG PLAIN_CONFIG REPLICAS SHARDS\n");
        return 2;
    }
    MPI_Init(&argc, &argv);
    int size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm mine;
    MPI_Comm_split(MPI_COMM_WORLD, 0, rank, &mine);
    int R = atoi(argv[3]), S = atoi(argv[4]);
    int coords[2] = {rank / S, rank % S};
    int sizes[2] = {R, S};

    mu_engine *d = NULL, *p = NULL;
    if (mu_engine_open(&d, argv[1]) != MU_OK || mu_engine_open(&p, argv[2]) != MU_OK) {
        report("open", 0, mu_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    int rc = mu_engine_set_comm(d, &mine);
    report("set_comm", rc == MU_OK, rc ? mu_engine_error(d) : NULL);

    param ps[4] = {
        {"layers.0.w", 2, {10, 6, 0}, {{MU_REPLICATE, 0}, {MU_SHARD, 0}}, {0}, {0}, 0, 0, 0, 0, 0, 0},
        {"layers.0.v", 2, {5, 9, 0}, {{MU_SHARD, 1}, {MU_SHARD, 0}}, {0}, {0}, 0, 0, 0, 0, 0, 0},
        {"layers.0.experts", 3, {3, 4, 5}, {{MU_REPLICATE, 0}, {MU_SHARD, 0}}, {0}, {0}, 0, 0, 0, 0, 0, 0},
        {"embed", 2, {7, 3, 0}, {{MU_REPLICATE, 0}, {MU_SHARD, 0}}, {0}, {0}, 0, 0, 0, 0, 0, 0},
    };
    for (int i = 0; i < 4; i++) {
        param *q = &ps[i];
        q->n = q->ln = 1;
        for (int dd = 0; dd < q->ndim; dd++) {
            q->start[dd] = 0;
            q->len[dd] = q->shape[dd];
        }
        for (int a = 0; a < 2; a++)
            if (q->pl[a].kind == MU_SHARD) {
                int dd = q->pl[a].dim;
                int64_t s, l;
                chunk(q->len[dd], sizes[a], coords[a], &s, &l);
                q->start[dd] += s;
                q->len[dd] = l;
            }
        for (int dd = 0; dd < q->ndim; dd++) {
            q->n *= q->shape[dd];
            q->ln *= q->len[dd];
        }
        q->full = malloc(sizeof(float) * (size_t)q->n);
        q->fgrad = calloc((size_t)q->n, sizeof(float));
        q->loc = malloc(sizeof(float) * (size_t)(q->ln + 1));
        q->lgrad = calloc((size_t)(q->ln + 1), sizeof(float));
        for (int64_t k = 0; k < q->n; k++) q->full[k] = (float)sin(0.37 * (double)k + i);
        box_copy(q, q->full, q->loc);
        rc = mu_engine_add_param(p, q->name, MU_F32, q->ndim, q->shape, q->full, q->fgrad);
        if (rc) report("plain add_param", 0, mu_engine_error(p));
        rc = mu_engine_add_param_sharded(d, q->name, MU_F32, q->ndim, q->shape, 2, q->pl,
                                         q->ln ? q->loc : NULL, q->lgrad);
        if (rc) report("add_param_sharded", 0, mu_engine_error(d));
    }
    for (int step = 1; step <= 10; step++) {
        for (int i = 0; i < 4; i++) {
            param *q = &ps[i];
            for (int64_t k = 0; k < q->n; k++) q->fgrad[k] = (float)cos(0.11 * (double)k * step + i);
            box_copy(q, q->fgrad, q->lgrad);
        }
        if (mu_engine_step(p) != MU_OK) report("plain step", 0, mu_engine_error(p));
        if (mu_engine_step(d) != MU_OK) report("dist step", 0, mu_engine_error(d));
    }
    int same = 1;
    char detail[200] = "";
    for (int i = 0; i < 4; i++) {
        param *q = &ps[i];
        float *want = malloc(sizeof(float) * (size_t)(q->ln + 1));
        box_copy(q, q->full, want);
        if (q->ln && memcmp(want, q->loc, sizeof(float) * (size_t)q->ln) != 0) {
            same = 0;
            snprintf(detail, sizeof detail, "%s differs", q->name);
        }
        free(want);
    }
    report("c-trainer-bitwise-10-steps", same, same ? NULL : detail);
    /* A C-side argument error on rank 0 only (a NULL path; unknown load
     * flags) fails the call on every rank with rank 0's message: no rank
     * waits in a call the others never make. Then the ranks go on. */
    char path[64];
    int pid = (int)getpid();
    MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);
    snprintf(path, sizeof path, "/tmp/muon-c-engine-%d.safetensors", pid);
    rc = mu_engine_save(d, rank == 0 ? NULL : path);
    report("save-null-path-on-rank-0-fails-everywhere",
           rc == MU_EINVAL && strstr(mu_engine_error(d), "rank 0: mu_engine_save: path is NULL or empty") != NULL,
           mu_engine_error(d));
    rc = mu_engine_load_ex(d, rank == 0 ? path : NULL, 0);
    report("load-null-path-on-rank-1-fails-everywhere",
           rc == MU_EINVAL && strstr(mu_engine_error(d), "rank 1: mu_engine_load: path is NULL or empty") != NULL,
           mu_engine_error(d));
    rc = mu_engine_load_ex(d, path, rank == 0 ? 0x100 : 0);
    report("load-bad-flags-on-rank-0-fails-everywhere",
           rc == MU_EINVAL && strstr(mu_engine_error(d), "unknown flags") != NULL, mu_engine_error(d));
    /* rank 0 saves while the others step: both calls fail on every rank */
    rc = rank == 0 ? mu_engine_save(d, path) : mu_engine_step(d);
    report("save-against-step-fails-everywhere",
           rc == MU_ESTATE && strstr(mu_engine_error(d), "the ranks are not in the same call") != NULL,
           mu_engine_error(d));
    rc = mu_engine_step(d);
    report("step-after-the-mismatch", rc == MU_OK, rc ? mu_engine_error(d) : NULL);
    if (rank == 0) remove(path);
    /* A shard of the wrong size is refused with a message naming it. */
    mu_placement bad[2] = {{MU_REPLICATE, 0}, {MU_SHARD, 5}};
    int64_t shp[2] = {4, 4};
    float buf[16];
    rc = mu_engine_add_param_sharded(d, "late", MU_F32, 2, shp, 2, bad, buf, NULL);
    report("bad-placement-refused", rc != MU_OK && strstr(mu_engine_error(d), "late") != NULL, rc ? mu_engine_error(d) : "accepted");
    mu_engine_close(d);
    mu_engine_close(p);
    for (int i = 0; i < 4; i++) {
        free(ps[i].full);
        free(ps[i].fgrad);
        free(ps[i].loc);
        free(ps[i].lgrad);
    }
    MPI_Comm_free(&mine);
    MPI_Finalize();
    return 0;
}
