/*
 * The worker pool (src/pool.h): team sizes, every rank once, barriers of
 * the whole team and of a part of it, waiting on a counter. TAP output.
 */
#include "pool.h"
#include "tap.h"

#include <stdio.h>
#include <string.h>

enum { ROUNDS = 200 };

typedef struct state {
    atomic_int calls[MU__POOL_MAX];
    atomic_int seen_size[MU__POOL_MAX];
    int phase[MU__POOL_MAX]; /* written by its rank, read by all after a barrier */
    atomic_int bad_sync, bad_sub;
    atomic_llong counter;
    atomic_int bad_wait;
} state;

static void work(mu__pool *team, int rank, void *arg)
{
    state *s = arg;
    atomic_fetch_add(&s->calls[rank], 1);
    const int size = mu__pool_size(team);
    atomic_store(&s->seen_size[rank], size);
    for (int r = 1; r <= ROUNDS; r++) { /* everyone sees every round's writes */
        s->phase[rank] = r;
        mu__pool_sync(team, size);
        for (int k = 0; k < size; k++)
            if (s->phase[k] != r) atomic_store(&s->bad_sync, 1);
        mu__pool_sync(team, size);
    }
    /* rank 0 publishes a counter step by step; the others wait for each */
    for (int64_t v = 1; v <= ROUNDS; v++) {
        if (rank == 0) {
            atomic_store(&s->counter, v);
            mu__pool_wake(team);
        } else {
            mu__pool_wait(team, &s->counter, v);
            if (atomic_load(&s->counter) < v) atomic_store(&s->bad_wait, 1);
        }
    }
    const int sub = size < 2 ? size : 2;
    if (rank >= sub) return; /* the rest leave; a part keeps syncing */
    for (int r = ROUNDS + 1; r <= 2 * ROUNDS; r++) {
        s->phase[rank] = r;
        mu__pool_sync(team, sub);
        for (int k = 0; k < sub; k++)
            if (s->phase[k] != r) atomic_store(&s->bad_sub, 1);
        mu__pool_sync(team, sub);
    }
}

int main(void)
{
    const int wants[] = {0, 1, 2, 3, 4, MU__POOL_MAX + 5};
    for (unsigned w = 0; w < sizeof wants / sizeof wants[0]; w++) {
        const int want = wants[w];
        const int expect = want < 1 ? 1 : want > MU__POOL_MAX ? MU__POOL_MAX : want;
        for (int stack = 0; stack <= 1; stack++) {
            state s;
            memset(&s, 0, sizeof s);
            const mu__pool_cfg cfg = {.workers = want, .openmp = 1, .stack = stack ? 1 << 16 : 0};
            const int size = mu__pool_run(&cfg, work, &s);
            int once = 1, sizes = 1;
            for (int r = 0; r < MU__POOL_MAX; r++) {
                if (atomic_load(&s.calls[r]) != (r < size)) once = 0;
                if (r < size && atomic_load(&s.seen_size[r]) != size) sizes = 0;
            }
            ok(size == expect, "workers %d: a team of %d (got %d)", want, expect, size);
            ok(once && sizes, "workers %d: ranks 0..%d ran once, each saw the size", want,
               size - 1);
            ok(!atomic_load(&s.bad_sync) && !atomic_load(&s.bad_sub),
               "workers %d, stack %s: %d barriers of the team, then %d of ranks 0..%d", want,
               stack ? "64 KiB" : "default", 2 * ROUNDS, 2 * ROUNDS, size < 2 ? 0 : 1);
            ok(!atomic_load(&s.bad_wait), "workers %d: waits on a counter", want);
        }
    }
    printf("1..%d\n", n_test);
    return n_fail ? 1 : 0;
}
