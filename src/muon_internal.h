/* Private helpers shared by the C core (not part of the public API). */
#ifndef MUON_INTERNAL_H
#define MUON_INTERNAL_H

#include "muon.h"

#include <stdatomic.h>

#define MU__UNUSED(x) ((void)(x))

struct mu_storage {
    void *base;
    int64_t nbytes;
    atomic_int refcount;
    int owned; /* free(base) when the last reference goes */
};

/* Checked int64 arithmetic, the one place for it: 1 on overflow (then *r
 * is unspecified), 0 otherwise. Every size, stride, offset and byte count
 * computed from caller or file input goes through these. */
static inline int mu__mul_i64(int64_t a, int64_t b, int64_t *r) { return __builtin_mul_overflow(a, b, r); }
static inline int mu__add_i64(int64_t a, int64_t b, int64_t *r) { return __builtin_add_overflow(a, b, r); }

/* Record a detail message for mu_last_error() and return code. */
int mu__fail(int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Clear the thread's detail message (successful public calls need not). */
void mu__clear_error(void);

/* Contiguous element count with overflow check; -1 on overflow/negative. */
int64_t mu__shape_numel(int ndim, const int64_t *shape);
/* Make a tensor handle over storage s (takes a new reference on s). */
int mu__tensor_over(mu_storage *s, int dtype, int64_t offset, int ndim, const int64_t *shape,
                    const int64_t *stride, mu_tensor **out);
/* Element pointer for a flat row-major position of a strided tensor. */
void *mu__tensor_ptr(const mu_tensor *t, const int64_t *index);

/* Files (src/fileio.c). Open path for reading only if it is a regular file
 * (never blocking on a FIFO or device): fd and size, or MU_EIO naming the
 * path. */
int mu__open_regular(const char *path, int *fd, int64_t *size);
/* pread / write the whole buffer (EINTR retried); -1 with errno on error;
 * read_full stops early at end of file (*got tells). */
int mu__read_full(int fd, void *buf, size_t len, int64_t off, size_t *got);
int mu__write_full(int fd, const void *buf, size_t len);
/* Atomic save: a new temporary file next to path, unique per call
 * (mkstemp), its name within NAME_MAX; then commit (fsync, close, rename
 * over path, fsync the directory; frees tmp; MU_EIO naming the path on
 * failure, the temporary removed) or abort (close, remove, free). */
int mu__tmp_create(const char *path, char **tmp, int *fd);
int mu__tmp_commit(const char *path, char *tmp, int fd);
void mu__tmp_abort(char *tmp, int fd);
/* ------------------------------------------------ Newton-Schulz (ns*.c) */

enum { MU__NS_MAX_SLOTS = 16 };

/* One worker's buffers. */
typedef struct mu__ns_slot {
    void *x; /* n * m: ping-pong iterate */
    void *a; /* n * n: Gram matrix */
    void *b; /* n * n: polynomial matrix */
    void *g; /* the Gram iteration's buffers (3 n*n + n*m), allocated on its first use */
    size_t g_bytes; /* bytes of g (0 until allocated) */
} mu__ns_slot;

struct mu_ns_workspace {
    int dtype;
    int64_t cap_nm; /* elements of x */
    int64_t cap_nn; /* elements of a and b */
    int nslots;     /* slots allocated so far (>= 1) */
    mu__ns_slot slot[MU__NS_MAX_SLOTS];
    void *sched;        /* the scheduler's lists (grown, kept across calls) */
    size_t sched_bytes;
};

/* A batch call of mu_ns_zeropower, validated (inputs finite, workspace big
 * enough), for the Gram iteration. */
typedef struct mu__ns_batch {
    int dt;
    int64_t rows, cols, batch;
    const char *in;
    char *out;
    const mu_ns_opts *opts;
    const double *norms; /* per-matrix Frobenius norms, or NULL (recomputed) */
    mu_ns_workspace *ws;
    int threads; /* workers */
} mu__ns_batch;

int mu__ns_check_opts(const mu_ns_opts *o);
/* Estimated cost in flops of one rows x cols matrix with the iteration
 * mu_ns_method_for picks (a scheduler's weight). */
double mu__ns_cost(int64_t rows, int64_t cols, const mu_ns_opts *opts);
/* One matrix in -> out (may alias) on workspace slot `slot` (allocated:
 * see mu__ns_slots), one worker, dispatching on opts->method (checked).
 * norm: ||in||_F (finite; 0 only with eps > 0). With OpenBLAS set to one
 * thread, the bits are those of the same matrix in any mu_ns_zeropower call.
 * Fails only with MU_ENOMEM (the Gram buffers, allocated on first use). */
int mu__ns_matrix(const mu_ns_opts *opts, int dt, int64_t rows, int64_t cols, const void *in,
                  void *out, double norm, mu_ns_workspace *ws, int slot);
/* The standard iteration on one matrix (src/ns.c), one worker. */
void mu__ns_standard_one(const mu_ns_opts *opts, int dt, int64_t rows, int64_t cols,
                         const void *in, void *out, double norm, const mu__ns_slot *s);
/* The Gram iteration on a batch (src/ns_gram.c). */
int mu__ns_gram_batch(const mu__ns_batch *b);
/* Helpers of src/ns.c shared with src/ns_gram.c. */
int mu__ns_norm(int dt, const void *p, int64_t len, double *norm);
/* Rows [r0, r1) of the stored triangle (c >= r) of n x n a: a += b first
 * when sum; mirror a; b = bcoef * a (see ns_prep). */
void mu__ns_prep(int dt, void *a, void *b, int64_t n, int64_t r0, int64_t r1, int sum,
                 double bcoef);
/* Rows [r0, r1) of the stored triangle of n x n b: b += s. */
void mu__ns_accumulate(int dt, void *b, const void *s, int64_t n, int64_t r0, int64_t r1);
/* Add v to the diagonal positions i*n + i, i in [i0, i1). */
void mu__ns_add_diag(int dt, void *p, int64_t n, int64_t i0, int64_t i1, double v);
/* Grow the workspace to `want` slots (fewer on out of memory); returns the count. */
int mu__ns_slots(mu_ns_workspace *ws, int want);

#endif
