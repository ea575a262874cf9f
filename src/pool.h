/*
 * One worker pool for the C core's parallel work (src/pool.c): Newton-Schulz
 * (src/ns.c, src/ns_gram.c, src/ns_bf16.c) and the fused multi-tensor ops.
 *
 * A call runs one function on a team of workers and returns when all of
 * them have returned. There is nothing to create or free and no state
 * outside the call: the team lives on the caller's stack, its threads are
 * made per call (or borrowed, see MU__POOL_OPENMP) and joined before
 * mu__pool_run returns.
 *
 * What a worker may rely on:
 * - The team's size is fixed before any worker starts: 1 <= size <=
 *   cfg->workers (fewer when a thread cannot be created or the host's
 *   OpenMP runtime gives a smaller team, e.g. inside one of its parallel
 *   regions). Ranks 0 .. size-1 each run fn exactly once, concurrently, so
 *   they may wait for each other (mu__pool_sync, mu__pool_wait).
 * - With threads of our own the caller is rank 0; in an OpenMP team, the
 *   team's master (thread 0) is, which is the caller too.
 * Results must never depend on the size (the callers' tile plans are fixed
 * by shapes only; the team only decides who runs a tile, and when).
 *
 *     static void work(mu__pool *team, int rank, void *arg) { ... }
 *     mu__pool_cfg cfg = {.workers = 2, .openmp = 1};
 *     int ran = mu__pool_run(&cfg, work, &state);
 */
#ifndef MU_POOL_H
#define MU_POOL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

enum { MU__POOL_MAX = 16 }; /* most workers in a team */

typedef struct mu__pool mu__pool; /* a running team (opaque to workers) */

typedef void (*mu__pool_fn)(mu__pool *team, int rank, void *arg);

typedef struct mu__pool_cfg {
    int workers;  /* wanted team size, clamped to [1, MU__POOL_MAX] */
    int openmp;   /* 1: when the process has an OpenMP runtime (GOMP_parallel,
                   * looked up at run time, never linked), the team is one of
                   * its parallel regions, so a host's OpenMP threads run our
                   * work instead of competing with threads of ours */
    size_t stack; /* stack bytes of threads of our own; 0: the system default.
                   * A hint: where it is too small for the process's static
                   * TLS (pthread_create: EINVAL, e.g. 64 KiB in a host
                   * linking OpenBLAS and Open MPI), the default is used */
} mu__pool_cfg;

/* Run fn(team, rank, arg) on every rank of a team of at most cfg->workers;
 * returns the team's size (>= 1; with 1, fn runs on the calling thread). */
int mu__pool_run(const mu__pool_cfg *cfg, mu__pool_fn fn, void *arg);

/* The team's size (the same for every rank, for the whole call). */
int mu__pool_size(const mu__pool *team);

/* Barrier of ranks 0 .. n-1 (1 <= n <= size): returns once all n have
 * called it. Every one of them passes the same n; ranks >= n never call it
 * while such a barrier is in progress. */
void mu__pool_sync(mu__pool *team, int n);

/* Wait until *counter >= target: a short spin (workers usually arrive
 * within microseconds of each other), then sleep until mu__pool_wake. */
void mu__pool_wait(mu__pool *team, atomic_llong *counter, int64_t target);

/* Wake the workers sleeping in mu__pool_wait (call it after the counter
 * they wait for has moved; cheap enough to call once per stage, not per
 * element). */
void mu__pool_wake(mu__pool *team);

#endif
