/* Private helpers shared by the C core (not part of the public API). */
#ifndef MUON_INTERNAL_H
#define MUON_INTERNAL_H

#include "muon_ffi.h"

#include <stdatomic.h>
#include <string.h>

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

/* bfloat16 <-> float32/float64, bit for bit as torch 1.13 on CPU: to
 * bfloat16 rounds to nearest even (subnormals kept, overflow to Inf); a
 * float32 NaN becomes 0xffff (torch's vectorized conversion), a float64
 * one 0x7fc0 (torch's scalar path, which goes through float32 first, as
 * this does). Widening is exact. */
static inline uint16_t mu__bf16_from_f32(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if (f != f) return 0xffff;
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static inline uint16_t mu__bf16_from_f64(double d)
{
    return d != d ? (uint16_t)0x7fc0 : mu__bf16_from_f32((float)d);
}
static inline float mu__f32_from_bf16(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Record a detail message for mu_last_error() and return code. */
int mu__fail(int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Clear the thread's detail message (successful public calls need not). */
void mu__clear_error(void);
/* buf = head, open, i in decimal, then close, cut to cap - 1 bytes as
 * snprintf(buf, cap, "%s%s%lld%s", ...) would: the name a message gives an
 * element of a list, built without printf's cost (the checks of every
 * tensor of a list name it before they know whether it is bad). Returns buf. */
const char *mu__name_index(char *buf, size_t cap, const char *head, const char *open, long long i,
                           const char *close);

/* Contiguous element count with overflow check; -1 on overflow/negative. */
int64_t mu__shape_numel(int ndim, const int64_t *shape);
/* Make a tensor handle over storage s (takes a new reference on s). */
int mu__tensor_over(mu_storage *s, int dtype, int64_t offset, int ndim, const int64_t *shape,
                    const int64_t *stride, mu_tensor **out);
/* Element pointer for a flat row-major position of a strided tensor. */
void *mu__tensor_ptr(const mu_tensor *t, const int64_t *index);

/* Element types of files (src/fileio.c), in one table: X(safetensors name,
 * .npy descr or NULL, bytes). Data of any of them converts into float32,
 * float64 and bfloat16 tensors (mu__file_convert). */
#define MU__FILE_TYPES(X)                                                                          \
    X(F32, "<f4", 4)                                                                               \
    X(F64, "<f8", 8)                                                                               \
    X(BF16, NULL, 2)                                                                               \
    X(F16, "<f2", 2)                                                                               \
    X(I8, "|i1", 1)                                                                                \
    X(I16, "<i2", 2)                                                                               \
    X(I32, "<i4", 4)                                                                               \
    X(I64, "<i8", 8)                                                                               \
    X(U8, "|u1", 1)                                                                                \
    X(U16, "<u2", 2)                                                                               \
    X(U32, "<u4", 4)                                                                               \
    X(U64, "<u8", 8)                                                                               \
    X(BOOL, "|b1", 1)
#define MU__FILE_TYPE_ENUM(name, npy, bytes) MU__FT_##name,
enum { MU__FILE_TYPES(MU__FILE_TYPE_ENUM) MU__FT_COUNT };
#undef MU__FILE_TYPE_ENUM
/* The file type of a safetensors name / an .npy descr; -1 if none. */
int mu__file_type(const char *name);
int mu__file_type_npy(const char *descr);
size_t mu__file_type_size(int ft);
const char *mu__file_type_name(int ft);
/* The file type that holds dtype's elements as they are (F32, F64, BF16). */
int mu__file_type_of(int dtype);
/* n little-endian elements of file type ft at src into dst, contiguous, of
 * dtype (MU_F32/MU_F64/MU_BF16): exact where dtype holds every value, else
 * rounded to nearest even as torch's conversion (integers straight to the
 * float type; to bfloat16 through float32). */
void mu__file_convert(int ft, const void *src, int64_t n, void *dst, int dtype);

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

#include "pool.h"

enum { MU__NS_MAX_SLOTS = MU__POOL_MAX };

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
    struct mu__dnnl *dnnl; /* oneDNN, opened by the first bfloat16 call (src/ns_bf16.c) */
    mu_ns_stats stats;     /* what its calls did since the last reset (mu_ns_workspace_stats) */
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
/* The worker team of a Newton-Schulz call (src/pool.c): `workers` of them,
 * on the host's OpenMP runtime when it has one, unless MU_NS_OPENMP=0. */
mu__pool_cfg mu__ns_pool_cfg(int workers);
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
/* oneDNN for the bfloat16 products (src/ns_bf16.c), one per workspace. */
typedef struct mu__dnnl mu__dnnl;
int mu__dnnl_open(mu__dnnl **out);
void mu__dnnl_close(mu__dnnl *d);
/* The calling thread's OpenMP thread count (oneDNN's), and setting it. */
int mu__dnnl_threads(const mu__dnnl *d);
void mu__dnnl_set_threads(const mu__dnnl *d, int n);
/* MU_OK, or MU_ENOMEM (and clear) when a product failed since the last call. */
int mu__dnnl_take_failure(mu__dnnl *d);
/* A product C (M x N float32, ld ldc) = A (M x K bfloat16, ld lda) * op(B):
 * B K x N with ld ldb (transb 0), or B^T with B N x K, ld ldb (transb 1);
 * row-major. */
typedef struct mu__dnnl_shape {
    int64_t M, N, K, lda, ldb, ldc;
    int transb;
} mu__dnnl_shape;
/* Before a call's workers start (serial, allocating): mu__dnnl_want for
 * every product shape the call runs, then mu__dnnl_workers for its most
 * workers (ranks 0 .. workers-1). Both keep what they made until
 * mu__dnnl_close; MU_ENOMEM / MU_EIO on failure. */
int mu__dnnl_want(mu__dnnl *d, const mu__dnnl_shape *s);
int mu__dnnl_workers(mu__dnnl *d, int workers);
/* The bytes of the per-worker buffers (0 for NULL). */
size_t mu__dnnl_bytes(const mu__dnnl *d);
/* Run a product of a wanted shape on worker w (the calling thread, one
 * OpenMP thread); no allocation. A failure is kept for mu__dnnl_take_failure. */
void mu__dnnl_gemm(mu__dnnl *d, int w, const mu__dnnl_shape *s, const uint16_t *a,
                   const uint16_t *b, float *c);
void mu__dnnl_describe(char *buf, size_t cap);
/* Grow the workspace to `want` slots (fewer on out of memory); returns the count. */
int mu__ns_slots(mu_ns_workspace *ws, int want);

#endif
