/*
 * muon.h -- public C API of the muon engine.
 *
 * This header is the single source of truth for the Lua FFI declarations:
 * the build runs it through the C preprocessor with MU_FFI_CDEF defined and
 * compiles the result into the library (mu_cdef()), so Lua never keeps a
 * second copy. Keep everything between the includes and the end guard
 * digestible by LuaJIT's ffi.cdef: plain typedefs, enums, structs and
 * prototypes, no macros that Lua needs to see.
 *
 * Conventions: fallible calls return int (MU_OK = 0, negative on error) and
 * put their result in the last out-parameter (NULL on failure); a detail
 * message for the last error of the calling thread is in mu_last_error().
 * Dimensions and indices are 0-based here (Lua adds 1-based wrappers).
 */
#ifndef MUON_H
#define MUON_H

#ifndef MU_FFI_CDEF
#include <stddef.h>
#include <stdint.h>
#if defined(MU_BUILDING) && defined(__GNUC__)
#define MU_API __attribute__((visibility("default")))
#else
#define MU_API
#endif
#ifdef __cplusplus
extern "C" {
#endif
#else
#define MU_API
#endif

/* ---------------------------------------------------------------- errors */

enum {
    MU_OK = 0,
    MU_EINVAL = -1,    /* bad argument (shape, dim, option) */
    MU_ENOMEM = -2,    /* allocation failed */
    MU_EIO = -3,       /* file could not be read or written */
    MU_EFORMAT = -4,   /* malformed or unsupported file contents */
    MU_EDTYPE = -5,    /* unsupported or mismatched dtype */
    MU_ESHAPE = -6,    /* shapes or sizes disagree */
    MU_ENONFINITE = -7,/* NaN or Inf where finite values are required */
    MU_ESTATE = -8,    /* object not in a state that allows the call */
    MU_ELUA = -9,      /* error raised by Lua code (config, hook) */
    MU_ECOMM = -10     /* communication failure */
};

/* Static description of a status code. */
MU_API const char *mu_strerror(int code);
/* Detail message of the last failed call on this thread ("" if none). */
MU_API const char *mu_last_error(void);
/* FFI declarations of this header, for LuaJIT's ffi.cdef. */
MU_API const char *mu_cdef(void);
MU_API const char *mu_version(void);

/* --------------------------------------------------------------- tensors */

typedef enum { MU_F32 = 0, MU_F64 = 1 } mu_dtype;
enum { MU_MAX_DIMS = 8 };

typedef struct mu_storage mu_storage; /* refcounted buffer, opaque */

/*
 * A strided view over a storage. Fields are read-only for callers (Lua reads
 * them directly for speed); use the functions below to make new views.
 * data points at element (0,...,0), i.e. storage base + offset elements.
 */
typedef struct mu_tensor {
    void *data;
    mu_storage *storage;
    int64_t offset;
    int32_t scalar;     /* mu_dtype */
    int32_t ndim;
    int64_t dims[8];   /* sizes */
    int64_t strides[8]; /* in elements */
} mu_tensor;

/* New zero-filled contiguous tensor owning its storage. ndim may be 0. */
MU_API int mu_tensor_new(int dtype, int ndim, const int64_t *shape, mu_tensor **out);
/* Wrap a caller's buffer without owning it (the caller keeps it alive).
 * strides may be NULL for C-contiguous. */
MU_API int mu_tensor_wrap(int dtype, int ndim, const int64_t *shape, const int64_t *strides,
                          void *data, mu_tensor **out);
/* Release one tensor handle (storage freed with its last view). NULL is ok. */
MU_API void mu_tensor_free(mu_tensor *t);

MU_API int64_t mu_tensor_numel(const mu_tensor *t);
MU_API int mu_tensor_is_contiguous(const mu_tensor *t);
MU_API size_t mu_dtype_size(int dtype);
/* Whether two tensors share the same storage. */
MU_API int mu_tensor_same_storage(const mu_tensor *a, const mu_tensor *b);

/* Views sharing storage. view: contiguous input only; one dim may be -1. */
MU_API int mu_tensor_view(const mu_tensor *t, int ndim, const int64_t *shape, mu_tensor **out);
MU_API int mu_tensor_transpose(const mu_tensor *t, int d0, int d1, mu_tensor **out);
MU_API int mu_tensor_narrow(const mu_tensor *t, int dim, int64_t start, int64_t length,
                            mu_tensor **out);
/* Drop a size-1 dim / insert one at position dim (views). */
MU_API int mu_tensor_squeeze(const mu_tensor *t, int dim, mu_tensor **out);
MU_API int mu_tensor_unsqueeze(const mu_tensor *t, int dim, mu_tensor **out);
/* Same storage if already contiguous, else a contiguous copy. */
MU_API int mu_tensor_contiguous(const mu_tensor *t, mu_tensor **out);
/* Always a new contiguous copy (optionally of another dtype; -1 keeps it). */
MU_API int mu_tensor_clone(const mu_tensor *t, int dtype, mu_tensor **out);

/* dst = src elementwise; same shape, dtypes may differ. Overlap not allowed
 * except dst == src exactly. */
MU_API int mu_tensor_copy(mu_tensor *dst, const mu_tensor *src);
MU_API int mu_tensor_fill(mu_tensor *t, double value);
/* Frobenius norm, accumulated in double. */
MU_API int mu_tensor_norm(const mu_tensor *t, double *out);
MU_API int mu_tensor_get(const mu_tensor *t, const int64_t *index, double *out);
MU_API int mu_tensor_set(mu_tensor *t, const int64_t *index, double value);
/* 1 if every element is finite, 0 otherwise (first bad flat index in *where). */
MU_API int mu_tensor_all_finite(const mu_tensor *t, int64_t *where);

/* ------------------------------------------------------------------ npy */

/* NumPy .npy, versions 1.0/2.0/3.0, '<f4' or '<f8', C order. */
MU_API int mu_npy_load(const char *path, mu_tensor **out);
MU_API int mu_npy_load_mem(const void *buf, size_t len, mu_tensor **out);
MU_API int mu_npy_save(const mu_tensor *t, const char *path);

/* ----------------------------------------------------------------- BLAS */

typedef struct mu_blas_info {
    char core[64];   /* OpenBLAS core name, e.g. "SkylakeX" */
    char config[160];
    int threads;
} mu_blas_info;

MU_API int mu_blas_get_info(mu_blas_info *out);
MU_API int mu_blas_set_threads(int threads);

/* -------------------------------------------------------- Newton-Schulz */

/* Which products the iteration uses: syrk/symm on the symmetric Gram
 * matrices (default) or plain gemm (kept for testing and benchmarks). */
enum { MU_NS_SYMMETRIC = 0, MU_NS_PLAIN = 1 };

typedef struct mu_ns_opts {
    int steps;             /* number of (a, b, c) triples used */
    const double *coeffs;  /* 3 * steps values: a0 b0 c0 a1 b1 c1 ... */
    double eps;            /* X / (norm_scale * ||X||_F + eps) */
    double norm_scale;     /* 1.0 for the seed; 1.02 for polar_express */
    int path;              /* MU_NS_SYMMETRIC or MU_NS_PLAIN */
} mu_ns_opts;

typedef struct mu_ns_workspace mu_ns_workspace;

/* Workspace for matrices of up to rows x cols (either orientation), reused
 * across calls so the step loop never allocates. */
MU_API int mu_ns_workspace_new(int dtype, int64_t rows, int64_t cols, mu_ns_workspace **out);
MU_API void mu_ns_workspace_free(mu_ns_workspace *ws);

/* Orthogonalize in (n x m) or a batch (b x n x m), C-contiguous, into out
 * (same shape and dtype; out may be in). ws may be NULL (allocated inside).
 * A non-finite input fails with MU_ENONFINITE naming the batch index and
 * leaves out untouched; eps = 0 with an all-zero matrix is MU_EINVAL. */
MU_API int mu_ns_zeropower(const mu_tensor *in, mu_tensor *out, const mu_ns_opts *opts,
                           mu_ns_workspace *ws);

/* Named coefficient schedules ("legacy", "asym5", "polar_express",
 * "deepseekv4"): writes `steps` triples into coeffs (cap triples room) and
 * the preset's norm_scale. steps <= 0 means the preset's natural length;
 * the number written goes to *nsteps. */
MU_API int mu_ns_preset(const char *name, int steps, double *coeffs, int cap, double *norm_scale,
                        int *nsteps);

/* ------------------------------------------------- fused multi-tensor ops */

/* Muon momentum as the seed: u = g + m1*buf; buf' = m2*buf + g;
 * nesterov: u = m1*u + g. Reads grads/bufs, writes new_bufs and updates
 * (new_bufs may alias bufs for an in-place update; updates must not alias
 * the inputs). All tensors of index i have the same numel. */
MU_API int mu_foreach_momentum(int n, mu_tensor *const *grads, mu_tensor *const *bufs,
                               mu_tensor *const *new_bufs, mu_tensor *const *updates,
                               double m1, double m2, int nesterov);

/* Decoupled decay + apply: p = p * decay + (alpha * scales[i]) * update
 * (scales NULL means 1). updates[i] has params[i]'s numel. */
MU_API int mu_foreach_apply(int n, mu_tensor *const *params, mu_tensor *const *updates,
                            const double *scales, double decay, double alpha);

/* x *= scales[i] (or scale when scales is NULL). */
MU_API int mu_foreach_scale(int n, mu_tensor *const *xs, const double *scales, double scale);

/* torch.optim.AdamW (bias-corrected, decoupled decay), step >= 1. */
MU_API int mu_foreach_adamw(int n, mu_tensor *const *params, mu_tensor *const *grads,
                            mu_tensor *const *exp_avgs, mu_tensor *const *exp_avg_sqs,
                            double lr, double beta1, double beta2, double eps,
                            double weight_decay, int64_t step);

/* 1 if every element of every tensor is finite; else 0 and *bad is the
 * index of the first tensor holding NaN/Inf. */
MU_API int mu_foreach_all_finite(int n, mu_tensor *const *xs, int *bad);

/* Copy each src[i] into dst at element offset offsets[i] (pack), or back
 * (unpack). dst/src batch buffers are contiguous. */
MU_API int mu_foreach_pack(int n, mu_tensor *const *srcs, mu_tensor *dst, const int64_t *offsets);
MU_API int mu_foreach_unpack(int n, const mu_tensor *src, mu_tensor *const *dsts,
                             const int64_t *offsets);

#ifndef MU_FFI_CDEF
#ifdef __cplusplus
}
#endif
#endif
#endif /* MUON_H */
