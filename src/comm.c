/*
 * comm.c -- collectives for distributed (HSDP) steps.
 *
 * A mu_comm wraps an MPI communicator (a private duplicate, so our traffic
 * never mixes with the caller's) and counts, per handle, the calls made, the
 * payload bytes sent to and received from OTHER ranks (logical volume: what
 * the operation semantically moves between ranks, not the wire traffic of
 * the algorithm MPI picks; self-to-self copies count nothing) and the wall
 * time spent inside the calls.
 *
 * Without MPI (MU_HAVE_MPI undefined) the same API works as a single-process
 * backend: every communicator has size 1 and collectives are local copies.
 *
 * Global state: exactly two flags, both about the MPI library itself, which
 * is a process-wide singleton: whether this library called MPI_Init_thread
 * (so that mu_comm_finalize finalizes only what we initialized) and whether
 * mu_comm_finalize already ran (so it finalizes once). They are atomics.
 */
#include "muon_internal.h"

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef MU_HAVE_MPI
#include <mpi.h>
#endif

/* Background progress: Open MPI moves a non-blocking collective only
 * inside MPI calls, so while the caller computes (Newton-Schulz in C) a
 * per-communicator thread tests its pending requests every
 * MU__PROGRESS_NS nanoseconds (sleeping in between, which matters when
 * ranks share cores). Only when MPI runs with MPI_THREAD_MULTIPLE; the
 * thread starts with the first pending request and sleeps on a condition
 * variable while nothing is pending. */
#define MU__PROGRESS_NS 200000L

typedef struct mu__progress {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int started, stop;
    mu_comm_request *head; /* pending requests the thread tests */
} mu__progress;

struct mu_comm {
#ifdef MU_HAVE_MPI
    MPI_Comm comm;
    int multiple;          /* MPI provides MPI_THREAD_MULTIPLE: background progress */
    mu__progress *prog;    /* allocated with the first non-blocking call */
#endif
    int rank;
    int size;
    mu_comm_stats stats;
};

struct mu_comm_request {
    mu_comm *c;
#ifdef MU_HAVE_MPI
    MPI_Request req;
    int *ibuf; /* count/displacement arrays that must live until the wait */
    mu_comm_request *next; /* in c->prog's pending list */
    int listed, done, err; /* under c->prog->mu */
#endif
    int64_t sent, recv;
    double t0;     /* when it was posted */
    double post_s; /* seconds the post took */
};

#ifdef MU_HAVE_MPI
static atomic_int mu__we_initialized = 0; /* this library called MPI_Init_thread */
#endif
static atomic_int mu__finalized = 0; /* mu_comm_finalize ran */

static double mu__now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void mu__account(mu_comm *c, int64_t sent, int64_t recv, double t0) {
    c->stats.calls++;
    c->stats.bytes_sent += sent;
    c->stats.bytes_recv += recv;
    c->stats.seconds += mu__now() - t0;
}

/* A completed non-blocking call: its volume, the time the caller spent
 * waiting (t0: when the wait began), and whether it was already done. */
static void mu__account_nb(mu_comm *c, int64_t sent, int64_t recv, double t0, int done_before) {
    c->stats.nonblocking++;
    c->stats.done_before_wait += done_before;
    mu__account(c, sent, recv, t0);
}

/* The moves (all-to-all, gather, broadcast) carry any dtype's elements;
 * bfloat16 ones travel as 16-bit words. */
static int mu__esize(int dtype, size_t *es) {
    if (!mu_dtype_size(dtype))
        return mu__fail(MU_EDTYPE, "comm: dtype %d is not MU_F32, MU_F64 or MU_BF16", dtype);
    *es = mu_dtype_size(dtype);
    return MU_OK;
}

#ifdef MU_HAVE_MPI
static MPI_Datatype mu__mpi_type(int dtype)
{
    return dtype == MU_F64 ? MPI_DOUBLE : dtype == MU_BF16 ? MPI_UINT16_T : MPI_FLOAT;
}

static int mu__mpi_fail(int err, const char *what) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(err, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "code %d", err);
    return mu__fail(MU_ECOMM, "%s failed: %s", what, msg);
}

static int mu__ensure_init(void) {
    int inited = 0, fin = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&fin);
    if (fin) return mu__fail(MU_ESTATE, "comm: MPI was already finalized");
    if (!inited) {
        int provided = 0;
        int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
        if (rc != MPI_SUCCESS) return mu__mpi_fail(rc, "MPI_Init_thread");
        atomic_store(&mu__we_initialized, 1);
    }
    return MU_OK;
}

static int mu__thread_multiple(void) {
    int level = MPI_THREAD_SINGLE;
    return MPI_Query_thread(&level) == MPI_SUCCESS && level == MPI_THREAD_MULTIPLE;
}

/* Wait for a request without spinning: test, then sleep between tests
 * (5 us growing to MU__PROGRESS_NS). MPI_Wait spins (yield_when_idle only
 * yields), which takes the core from the ranks still computing when ranks
 * share cores; a sleeping waiter gives it back. */
static int mu__wait_idle(MPI_Request *req) {
    long nap = 5000;
    for (;;) {
        int flag = 0;
        int e = MPI_Test(req, &flag, MPI_STATUS_IGNORE);
        if (e != MPI_SUCCESS || flag) return e;
        struct timespec ts = { 0, nap };
        nanosleep(&ts, NULL);
        if (nap < MU__PROGRESS_NS) nap *= 2;
    }
}

/* A blocking collective as its non-blocking form (e: what posting
 * returned) completed by mu__wait_idle. */
static int mu__idle(int e, MPI_Request *rq) { return e == MPI_SUCCESS ? mu__wait_idle(rq) : e; }

/* The progress thread: tests the pending requests, drops completed ones
 * from the list (the caller's wait then finds them done). */
static void *mu__progress_main(void *arg) {
    mu__progress *p = arg;
    pthread_mutex_lock(&p->mu);
    while (!p->stop) {
        if (!p->head) {
            pthread_cond_wait(&p->cv, &p->mu);
            continue;
        }
        mu_comm_request **link = &p->head;
        while (*link) {
            mu_comm_request *q = *link;
            int flag = 0;
            int e = MPI_Test(&q->req, &flag, MPI_STATUS_IGNORE);
            if (e != MPI_SUCCESS || flag) {
                q->err = e != MPI_SUCCESS ? e : 0;
                q->done = 1;
                q->listed = 0;
                *link = q->next;
            } else {
                link = &q->next;
            }
        }
        pthread_mutex_unlock(&p->mu);
        struct timespec ts = { 0, MU__PROGRESS_NS };
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* Hand a posted request to c's progress thread (started on first use).
 * Without MPI_THREAD_MULTIPLE, or if the thread cannot start, the request
 * progresses in the caller's MPI calls only (still correct). */
static void mu__progress_add(mu_comm *c, mu_comm_request *q) {
    if (!c->multiple) return;
    if (!c->prog) {
        mu__progress *p = calloc(1, sizeof *p);
        if (!p) return;
        pthread_mutex_init(&p->mu, NULL);
        pthread_cond_init(&p->cv, NULL);
        c->prog = p;
    }
    mu__progress *p = c->prog;
    pthread_mutex_lock(&p->mu);
    if (!p->started) p->started = pthread_create(&p->thread, NULL, mu__progress_main, p) == 0 ? 1 : -1;
    if (p->started == 1) {
        q->next = p->head;
        p->head = q;
        q->listed = 1;
        pthread_cond_signal(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
}

/* Take q back from the progress thread (a no-op when it has none). */
static void mu__progress_take(mu_comm_request *q) {
    mu__progress *p = q->c->prog;
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    if (q->listed) {
        for (mu_comm_request **link = &p->head; *link; link = &(*link)->next) {
            if (*link == q) {
                *link = q->next;
                break;
            }
        }
        q->listed = 0;
    }
    pthread_mutex_unlock(&p->mu);
}

static void mu__progress_free(mu__progress *p) {
    if (!p) return;
    if (p->started == 1) {
        pthread_mutex_lock(&p->mu);
        p->stop = 1;
        pthread_cond_signal(&p->cv);
        pthread_mutex_unlock(&p->mu);
        pthread_join(p->thread, NULL);
    }
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p);
}

static int mu__wrap(MPI_Comm src, mu_comm **out) {
    mu_comm *c = calloc(1, sizeof *c);
    if (!c) return mu__fail(MU_ENOMEM, "comm: out of memory");
    int rc = MPI_Comm_dup(src, &c->comm);
    if (rc != MPI_SUCCESS) {
        free(c);
        return mu__mpi_fail(rc, "MPI_Comm_dup");
    }
    MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(c->comm, &c->rank);
    MPI_Comm_size(c->comm, &c->size);
    c->multiple = mu__thread_multiple();
    *out = c;
    return MU_OK;
}

/* Per-peer int arrays from int64 counts, refusing what MPI's int cannot hold. */
static int mu__to_int(int n, const int64_t *src, int *dst, const char *what) {
    for (int i = 0; i < n; i++) {
        if (src[i] < 0 || src[i] > INT_MAX)
            return mu__fail(MU_EINVAL, "comm: %s[%d] = %lld is negative or exceeds INT_MAX", what, i,
                            (long long)src[i]);
        dst[i] = (int)src[i];
    }
    return MU_OK;
}
#endif

static mu_comm *mu__new_single(void) {
    mu_comm *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->rank = 0;
    c->size = 1;
#ifdef MU_HAVE_MPI
    c->comm = MPI_COMM_NULL;
#endif
    return c;
}

MU_API int mu_comm_have_mpi(void) {
#ifdef MU_HAVE_MPI
    return 1;
#else
    return 0;
#endif
}

MU_API int mu_comm_world(mu_comm **out) {
    if (!out) return mu__fail(MU_EINVAL, "mu_comm_world: out is NULL");
    *out = NULL;
#ifdef MU_HAVE_MPI
    int rc = mu__ensure_init();
    if (rc) return rc;
    return mu__wrap(MPI_COMM_WORLD, out);
#else
    mu_comm *c = mu__new_single();
    if (!c) return mu__fail(MU_ENOMEM, "mu_comm_world: out of memory");
    *out = c;
    return MU_OK;
#endif
}

MU_API int mu_comm_self(mu_comm **out) {
    if (!out) return mu__fail(MU_EINVAL, "mu_comm_self: out is NULL");
    *out = NULL;
    mu_comm *c = mu__new_single();
    if (!c) return mu__fail(MU_ENOMEM, "mu_comm_self: out of memory");
    *out = c;
    return MU_OK;
}

MU_API int mu_comm_from_handle(void *mpi_comm_ptr, mu_comm **out) {
    if (!out) return mu__fail(MU_EINVAL, "mu_comm_from_handle: out is NULL");
    *out = NULL;
    if (!mpi_comm_ptr) return mu__fail(MU_EINVAL, "mu_comm_from_handle: mpi_comm_ptr is NULL");
#ifdef MU_HAVE_MPI
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited)
        return mu__fail(MU_ESTATE, "mu_comm_from_handle: MPI is not initialized by the caller");
    return mu__wrap(*(MPI_Comm *)mpi_comm_ptr, out);
#else
    return mu__fail(MU_ESTATE, "mu_comm_from_handle: libmuon was built without MPI");
#endif
}

MU_API int mu_comm_split(mu_comm *c, int color, int key, mu_comm **out) {
    if (!out) return mu__fail(MU_EINVAL, "mu_comm_split: out is NULL");
    *out = NULL;
    if (!c) return mu__fail(MU_EINVAL, "mu_comm_split: comm is NULL");
    if (color < 0) return mu__fail(MU_EINVAL, "mu_comm_split: color %d is negative", color);
    double t0 = mu__now();
#ifdef MU_HAVE_MPI
    if (c->comm != MPI_COMM_NULL) {
        MPI_Comm nc;
        int rc = MPI_Comm_split(c->comm, color, key, &nc);
        if (rc != MPI_SUCCESS) return mu__mpi_fail(rc, "MPI_Comm_split");
        mu_comm *r = calloc(1, sizeof *r);
        if (!r) {
            MPI_Comm_free(&nc);
            return mu__fail(MU_ENOMEM, "mu_comm_split: out of memory");
        }
        r->comm = nc;
        MPI_Comm_set_errhandler(nc, MPI_ERRORS_RETURN);
        MPI_Comm_rank(nc, &r->rank);
        MPI_Comm_size(nc, &r->size);
        r->multiple = c->multiple;
        mu__account(c, 0, 0, t0);
        *out = r;
        return MU_OK;
    }
#endif
    MU__UNUSED(key);
    mu_comm *r = mu__new_single();
    if (!r) return mu__fail(MU_ENOMEM, "mu_comm_split: out of memory");
    mu__account(c, 0, 0, t0);
    *out = r;
    return MU_OK;
}

MU_API void mu_comm_free(mu_comm *c) {
    if (!c) return;
#ifdef MU_HAVE_MPI
    mu__progress_free(c->prog);
    if (c->comm != MPI_COMM_NULL) {
        int fin = 0;
        MPI_Finalized(&fin);
        if (!fin) MPI_Comm_free(&c->comm);
    }
#endif
    free(c);
}

MU_API int mu_comm_rank(const mu_comm *c) { return c ? c->rank : -1; }
MU_API int mu_comm_size(const mu_comm *c) { return c ? c->size : -1; }

MU_API int mu_comm_get_stats(const mu_comm *c, mu_comm_stats *out) {
    if (!c || !out) return mu__fail(MU_EINVAL, "mu_comm_get_stats: comm or out is NULL");
    *out = c->stats;
    return MU_OK;
}

MU_API void mu_comm_reset_stats(mu_comm *c) {
    if (c) memset(&c->stats, 0, sizeof c->stats);
}

/* Argument checks shared by the blocking and non-blocking all-to-all-v:
 * element size, and the elements this rank sends to / receives from others. */
static int check_alltoallv(const mu_comm *c, int dtype, const void *sendbuf,
                           const int64_t *sendcounts, const int64_t *sdispls, const void *recvbuf,
                           const int64_t *recvcounts, const int64_t *rdispls, const char *who,
                           size_t *es, int64_t *sent, int64_t *recv) {
    if (!c) return mu__fail(MU_EINVAL, "%s: comm is NULL", who);
    int rc = mu__esize(dtype, es);
    if (rc) return rc;
    if (!sendcounts || !sdispls || !recvcounts || !rdispls)
        return mu__fail(MU_EINVAL, "%s: counts/displacements are NULL", who);
    int64_t all_sent = 0, all_recv = 0, end;
    *sent = *recv = 0;
    for (int i = 0; i < c->size; i++) {
        if (sendcounts[i] < 0 || recvcounts[i] < 0 || sdispls[i] < 0 || rdispls[i] < 0)
            return mu__fail(MU_EINVAL, "%s: negative count or displacement for peer %d", who, i);
        /* byte ends of every block must be representable (checked arithmetic) */
        if (mu__add_i64(sdispls[i], sendcounts[i], &end) ||
            mu__mul_i64(end, (int64_t)*es, &end) ||
            mu__add_i64(rdispls[i], recvcounts[i], &end) ||
            mu__mul_i64(end, (int64_t)*es, &end) ||
            mu__add_i64(all_sent, sendcounts[i], &all_sent) ||
            mu__add_i64(all_recv, recvcounts[i], &all_recv))
            return mu__fail(MU_EINVAL, "%s: counts or displacements overflow for peer %d", who, i);
        if (i != c->rank) {
            *sent += sendcounts[i];
            *recv += recvcounts[i];
        }
    }
    if ((all_sent > 0 && !sendbuf) || (all_recv > 0 && !recvbuf))
        return mu__fail(MU_EINVAL, "%s: sendbuf or recvbuf is NULL", who);
    return MU_OK;
}

MU_API int mu_comm_alltoallv(mu_comm *c, int dtype, const void *sendbuf, const int64_t *sendcounts,
                             const int64_t *sdispls, void *recvbuf, const int64_t *recvcounts,
                             const int64_t *rdispls) {
    size_t es = 0;
    int64_t sent, recv;
    int rc = check_alltoallv(c, dtype, sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls,
                             "mu_comm_alltoallv", &es, &sent, &recv);
    if (rc) return rc;
    double t0 = mu__now();
#ifdef MU_HAVE_MPI
    if (c->size > 1) {
        int n = c->size;
        int *ib = malloc(sizeof(int) * 4 * (size_t)n);
        if (!ib) return mu__fail(MU_ENOMEM, "mu_comm_alltoallv: out of memory");
        if ((rc = mu__to_int(n, sendcounts, ib, "sendcounts")) ||
            (rc = mu__to_int(n, sdispls, ib + n, "sdispls")) ||
            (rc = mu__to_int(n, recvcounts, ib + 2 * n, "recvcounts")) ||
            (rc = mu__to_int(n, rdispls, ib + 3 * n, "rdispls"))) {
            free(ib);
            return rc;
        }
        MPI_Datatype t = mu__mpi_type(dtype);
        MPI_Request rq;
        int e = mu__idle(MPI_Ialltoallv(sendbuf, ib, ib + n, t, recvbuf, ib + 2 * n, ib + 3 * n, t, c->comm, &rq), &rq);
        free(ib);
        if (e != MPI_SUCCESS) return mu__mpi_fail(e, "MPI_Alltoallv");
        mu__account(c, sent * (int64_t)es, recv * (int64_t)es, t0);
        return MU_OK;
    }
#endif
    if (sendcounts[0] != recvcounts[0])
        return mu__fail(MU_ESHAPE, "mu_comm_alltoallv: sendcounts[0] = %lld but recvcounts[0] = %lld",
                        (long long)sendcounts[0], (long long)recvcounts[0]);
    if (sendcounts[0] > 0)
        memmove((char *)recvbuf + rdispls[0] * (int64_t)es, (const char *)sendbuf + sdispls[0] * (int64_t)es,
                (size_t)sendcounts[0] * es);
    mu__account(c, 0, 0, t0);
    return MU_OK;
}

MU_API int mu_comm_allgatherv(mu_comm *c, int dtype, const void *sendbuf, int64_t sendcount,
                              void *recvbuf, const int64_t *recvcounts, const int64_t *displs) {
    size_t es = 0;
    if (!c) return mu__fail(MU_EINVAL, "mu_comm_allgatherv: comm is NULL");
    int rc = mu__esize(dtype, &es);
    if (rc) return rc;
    if (!recvcounts || !displs) return mu__fail(MU_EINVAL, "mu_comm_allgatherv: counts/displs are NULL");
    if (sendcount != recvcounts[c->rank])
        return mu__fail(MU_ESHAPE, "mu_comm_allgatherv: sendcount %lld != recvcounts[%d] = %lld",
                        (long long)sendcount, c->rank, (long long)recvcounts[c->rank]);
    double t0 = mu__now();
    int64_t recv = 0, all = 0, end;
    for (int i = 0; i < c->size; i++) {
        if (recvcounts[i] < 0 || displs[i] < 0)
            return mu__fail(MU_EINVAL, "mu_comm_allgatherv: negative count or displacement for peer %d", i);
        if (mu__add_i64(displs[i], recvcounts[i], &end) ||
            mu__mul_i64(end, (int64_t)es, &end) || mu__add_i64(all, recvcounts[i], &all))
            return mu__fail(MU_EINVAL, "mu_comm_allgatherv: counts or displacements overflow for peer %d", i);
        if (i != c->rank) recv += recvcounts[i];
    }
    if ((sendcount > 0 && !sendbuf) || (all > 0 && !recvbuf))
        return mu__fail(MU_EINVAL, "mu_comm_allgatherv: sendbuf or recvbuf is NULL");
#ifdef MU_HAVE_MPI
    if (c->size > 1) {
        int n = c->size, sc = 0;
        int *ib = malloc(sizeof(int) * 2 * (size_t)n);
        if (!ib) return mu__fail(MU_ENOMEM, "mu_comm_allgatherv: out of memory");
        if ((rc = mu__to_int(n, recvcounts, ib, "recvcounts")) || (rc = mu__to_int(n, displs, ib + n, "displs")) ||
            (rc = mu__to_int(1, &sendcount, &sc, "sendcount"))) {
            free(ib);
            return rc;
        }
        MPI_Datatype t = mu__mpi_type(dtype);
        MPI_Request rq;
        int e = mu__idle(MPI_Iallgatherv(sendbuf, sc, t, recvbuf, ib, ib + n, t, c->comm, &rq), &rq);
        free(ib);
        if (e != MPI_SUCCESS) return mu__mpi_fail(e, "MPI_Allgatherv");
        mu__account(c, sendcount * (int64_t)es * (c->size - 1), recv * (int64_t)es, t0);
        return MU_OK;
    }
#endif
    if (sendcount > 0)
        memmove((char *)recvbuf + displs[0] * (int64_t)es, sendbuf, (size_t)sendcount * es);
    mu__account(c, 0, 0, t0);
    return MU_OK;
}

static int mu__bcast_check(mu_comm *c, const void *buf, int64_t n, int root, const char *what) {
    if (!c) return mu__fail(MU_EINVAL, "%s: comm is NULL", what);
    if (!buf && n != 0) return mu__fail(MU_EINVAL, "%s: buf is NULL", what);
    if (root < 0 || root >= c->size)
        return mu__fail(MU_EINVAL, "%s: root %d outside [0, %d)", what, root, c->size);
    if (n < 0 || n > INT_MAX) return mu__fail(MU_EINVAL, "%s: count %lld out of range", what, (long long)n);
    return MU_OK;
}

static void mu__bcast_volume(const mu_comm *c, int64_t nbytes, int root, int64_t *sent, int64_t *recv) {
    *sent = c->rank == root ? nbytes * (c->size - 1) : 0;
    *recv = c->rank == root ? 0 : nbytes;
}

MU_API int mu_comm_bcast_bytes(mu_comm *c, void *buf, int64_t nbytes, int root) {
    int rc = mu__bcast_check(c, buf, nbytes, root, "mu_comm_bcast_bytes");
    if (rc) return rc;
    double t0 = mu__now();
    int64_t s, r;
    mu__bcast_volume(c, nbytes, root, &s, &r);
#ifdef MU_HAVE_MPI
    if (c->size > 1) {
        MPI_Request rq;
        int e = mu__idle(MPI_Ibcast(buf, (int)nbytes, MPI_BYTE, root, c->comm, &rq), &rq);
        if (e != MPI_SUCCESS) return mu__mpi_fail(e, "MPI_Bcast");
    }
#else
    MU__UNUSED(buf);
#endif
    mu__account(c, s, r, t0);
    return MU_OK;
}

MU_API int mu_comm_bcast(mu_comm *c, int dtype, void *buf, int64_t n, int root) {
    size_t es = 0;
    int rc = mu__esize(dtype, &es);
    if (rc) return rc;
    if ((rc = mu__bcast_check(c, buf, n, root, "mu_comm_bcast"))) return rc;
    double t0 = mu__now();
    int64_t s, r;
    mu__bcast_volume(c, n * (int64_t)es, root, &s, &r);
#ifdef MU_HAVE_MPI
    if (c->size > 1) {
        MPI_Request rq;
        int e = mu__idle(MPI_Ibcast(buf, (int)n, mu__mpi_type(dtype), root, c->comm, &rq), &rq);
        if (e != MPI_SUCCESS) return mu__mpi_fail(e, "MPI_Bcast");
    }
#else
    MU__UNUSED(buf);
#endif
    mu__account(c, s, r, t0);
    return MU_OK;
}

MU_API int mu_comm_ibcast(mu_comm *c, int dtype, void *buf, int64_t n, int root, mu_comm_request **out) {
    size_t es = 0;
    if (!out) return mu__fail(MU_EINVAL, "mu_comm_ibcast: out is NULL");
    *out = NULL;
    int rc = mu__esize(dtype, &es);
    if (rc) return rc;
    if ((rc = mu__bcast_check(c, buf, n, root, "mu_comm_ibcast"))) return rc;
    mu_comm_request *q = calloc(1, sizeof *q);
    if (!q) return mu__fail(MU_ENOMEM, "mu_comm_ibcast: out of memory");
    q->c = c;
    q->t0 = mu__now();
    mu__bcast_volume(c, n * (int64_t)es, root, &q->sent, &q->recv);
#ifdef MU_HAVE_MPI
    q->req = MPI_REQUEST_NULL;
    if (c->size > 1) {
        int e = MPI_Ibcast(buf, (int)n, mu__mpi_type(dtype), root, c->comm, &q->req);
        if (e != MPI_SUCCESS) {
            free(q);
            return mu__mpi_fail(e, "MPI_Ibcast");
        }
    }
    q->post_s = mu__now() - q->t0;
    if (q->req != MPI_REQUEST_NULL) mu__progress_add(c, q);
#else
    MU__UNUSED(buf);
#endif
    *out = q;
    return MU_OK;
}

MU_API int mu_comm_ialltoallv(mu_comm *c, int dtype, const void *sendbuf, const int64_t *sendcounts,
                              const int64_t *sdispls, void *recvbuf, const int64_t *recvcounts,
                              const int64_t *rdispls, mu_comm_request **out) {
    size_t es = 0;
    if (!out) return mu__fail(MU_EINVAL, "mu_comm_ialltoallv: out is NULL");
    *out = NULL;
    int64_t sent, recv;
    int rc = check_alltoallv(c, dtype, sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls,
                             "mu_comm_ialltoallv", &es, &sent, &recv);
    if (rc) return rc;
    mu_comm_request *q = calloc(1, sizeof *q);
    if (!q) return mu__fail(MU_ENOMEM, "mu_comm_ialltoallv: out of memory");
    q->c = c;
    q->t0 = mu__now();
    q->sent = sent * (int64_t)es;
    q->recv = recv * (int64_t)es;
#ifdef MU_HAVE_MPI
    q->req = MPI_REQUEST_NULL;
    if (c->size > 1) {
        int n = c->size;
        q->ibuf = malloc(sizeof(int) * 4 * (size_t)n);
        if (!q->ibuf) {
            free(q);
            return mu__fail(MU_ENOMEM, "mu_comm_ialltoallv: out of memory");
        }
        int *ib = q->ibuf;
        if ((rc = mu__to_int(n, sendcounts, ib, "sendcounts")) || (rc = mu__to_int(n, sdispls, ib + n, "sdispls")) ||
            (rc = mu__to_int(n, recvcounts, ib + 2 * n, "recvcounts")) ||
            (rc = mu__to_int(n, rdispls, ib + 3 * n, "rdispls"))) {
            free(q->ibuf);
            free(q);
            return rc;
        }
        MPI_Datatype t = mu__mpi_type(dtype);
        int e = MPI_Ialltoallv(sendbuf, ib, ib + n, t, recvbuf, ib + 2 * n, ib + 3 * n, t, c->comm, &q->req);
        if (e != MPI_SUCCESS) {
            free(q->ibuf);
            free(q);
            return mu__mpi_fail(e, "MPI_Ialltoallv");
        }
        q->post_s = mu__now() - q->t0;
        mu__progress_add(c, q);
        *out = q;
        return MU_OK;
    }
#endif
    if (sendcounts[0] != recvcounts[0]) {
        free(q);
        return mu__fail(MU_ESHAPE, "mu_comm_ialltoallv: sendcounts[0] = %lld but recvcounts[0] = %lld",
                        (long long)sendcounts[0], (long long)recvcounts[0]);
    }
    if (sendcounts[0] > 0)
        memmove((char *)recvbuf + rdispls[0] * (int64_t)es, (const char *)sendbuf + sdispls[0] * (int64_t)es,
                (size_t)sendcounts[0] * es);
    *out = q;
    return MU_OK;
}

/* Counts the seconds the post took plus the seconds spent waiting here
 * (time hidden behind the caller's work is not communication time). */
MU_API int mu_comm_wait(mu_comm_request *q) {
    if (!q) return MU_OK;
    int rc = MU_OK, done_before = 1;
    double t0 = mu__now();
#ifdef MU_HAVE_MPI
    mu__progress_take(q); /* completed there: q->req is MPI_REQUEST_NULL */
    if (q->err) rc = mu__mpi_fail(q->err, "MPI_Test");
    else if (q->req != MPI_REQUEST_NULL) {
        int flag = 0;
        int e = MPI_Test(&q->req, &flag, MPI_STATUS_IGNORE);
        done_before = flag;
        if (e == MPI_SUCCESS && !flag) e = mu__wait_idle(&q->req);
        if (e != MPI_SUCCESS) rc = mu__mpi_fail(e, "MPI_Wait");
    }
    free(q->ibuf);
#endif
    if (rc == MU_OK) mu__account_nb(q->c, q->sent, q->recv, t0 - q->post_s, done_before);
    free(q);
    return rc;
}

MU_API int mu_comm_test(mu_comm_request *q, int *done) {
    if (!q || !done) return mu__fail(MU_EINVAL, "mu_comm_test: request or done is NULL");
    *done = 1;
#ifdef MU_HAVE_MPI
    mu__progress *p = q->c->prog;
    if (p) pthread_mutex_lock(&p->mu);
    if (!q->listed && !q->done && !q->err && q->req != MPI_REQUEST_NULL) {
        int e = MPI_Test(&q->req, done, MPI_STATUS_IGNORE);
        if (e != MPI_SUCCESS) q->err = e;
        if (*done || e != MPI_SUCCESS) q->done = 1;
    } else {
        *done = q->done || q->req == MPI_REQUEST_NULL;
    }
    if (p) pthread_mutex_unlock(&p->mu);
#endif
    return MU_OK;
}

static int mu__allreduce(mu_comm *c, void *buf, int64_t n, int op, int is_int, const char *what) {
    if (!c) return mu__fail(MU_EINVAL, "%s: comm is NULL", what);
    if (n < 0 || n > INT_MAX) return mu__fail(MU_EINVAL, "%s: count %lld out of range", what, (long long)n);
    if (op != MU_COMM_SUM && op != MU_COMM_MAX && op != MU_COMM_MIN)
        return mu__fail(MU_EINVAL, "%s: op %d is not MU_COMM_SUM, MU_COMM_MAX or MU_COMM_MIN", what, op);
    if (n > 0 && !buf) return mu__fail(MU_EINVAL, "%s: buf is NULL", what);
    double t0 = mu__now();
    int64_t vol = n * 8 * (int64_t)(c->size - 1);
#ifdef MU_HAVE_MPI
    if (c->size > 1) {
        MPI_Op mop = op == MU_COMM_SUM ? MPI_SUM : op == MU_COMM_MAX ? MPI_MAX : MPI_MIN;
        MPI_Request rq;
        int e = mu__idle(MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, is_int ? MPI_INT64_T : MPI_DOUBLE, mop, c->comm, &rq), &rq);
        if (e != MPI_SUCCESS) return mu__mpi_fail(e, "MPI_Allreduce");
    }
#else
    MU__UNUSED(is_int);
#endif
    mu__account(c, vol, vol, t0);
    return MU_OK;
}

MU_API int mu_comm_allreduce_i64(mu_comm *c, int64_t *buf, int64_t n, int op) {
    return mu__allreduce(c, buf, n, op, 1, "mu_comm_allreduce_i64");
}

MU_API int mu_comm_allreduce_f64(mu_comm *c, double *buf, int64_t n, int op) {
    return mu__allreduce(c, buf, n, op, 0, "mu_comm_allreduce_f64");
}

MU_API int mu_comm_barrier(mu_comm *c) {
    if (!c) return mu__fail(MU_EINVAL, "mu_comm_barrier: comm is NULL");
    double t0 = mu__now();
#ifdef MU_HAVE_MPI
    if (c->size > 1) {
        MPI_Request rq;
        int e = mu__idle(MPI_Ibarrier(c->comm, &rq), &rq);
        if (e != MPI_SUCCESS) return mu__mpi_fail(e, "MPI_Barrier");
    }
#endif
    mu__account(c, 0, 0, t0);
    return MU_OK;
}

MU_API int mu_comm_finalize(void) {
#ifdef MU_HAVE_MPI
    int expected = 0;
    if (!atomic_compare_exchange_strong(&mu__finalized, &expected, 1)) return MU_OK;
    if (!atomic_load(&mu__we_initialized)) return MU_OK;
    int fin = 0;
    MPI_Finalized(&fin);
    if (fin) return MU_OK;
    int e = MPI_Finalize();
    if (e != MPI_SUCCESS) return mu__mpi_fail(e, "MPI_Finalize");
#else
    atomic_store(&mu__finalized, 1);
#endif
    return MU_OK;
}

MU_API void mu_comm_abort(int code) {
#ifdef MU_HAVE_MPI
    int inited = 0, fin = 0, size = 1;
    MPI_Initialized(&inited);
    MPI_Finalized(&fin);
    if (inited && !fin) {
        MPI_Comm_size(MPI_COMM_WORLD, &size);
        if (size > 1) MPI_Abort(MPI_COMM_WORLD, code);
    }
#else
    MU__UNUSED(code);
#endif
}

#ifdef MU_HAVE_MPI
/* The world's size (size = 1) or this process's rank (size = 0) without
 * initializing MPI: MPI's once it runs, else the launcher's environment
 * (Open MPI's variable, then PMI's), else the default; at least min. */
static int mu__world_value(int size, const char *ompi, const char *pmi, int dflt, int min) {
    int inited = 0, fin = 0, v = dflt;
    MPI_Initialized(&inited);
    MPI_Finalized(&fin);
    if (inited && !fin) {
        if (size) MPI_Comm_size(MPI_COMM_WORLD, &v);
        else MPI_Comm_rank(MPI_COMM_WORLD, &v);
        return v;
    }
    const char *s = getenv(ompi);
    if (!s) s = getenv(pmi);
    if (s) v = atoi(s);
    return v < min ? min : v;
}
#endif

MU_API int mu_comm_world_rank(void) {
#ifdef MU_HAVE_MPI
    return mu__world_value(0, "OMPI_COMM_WORLD_RANK", "PMI_RANK", 0, 0);
#else
    return 0;
#endif
}

MU_API int mu_comm_world_size(void) {
#ifdef MU_HAVE_MPI
    return mu__world_value(1, "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", 1, 1);
#else
    return 1;
#endif
}
