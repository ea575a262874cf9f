/*
 * The worker pool (see src/pool.h): a team per call, on threads of our own
 * or on the host's OpenMP runtime.
 *
 * Threads of our own: the caller creates cfg->workers - 1 threads, which
 * start fn at once, and is rank 0 itself; the team's size (how many could
 * be created) is published when the last one has been, and
 * mu__pool_size waits for it (ranks that never ask never wait).
 *
 * OpenMP: GOMP_parallel is the entry point GCC-compiled parallel regions
 * call (libgomp; LLVM's libomp exports it too). It is looked up with dlsym,
 * never linked: a host without OpenMP does not get an OpenMP runtime from
 * us. In a host whose own loops use OpenMP, its threads spin a while after
 * each of its regions; running our team as one of its regions gives them
 * our work instead of leaving them to compete with threads of ours for the
 * cores.
 *
 * Waiting: counters with a short spin, then a sleep on the team's
 * condition variable; a waker broadcasts under the mutex after moving the
 * counter, and a sleeper checks the counter under it, so no wake-up is lost.
 */
#define _GNU_SOURCE /* RTLD_DEFAULT */
#include "pool.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <string.h>

struct mu__pool {
    mu__pool_fn fn;
    void *arg;
    atomic_llong published; /* 1 once size is final */
    atomic_int size;
    atomic_llong bar_count; /* mu__pool_sync: arrivals in this episode */
    atomic_llong bar_gen;   /* episodes completed */
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

typedef struct pool_thread {
    mu__pool *team;
    int rank;
} pool_thread;

int mu__pool_size(const mu__pool *team)
{
    mu__pool *t = (mu__pool *)team; /* waiting does not change the team */
    mu__pool_wait(t, &t->published, 1);
    return atomic_load(&t->size);
}

void mu__pool_wait(mu__pool *team, atomic_llong *counter, int64_t target)
{
    for (int spin = 0; spin < 4096 && atomic_load(counter) < target; spin++) {
    }
    if (atomic_load(counter) >= target) return;
    pthread_mutex_lock(&team->mu);
    while (atomic_load(counter) < target) pthread_cond_wait(&team->cv, &team->mu);
    pthread_mutex_unlock(&team->mu);
}

void mu__pool_wake(mu__pool *team)
{
    pthread_mutex_lock(&team->mu);
    pthread_cond_broadcast(&team->cv);
    pthread_mutex_unlock(&team->mu);
}

/* Episodes never overlap (a rank enters the next one only after all n
 * arrived at this one), so the last arrival can reset the count before it
 * ends the episode. */
void mu__pool_sync(mu__pool *team, int n)
{
    if (n <= 1) return;
    const long long gen = atomic_load(&team->bar_gen);
    if (atomic_fetch_add(&team->bar_count, 1) + 1 == n) {
        atomic_store(&team->bar_count, 0);
        atomic_fetch_add(&team->bar_gen, 1);
        mu__pool_wake(team);
        return;
    }
    mu__pool_wait(team, &team->bar_gen, gen + 1);
}

static void *pool_thread_main(void *p)
{
    pool_thread *th = p;
    th->team->fn(th->team, th->rank, th->team->arg);
    return NULL;
}

/* ---------------------------------------------------------------- OpenMP */

typedef void (*gomp_parallel_fn)(void (*fn)(void *), void *data, unsigned threads,
                                 unsigned flags);
typedef int (*omp_int_fn)(void);

typedef struct pool_omp {
    gomp_parallel_fn parallel;
    omp_int_fn thread_num, num_threads;
} pool_omp;

static int pool_lookup(const char *name, void *fnp, size_t size)
{
    void *sym = dlsym(RTLD_DEFAULT, name);
    memcpy(fnp, &sym, size); /* object pointer -> function pointer */
    return sym != NULL;
}

static int pool_host_openmp(pool_omp *o)
{
    return pool_lookup("GOMP_parallel", &o->parallel, sizeof o->parallel) &&
           pool_lookup("omp_get_thread_num", &o->thread_num, sizeof o->thread_num) &&
           pool_lookup("omp_get_num_threads", &o->num_threads, sizeof o->num_threads);
}

typedef struct pool_omp_run {
    mu__pool *team;
    pool_omp omp;
} pool_omp_run;

/* A thread of the host's team: its size is known to every thread at once. */
static void pool_omp_main(void *p)
{
    pool_omp_run *r = p;
    const int rank = r->omp.thread_num(), size = r->omp.num_threads();
    if (rank >= size) return; /* not reached */
    atomic_store(&r->team->size, size);
    atomic_store(&r->team->published, 1);
    r->team->fn(r->team, rank, r->team->arg);
}

/* ------------------------------------------------------------------- run */

int mu__pool_run(const mu__pool_cfg *cfg, mu__pool_fn fn, void *arg)
{
    int want = cfg->workers < 1 ? 1 : cfg->workers;
    if (want > MU__POOL_MAX) want = MU__POOL_MAX;
    mu__pool team = {.fn = fn, .arg = arg};
    atomic_init(&team.published, 0);
    atomic_init(&team.size, 1);
    atomic_init(&team.bar_count, 0);
    atomic_init(&team.bar_gen, 0);
    int ok = pthread_mutex_init(&team.mu, NULL) == 0;
    if (ok && pthread_cond_init(&team.cv, NULL) != 0) {
        pthread_mutex_destroy(&team.mu);
        ok = 0;
    }
    if (!ok) want = 1; /* no way to wait: one worker, which never has to */
    if (want == 1) {
        atomic_store(&team.published, 1);
        fn(&team, 0, arg);
        if (ok) {
            pthread_cond_destroy(&team.cv);
            pthread_mutex_destroy(&team.mu);
        }
        return 1;
    }
    pool_omp_run omp = {.team = &team};
    int size = 1;
    if (cfg->openmp && pool_host_openmp(&omp.omp)) {
        omp.omp.parallel(pool_omp_main, &omp, (unsigned)want, 0);
        size = atomic_load(&team.size);
    } else {
        pool_thread th[MU__POOL_MAX];
        pthread_t tid[MU__POOL_MAX];
        pthread_attr_t attr;
        const int attr_ok = cfg->stack > 0 && pthread_attr_init(&attr) == 0;
        if (attr_ok) pthread_attr_setstacksize(&attr, cfg->stack);
        int use_attr = attr_ok;
        for (int t = 1; t < want; t++) {
            th[t] = (pool_thread){&team, t};
            int rc = pthread_create(&tid[t], use_attr ? &attr : NULL, pool_thread_main, &th[t]);
            if (rc == EINVAL && use_attr) { /* the stack cannot hold the process's static TLS */
                use_attr = 0;
                rc = pthread_create(&tid[t], NULL, pool_thread_main, &th[t]);
            }
            if (rc != 0) break;
            size = t + 1;
        }
        if (attr_ok) pthread_attr_destroy(&attr);
        atomic_store(&team.size, size);
        atomic_store(&team.published, 1);
        mu__pool_wake(&team);
        fn(&team, 0, arg);
        for (int t = 1; t < size; t++) pthread_join(tid[t], NULL);
    }
    pthread_cond_destroy(&team.cv);
    pthread_mutex_destroy(&team.mu);
    return size;
}
