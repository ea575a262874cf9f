/*
 * muon_ffi.h -- the library's private C surface: the calls the Lua layer
 * (lua/muon/) and the tests reach through the FFI (tensors, their maths,
 * Newton-Schulz, the fused optimizer loops, exact sums, files,
 * collectives). Not installed and not part of the stable ABI: these
 * symbols are exported from libmuon.so under the version node
 * MUON_PRIVATE, for the library's own Lua modules, and change with them.
 * A host embeds the engine through muon.h alone.
 *
 * The FFI declarations are this header (muon.h included) run through the
 * C preprocessor with MU_FFI_CDEF defined, embedded in the library
 * (mu_cdef()); the same rules as muon.h's hold: only what LuaJIT's
 * ffi.cdef digests between the includes and the end guard.
 */
#ifndef MUON_FFI_H
#define MUON_FFI_H

#include "muon.h"

#ifndef MU_FFI_CDEF
#ifdef __cplusplus
extern "C" {
#endif
#endif

/* ----------------------------------------------------------------- FFI */

/* The FFI declarations of this header and muon.h, for LuaJIT's ffi.cdef
 * (lua/muon/core.lua). */
MU_API const char *mu_cdef(void);
/* Is path a regular file that can be opened for reading? Decided without
 * blocking: a directory, FIFO, socket or device is refused without being
 * opened. resolved (cap bytes, may be NULL) receives the absolute path (the
 * real path when it exists, else the working directory joined with path).
 * MU_OK, or MU_EIO with the reason alone in mu_last_error() ("No such file
 * or directory", "Is a directory", "not a regular file (a FIFO)", ...).
 * Every loader of the library checks its files itself; this is for code
 * about to read a user-given path with io.open or fopen. */
MU_API int mu_file_check(const char *path, char *resolved, size_t cap);
/* Seconds on CLOCK_MONOTONIC (muon.clock(), the step's timers). */
MU_API double mu_clock(void);
/* The names in directory path (but "." and ".."), each followed by a NUL:
 * *len gets their total bytes; they are copied into buf only when they all
 * fit in cap bytes (*len <= cap; buf NULL with cap 0 asks for the length).
 * MU_EIO when path cannot be listed (missing, not a directory). */
MU_API int mu_dir_list(const char *path, char *buf, size_t cap, size_t *len);
/* Make directory path (one level, mode 0777 & ~umask); MU_OK when it
 * already is one, MU_EIO otherwise. */
MU_API int mu_dir_make(const char *path);
/* Write len bytes to path atomically (a temporary file in its directory,
 * synced, then renamed over path): MU_EIO when it cannot. */
MU_API int mu_file_write_atomic(const char *path, const void *data, size_t len);

/* --------------------------------------------------------------- tensors */

/*
 * The dtypes, in one table: X(name, value, bytes, lua name, safetensors
 * name). It generates mu_dtype_size, mu_dtype_name and mu_dtype_file_name
 * (src/tensor.c, which also checks that the enums of MU_F32, MU_F64 (in
 * muon.h) and MU_BF16 (below) hold the table's values); the Lua side
 * builds its dtype tables from those. MU_BF16 (bfloat16: the upper half of a float32) is a
 * storage dtype: tensors of it are made, viewed, copied and converted
 * (round to nearest even, as torch), saved and loaded, and foreach state
 * arrays may hold it; the maths, Newton-Schulz and collectives take float32
 * and float64 only (MU_EDTYPE otherwise).
 */
#define MU_DTYPES(X)                                                                            \
    X(F32, 0, 4, "float32", "F32")                                                              \
    X(F64, 1, 8, "float64", "F64")                                                              \
    X(BF16, 2, 2, "bfloat16", "BF16")

/* The dtypes beyond muon.h's MU_F32 = 0 and MU_F64 = 1: MU_BF16 = 2;
 * MU_DTYPE_COUNT after the last. (A tensor has at most MU_MAX_DIMS dims,
 * muon.h's.) */
enum { MU_BF16 = 2, MU_DTYPE_COUNT = 3 };

typedef struct mu_storage mu_storage; /* refcounted buffer, opaque */

/*
 * A strided view over a storage. Fields are read-only for callers (Lua reads
 * them directly for speed); use the functions below to make new views.
 * data points at element (0,...,0), i.e. storage base + offset elements.
 */
typedef struct mu_tensor {
    void *data;                   /* element (0, ..., 0) */
    mu_storage *storage;          /* the buffer viewed (shared by views) */
    int64_t offset;               /* of data from the storage base, in elements */
    int32_t scalar;               /* MU_F32, MU_F64 or MU_BF16 */
    int32_t ndim;                 /* 0 .. MU_MAX_DIMS */
    int64_t dims[MU_MAX_DIMS];    /* sizes (the first ndim are used) */
    int64_t strides[MU_MAX_DIMS]; /* in elements */
} mu_tensor;

/* New zero-filled contiguous tensor owning its storage. ndim may be 0. */
MU_API int mu_tensor_new(int dtype, int ndim, const int64_t *shape, mu_tensor **out);
/* Wrap a caller's buffer without owning it (the caller keeps it alive).
 * strides may be NULL for C-contiguous. */
MU_API int mu_tensor_wrap(int dtype, int ndim, const int64_t *shape, const int64_t *strides,
                          void *data, mu_tensor **out);
/* Release one tensor handle (storage freed with its last view). NULL is ok. */
MU_API void mu_tensor_free(mu_tensor *t);

/* The number of elements (the product of the sizes; 1 for 0 dims); -1 for
 * NULL or a bad ndim. */
MU_API int64_t mu_tensor_numel(const mu_tensor *t);
/* 1 if t is C-contiguous (size-1 dims may have any stride; an empty tensor
 * is contiguous), 0 otherwise or for NULL. */
MU_API int mu_tensor_is_contiguous(const mu_tensor *t);
/* Bytes per element of a dtype (0 for a value outside MU_DTYPES). */
MU_API size_t mu_dtype_size(int dtype);
/* The dtype's Lua name ("float32", "float64", "bfloat16") and its
 * safetensors name ("F32", "F64", "BF16"); NULL outside MU_DTYPES. */
MU_API const char *mu_dtype_name(int dtype);
/* The dtype's safetensors name ("F32", "F64", "BF16"); NULL outside
 * MU_DTYPES. */
MU_API const char *mu_dtype_file_name(int dtype);
/* Whether two tensors share the same storage. */
MU_API int mu_tensor_same_storage(const mu_tensor *a, const mu_tensor *b);

/* MU_OK if t is a usable handle: a known dtype, 0..MU_MAX_DIMS dims, sizes and
 * strides >= 0, and every element it addresses inside its storage (checked
 * arithmetic). Every call taking tensors makes this check first. */
MU_API int mu_tensor_check(const mu_tensor *t);

/* Views sharing storage: each *out is a new handle (free it with
 * mu_tensor_free) on t's storage; MU_EINVAL for bad dims or ranges (the
 * message names them), and *out is NULL on failure. view: contiguous input
 * only; one dim may be -1; the element count must not change. */
MU_API int mu_tensor_view(const mu_tensor *t, int ndim, const int64_t *shape, mu_tensor **out);
/* A view with dims d0 and d1 (0-based) swapped. */
MU_API int mu_tensor_transpose(const mu_tensor *t, int d0, int d1, mu_tensor **out);
/* A view of length elements of dim from start (0-based): start + length
 * <= the size. */
MU_API int mu_tensor_narrow(const mu_tensor *t, int dim, int64_t start, int64_t length,
                            mu_tensor **out);
/* A view without dim, which must have size 1. */
MU_API int mu_tensor_squeeze(const mu_tensor *t, int dim, mu_tensor **out);
/* A view with a size-1 dim inserted at position dim (0 .. ndim; ndim <
 * MU_MAX_DIMS). */
MU_API int mu_tensor_unsqueeze(const mu_tensor *t, int dim, mu_tensor **out);
/* Same storage if already contiguous, else a contiguous copy. */
MU_API int mu_tensor_contiguous(const mu_tensor *t, mu_tensor **out);
/* Always a new contiguous copy (optionally of another dtype; -1 keeps it). */
MU_API int mu_tensor_clone(const mu_tensor *t, int dtype, mu_tensor **out);

/* dst = src elementwise; same shape, dtypes may differ. Overlap not allowed
 * except dst == src exactly. */
MU_API int mu_tensor_copy(mu_tensor *dst, const mu_tensor *src);
/* Set every element of t (any strides) to value, rounded to t's dtype. */
MU_API int mu_tensor_fill(mu_tensor *t, double value);
/* Frobenius norm, accumulated in double. */
MU_API int mu_tensor_norm(const mu_tensor *t, double *out);
/* One element: index holds ndim 0-based indices (MU_EINVAL naming the
 * first out of range); *out the value as a double (any NaN as the one
 * quiet NaN). */
MU_API int mu_tensor_get(const mu_tensor *t, const int64_t *index, double *out);
/* Set one element (index as mu_tensor_get) to value rounded to t's dtype. */
MU_API int mu_tensor_set(mu_tensor *t, const int64_t *index, double value);
/* 1 if every element is finite, 0 otherwise (first bad flat index in *where);
 * negative (an MU_E* code) for a bad tensor. */
MU_API int mu_tensor_all_finite(const mu_tensor *t, int64_t *where);

/* ---------------------------------------------------------- tensor maths */

/*
 * Elementwise maths, reductions and matrix products (src/tensor_math.c).
 * Every call validates its tensors (dtype, shape, and that each element
 * they address lies inside their storage) before touching memory. Inputs
 * may be strided views; results go into a caller-made `out`.
 *
 * mu_tensor_map: out = op(x0, x1, x2) per element, the operands broadcast
 * to out's shape by NumPy rules (dims aligned from the end, a size-1 or
 * missing dim repeats); out's shape must be the broadcast shape. A NULL
 * x[i] uses the scalar s[i] instead. Tensors share one dtype, the type of
 * the arithmetic: scalars are rounded to it first, float32 results come
 * from float32 operations, and there is no fused multiply-add except where
 * torch's CPU kernels use one (add/sub with alpha, addcmul, lerp). out may
 * be an operand (in place) but must not overlap one in another layout
 * (MU_EINVAL).
 */
typedef enum {
    MU_MAP_ADD = 0,   /* x0 + alpha*x1, as fma(alpha, x1, x0) */
    MU_MAP_SUB,       /* x0 - alpha*x1, as fma(-alpha, x1, x0) */
    MU_MAP_MUL,       /* x0 * x1 */
    MU_MAP_DIV,       /* x0 / x1 */
    MU_MAP_ADDCMUL,   /* x0 + (value*x1)*x2, as fma(value*x1, x2, x0) */
    MU_MAP_ADDCDIV,   /* x0 + (value*x1)/x2, each step rounded */
    MU_MAP_LERP,      /* x0 + x2*(x1 - x0): |x2| < 0.5 ? fma(x2, x1 - x0, x0)
                       * : fma(x2 - 1, x1 - x0, x1) */
    MU_MAP_WHERE,     /* x0 != 0 ? x1 : x2 (NaN counts as true) */
    MU_MAP_GT,        /* 1 or 0: x0 > x1 (false for NaN, like every comparison but NE) */
    MU_MAP_LT,        /* x0 < x1 */
    MU_MAP_GE,        /* x0 >= x1 */
    MU_MAP_LE,        /* x0 <= x1 */
    MU_MAP_EQ,        /* x0 == x1 */
    MU_MAP_NE,        /* x0 != x1 (true for NaN) */
    MU_MAP_NEG,       /* -x0 */
    MU_MAP_ABS,       /* |x0| */
    MU_MAP_SQRT,      /* sqrt(x0) */
    MU_MAP_RSQRT,     /* 1 / sqrt(x0), two roundings */
    MU_MAP_SIGN,      /* 1, -1, or 0 for zeros and NaN */
    MU_MAP_CLAMP,     /* min(max(x0, lo), hi); NaN stays NaN, a NaN bound is ignored */
    MU_MAP_EXP,       /* exp(x0) (the C library's, in the dtype: expf / exp) */
    MU_MAP_LOG,       /* natural log(x0): -inf at 0, NaN below */
    MU_MAP_TANH,      /* tanh(x0) (the C library's) */
    MU_MAP_SIGMOID,   /* 1 / (1 + exp(-x0)), torch's formula, each step rounded */
    MU_MAP_POW,       /* pow(x0, x1); a scalar exponent (x[1] NULL) of 2, 3 or -2 is
                       * x*x, x*x*x, 1/(x*x), of 0.5, -0.5, -1 sqrt, 1/sqrt, 1/x,
                       * as torch computes tensor ** scalar */
    MU_MAP_COUNT      /* the number of ops */
} mu_map_op;

typedef struct mu_map_args {
    int op;                /* mu_map_op */
    const mu_tensor *x[3]; /* operands (as many as the op takes); NULL: use s[i] */
    double s[3];           /* scalar operands */
    double alpha;          /* ADD, SUB */
    double value;          /* ADDCMUL, ADDCDIV */
    double lo, hi;         /* CLAMP (-inf / +inf for no bound) */
} mu_map_args;

/* out = args->op(x0, x1, x2) per element, as described above: the operands
 * broadcast to out's shape, NULL operands replaced by their scalars. Every
 * tensor is checked first; MU_ESHAPE for shapes that do not broadcast to
 * out's, MU_EDTYPE for mixed dtypes or bfloat16, MU_EINVAL for an unknown
 * op or out overlapping an operand in another layout. */
MU_API int mu_tensor_map(const mu_map_args *args, mu_tensor *out);

/* Reductions accumulate in double (float32 inputs are rounded once, when
 * the result is stored), in row-major order of the reduced elements. SUM
 * of nothing is 0, MEAN NaN, NORM 0; AMAX of nothing is MU_ESHAPE. AMAX
 * propagates NaN; NORM is the 2-norm sqrt(sum x^2). The ops: muon.h's
 * MU_REDUCE_SUM (0, the sum) and MU_REDUCE_MEAN (1, sum / count), then
 * these. */
typedef enum {
    MU_REDUCE_AMAX = MU_REDUCE_MEAN + 1, /* largest element */
    MU_REDUCE_NORM,    /* sqrt(sum x^2) */
    MU_REDUCE_ARGMAX, /* the 0-based index of the first largest element (a NaN
                       * counts as largest: the first NaN), torch's rule; stored
                       * as a number of t's dtype, so the reduced dim must be at
                       * most 2^24 long for float32 (else MU_EINVAL); of
                       * nothing MU_ESHAPE */
    MU_REDUCE_COUNT   /* the number of reductions */
} mu_reduce_op;

/* Reduce t along dim (0-based) into out: t's shape with that dim of size 1
 * (keepdim) or removed, t's dtype. */
MU_API int mu_tensor_reduce(const mu_tensor *t, int op, int dim, mu_tensor *out);
/* Reduce every element: the double accumulator (not rounded to float32);
 * for ARGMAX the row-major flat index (0-based, exact up to 2^53). */
MU_API int mu_tensor_reduce_all(const mu_tensor *t, int op, double *out);

/* out = a @ b with OpenBLAS ?gemm: a (n x k), b (k x m), out (n x m); or
 * batches a (B x n x k), b (B x k x m), out (B x n x m), where a or b may
 * have batch size 1 (used for every batch). Operands whose matrices have
 * neither unit row nor unit column stride are copied to contiguous first.
 * out's rows must be unit-stride, out distinct from a and b (not the same
 * storage); k = 0 gives zeros. */
MU_API int mu_tensor_matmul(const mu_tensor *a, const mu_tensor *b, mu_tensor *out);

/* Softmax of t along dim (0-based) into out (t's shape and dtype):
 * exp(x - max) / sum(exp(x - max)) over each slice along dim, or with log
 * non-zero the log-softmax (x - max) - log(sum(exp(x - max))). Computed in
 * double (the sum in order); a float32 softmax rounds exp(x - max) to
 * float32 before the division, so it is within 1 ulp of the double
 * result. A slice holding NaN, or only -inf, gives NaN, as torch. out may
 * be t itself (in place) but must not overlap it otherwise. */
MU_API int mu_tensor_softmax(const mu_tensor *t, int dim, int log, mu_tensor *out);

/* torch.gather: out[i][j] = t[index[i][j] - base][j] for dim 0, likewise
 * along any dim (0-based). index has t's number of dims, index.size(d) <=
 * t.size(d) for every d other than dim, and holds integers in base ..
 * base + t.size(dim) - 1 (base: 0 for 0-based indices, 1 for 1-based), as
 * float32 or float64 values; out has index's shape and t's dtype and must
 * not overlap t or index. Every index is checked before anything is
 * written (MU_EINVAL names the first bad one and its position). */
MU_API int mu_tensor_gather(const mu_tensor *t, int dim, const mu_tensor *index, int64_t base,
                            mu_tensor *out);

/* ----------------------------------------------------------- exact sums */

/* An exact accumulator of float values (src/xsum.c): every finite float64
 * is added without rounding, so a sum does not depend on the order or the
 * grouping of its terms (how a parameter is split over ranks). It also
 * keeps the largest and smallest value added and counts NaN and +-Inf.
 * Hooks' ctx.allreduce and ctx.global_norm use it (lua/muon/reduce.lua).
 * Zero it with mu_xsum_zero before use; plain data (copy it freely). */
enum { MU_XSUM_LIMBS = 70 };
typedef struct mu_xsum {
    int64_t limb[MU_XSUM_LIMBS]; /* limb i weighs 2^(32 i - 1088) */
    int64_t nan, pinf, ninf;     /* NaN, +Inf and -Inf values added */
    int64_t pending;             /* additions since the carries were propagated */
    double max, min;             /* of the values added (-Inf / +Inf when none; NaN skipped) */
} mu_xsum;
/* Make s the empty sum: limbs and counts 0, max -Inf, min +Inf (NULL is a
 * no-op). */
MU_API void mu_xsum_zero(mu_xsum *s);
/* Add every element of x (float32, float64 or bfloat16, any strides), or
 * with squares != 0 every element's square (float32, bfloat16: exact;
 * float64: rounded to double, +Inf when it overflows). */
MU_API int mu_xsum_add_tensor(mu_xsum *s, const mu_tensor *x, int squares);
/* mu_xsum_add_tensor over the n tensors xs[0..n-1] (any dtypes of those,
 * any shapes), in one call: every tensor is checked before any is added.
 * MU_EINVAL (a NULL argument, n < 0) or MU_EDTYPE, naming the index. */
MU_API int mu_xsum_add_tensors(mu_xsum *s, int n, mu_tensor *const *xs, int squares);
/* s += other (both are normalized; other is not changed). */
MU_API int mu_xsum_merge(mu_xsum *s, const mu_xsum *other);
/* Propagate the carries: afterwards limb[0 .. MU_XSUM_LIMBS-2] are in
 * [0, 2^32) and the last holds the sign, so every limb is exact as a double
 * and the representation of a value is unique. */
MU_API void mu_xsum_normalize(mu_xsum *s);
/* The sum rounded once to the nearest double (ties to even); NaN when a
 * NaN, or both +Inf and -Inf, were added; +-Inf when one of them was.
 * Normalizes s. */
MU_API double mu_xsum_value(mu_xsum *s);

/* ------------------------------------------------------------------ npy */

/* NumPy .npy, versions 1.0/2.0/3.0, '<f4' or '<f8', C order. */
MU_API int mu_npy_load(const char *path, mu_tensor **out);
/* As mu_npy_load, into a tensor of dtype (MU_F32, MU_F64, MU_BF16; -1: as
 * stored), converting '<f2', '<f4', '<f8', integer ('|i1'..'<i8',
 * '|u1'..'<u8') and '|b1' data as mu_st_reader_read_as does. Without a
 * dtype, data that is not '<f4' or '<f8' is refused (MU_EDTYPE naming the
 * file and its dtype). */
MU_API int mu_npy_load_as(const char *path, int dtype, mu_tensor **out);
/* As mu_npy_load, from the len bytes of a .npy file at buf (a new tensor;
 * buf is not kept). MU_EFORMAT for a malformed or truncated buffer. */
MU_API int mu_npy_load_mem(const void *buf, size_t len, mu_tensor **out);
/* Write t (MU_F32 as '<f4', MU_F64 as '<f8', any strides; MU_EDTYPE for
 * other dtypes) as a version 1.0 .npy file, atomically (a temporary file
 * renamed over path); MU_EIO when it cannot be written. */
MU_API int mu_npy_save(const mu_tensor *t, const char *path);

/* ---------------------------------------------------------- safetensors */

/* Raw I/O of safetensors files (u64 LE header length N, N bytes of JSON,
 * data section); the JSON itself is parsed and built in Lua
 * (lua/muon/safetensors.lua). Offsets are relative to the data section. */
typedef struct mu_st_reader mu_st_reader;

/* Open and bounds-check: file >= 8 bytes, N <= 100,000,000 and N <= file
 * size - 8; reads the N header bytes (MU_EFORMAT/MU_EIO naming the path). */
MU_API int mu_st_reader_open(const char *path, mu_st_reader **out);
/* The header bytes (NUL-terminated, *len = N without the NUL). */
MU_API const char *mu_st_reader_header(const mu_st_reader *r, size_t *len);
/* Bytes in the data section (file size - 8 - N). */
MU_API int64_t mu_st_reader_data_size(const mu_st_reader *r);
/* Copy data bytes [begin, end) into contiguous dst after checking
 * 0 <= begin <= end <= data size and end - begin == numel * element size. */
MU_API int mu_st_reader_read(mu_st_reader *r, int64_t begin, int64_t end, mu_tensor *dst);
/* Bytes per element of a safetensors dtype muon reads: "F32", "F64",
 * "BF16", "F16", "I8".."I64", "U8".."U64", "BOOL"; 0 for any other name. */
MU_API size_t mu_st_dtype_size(const char *name);
/* As mu_st_reader_read for data stored as `dtype` (a name above), each
 * element converted into dst's dtype: exact where it holds every value,
 * else rounded to nearest even as torch's .to() (integers straight to the
 * float type, float64 to bfloat16 through float32). */
MU_API int mu_st_reader_read_as(mu_st_reader *r, int64_t begin, int64_t end, const char *dtype,
                                mu_tensor *dst);
/* XXH64 (seed 0) of the file's whole data section, read from the file. */
MU_API int mu_st_reader_checksum(mu_st_reader *r, uint64_t *out);
/* Close the file and free the reader (NULL is a no-op). */
MU_API void mu_st_reader_close(mu_st_reader *r);

/* Atomic write: a new temporary file in path's directory (a unique
 * "<name>.tmp.XXXXXX", within NAME_MAX) gets the length, the header padded with
 * spaces to a multiple of 8, each tensor's bytes in order (contiguous
 * copies where needed); fsync, rename over path, fsync the directory. On any
 * error the temporary file is removed, path is left as it was, MU_EIO. */
MU_API int mu_st_write(const char *path, const char *header, size_t header_len, int n,
                       mu_tensor *const *ts);
/* XXH64 (seed 0) of the concatenated bytes of the tensors in order (= the
 * data section of a file holding them), and of a plain buffer. */
MU_API int mu_st_checksum(int n, mu_tensor *const *ts, uint64_t *out);
/* XXH64 (seed 0) of len bytes at data. */
MU_API int mu_st_checksum_bytes(const void *data, size_t len, uint64_t *out);

/* -------------------------------------------------------- Newton-Schulz */

/* Which products the iteration uses: syrk/symm on the symmetric Gram
 * matrices (default) or plain gemm (kept for testing and benchmarks). */
enum { MU_NS_SYMMETRIC = 0, MU_NS_PLAIN = 1 };

/* Which iteration: the seed's on X (standard), the Gram iteration on the
 * small n x n X X^T with restarts and a guard (src/ns_gram.c; bfloat16:
 * src/ns_gram_bf16.c), or auto: gram where the cost model says it is
 * faster for the shape. */
enum { MU_NS_STANDARD = 0, MU_NS_GRAM = 1, MU_NS_AUTO = 2 };

/* The input's preconditioning (mu_ns_opts.precond). MU_NS_PRECOND_NONE:
 * X / (norm_scale ||X||_F + eps). MU_NS_PRECOND_AOL (Turbo-Muon): X = D X,
 * D = diag(1 / sqrt(max(sum_j |(X X^T)_ij|, eps))) over the rows of the
 * wide orientation (norm_scale unused; a zero row stays zero); it runs the
 * standard iteration (MU_NS_AUTO resolves to it, MU_NS_GRAM is refused). */
enum { MU_NS_PRECOND_NONE = 0, MU_NS_PRECOND_AOL = 1 };

/* mu_ns_opts.dtype = MU_BF16 runs the seed's bfloat16 iteration on float32
 * tensors, from the seed's normalization of its bfloat16 input: x0 =
 * bf16(x), X = bf16(x0 / bf16(norm_scale bf16(||x0||_F) + eps')) (eps'
 * = bf16(eps), the division in float32; beyond ||x||_F in [2^-60, 2^60]
 * the same on c x and c eps, c a power of two bringing ||c x|| near 1, so
 * neither the norm nor x0 leaves bfloat16's range); then per step
 * (a, b, c), with a', b', c' the coefficients rounded to bfloat16 (as torch
 * does with a scalar times a bfloat16 tensor; kept in float32 with
 * coeffs_f32) and every product taking
 * bfloat16 inputs and accumulating in float32 (oneDNN, src/dnnl.c):
 *     A = bf16(X X^T)
 *     B = bf16(bf16(b' A) + bf16(c' bf16(A A)))
 *     X = bf16(bf16(a' X) + bf16(B X))
 * (each sum in float32 first, as torch 1.13 computes bfloat16 elementwise
 * ops), and the output is float32(X). MU_NS_GRAM runs the Gram iteration
 * in bfloat16 instead (src/ns_gram_bf16.c: X = bf16(x / (norm_scale ||x||
 * + eps)) in float32, bfloat16 products on R = X X^T, restarts every 2
 * steps, float32 output, a guard that falls back to the standard
 * iteration; unblocked at every size: the blocked iteration below runs
 * the standard one only); MU_NS_AUTO picks it by the cost model
 * (mu_ns_cost_of); MU_NS_PRECOND_AOL is refused (MU_EINVAL). It needs
 * oneDNN (libdnnl.so.2, opened on first use; MU_EIO without it). Bits
 * are fixed by the input, the build and oneDNN's CPU path
 * (mu_blas_info.bf16), as in float32. */
typedef struct mu_ns_opts {
    int steps;             /* number of (a, b, c) triples used */
    const double *coeffs;  /* 3 * steps values: a0 b0 c0 a1 b1 c1 ... */
    double eps;            /* X / (norm_scale * ||X||_F + eps) */
    double norm_scale;     /* 1.0 for the seed; 1.02 for polar_express */
    int path;              /* MU_NS_SYMMETRIC or MU_NS_PLAIN (standard iteration) */
    int method;            /* MU_NS_STANDARD (0, the default), MU_NS_GRAM or MU_NS_AUTO */
    int precond;           /* MU_NS_PRECOND_NONE (0) or MU_NS_PRECOND_AOL (the "aol" preset) */
    int dtype;             /* the iteration's precision: MU_F32 (0, the default: the tensors'
                            * own, float32 or float64) or MU_BF16 (the seed's bfloat16
                            * iteration on float32 tensors, described above) */
    int coeffs_f32;        /* MU_BF16 only: 0 (the default) rounds a, b, c to bfloat16 as the
                            * seed does; 1 applies them in float32, as the authors of the
                            * presets that are not the seed's do (rounded, cans' first
                            * triple maps some singular values past its schedule's range,
                            * and the iteration diverges) */
} mu_ns_opts;

typedef struct mu_ns_workspace mu_ns_workspace;

/* Workspace for matrices of up to rows x cols (either orientation), reused
 * across calls so the step loop never allocates. One call at a time per
 * workspace: it adds one buffer set per worker on first use (the workers:
 * OpenBLAS's thread count when the call starts, or MU_NS_THREADS). In a
 * process with an OpenMP runtime (a host built with -fopenmp) the workers
 * run as a parallel region of that runtime, sharing the host's threads;
 * MU_NS_OPENMP=0 makes them threads of the engine's own instead. */
MU_API int mu_ns_workspace_new(int dtype, int64_t rows, int64_t cols, mu_ns_workspace **out);
/* Free a workspace and its buffers (NULL is a no-op). */
MU_API void mu_ns_workspace_free(mu_ns_workspace *ws);
/* The bytes a workspace holds now (every buffer set of its workers, the
 * Gram iteration's buffers once used, the scheduler's lists, the bfloat16
 * iteration's per-worker buffers once used) into *out (0 on failure): what
 * a step's scratch accounts for it. */
MU_API int mu_ns_workspace_bytes(const mu_ns_workspace *ws, int64_t *out);
/* What the Newton-Schulz calls on a workspace did (mu_ns_workspace_stats). */
typedef struct mu_ns_stats {
    double seconds;        /* wall time inside mu_ns_zeropower / _many */
    int64_t matrices;      /* matrices orthogonalized */
    int64_t residuals;     /* of them, those with a residual (below) */
    double residual_max;   /* the largest residual */
    double residual_sumsq; /* the sum of the residuals' squares */
} mu_ns_stats;
/* The stats of the calls on ws since it was made or last reset, into *out;
 * reset nonzero zeroes them after the copy. The residual of a matrix is
 * ||A - I||_F / sqrt(n) of the Gram matrix A = X X^T (n x n, n the smaller
 * side) that its last step computes anyway, X being the iterate that step
 * starts from: sqrt(mean (s^2 - 1)^2) over X's singular values s, which the
 * last step maps to the output's a s + b s^3 + c s^5 (O(n^2) work, no
 * product). The standard float32 / float64 iteration with steps >= 1 has
 * one; bfloat16, the Gram iteration, the blocked iteration (a long side
 * past one block, src/ns_split.c), zero inputs and 0 steps have none. */
MU_API int mu_ns_workspace_stats(mu_ns_workspace *ws, int reset, mu_ns_stats *out);

/* Orthogonalize in (n x m) or a batch (b x n x m), C-contiguous, into out
 * (same shape and dtype; out may be in). ws may be NULL (allocated inside).
 * The bits of each output matrix depend on its input (and the build and
 * OpenBLAS core) only: not on the thread or worker count, the batch it is
 * in, or where it lives (every BLAS call is single-threaded on a fixed
 * partition of the products into tiles, see src/ns.c). Matrices whose long
 * side reaches 8192 run the blocked iteration (src/ns_split.c, "split
 * Newton-Schulz" below; not the Gram iteration in bfloat16), whose bits a
 * split over any group of ranks gives.
 * A non-finite input fails with MU_ENONFINITE naming the batch index and
 * leaves out untouched; eps = 0 with an all-zero matrix is MU_EINVAL. */
MU_API int mu_ns_zeropower(const mu_tensor *in, mu_tensor *out, const mu_ns_opts *opts,
                           mu_ns_workspace *ws);
/* The iteration opts->method runs for a rows x cols matrix: MU_NS_STANDARD
 * or MU_NS_GRAM (MU_NS_AUTO resolved by the cost model); negative (an MU_E*
 * code) for bad options. */
MU_API int mu_ns_method_for(int64_t rows, int64_t cols, const mu_ns_opts *opts);

/* The cost of one Newton-Schulz of a matrix (mu_ns_cost_of). */
typedef struct mu_ns_cost {
    double flops; /* floating-point operations its products perform (2 per multiply-add) */
    double bytes; /* bytes its products and elementwise passes read and write */
    int method;   /* the iteration it runs: MU_NS_STANDARD or MU_NS_GRAM */
} mu_ns_cost;
/* What one Newton-Schulz of a rows x cols matrix costs with opts, by the
 * project's one cost model (src/ns_cost.c; the scheduler, the distributed
 * plan, the sandbox's budget and `muon check` all use it), into *out: the
 * iteration mu_ns_method_for picks, the flops its products perform as its
 * tile plan runs them (a symmetric product counts the triangle it
 * computes; a step with c = 0 has no A A; a shape of more than one block:
 * the blocked iteration's products, mu__split_plan), and the bytes its
 * products and elementwise passes read and write, each operand once
 * (float32 tensors; the input and output twice for float64; blocked shapes
 * estimated as unblocked). MU_EINVAL for bad options or sizes. */
MU_API int mu_ns_cost_of(int64_t rows, int64_t cols, const mu_ns_opts *opts, mu_ns_cost *out);

/* Orthogonalize count tensors in one call: in[i] into out[i] with opts[i]
 * (each as mu_ns_zeropower takes it: 2-D or a 3-D batch; shapes and
 * options may differ, one dtype per call). One scheduler spreads all their
 * matrices over the workers: the large ones tile by tile on all workers,
 * then the others whole, largest first onto the worker free first. Each
 * output has the bits mu_ns_zeropower gives it alone. ws must hold the
 * largest matrix (NULL: allocated inside); a step loop that reuses it does
 * not allocate. Outputs must not overlap each other or another tensor's
 * input (out[i] may be in[i]). Every tensor is checked (errors name its
 * index) before anything is written. */
MU_API int mu_ns_zeropower_many(int64_t count, const mu_tensor *const *in, mu_tensor *const *out,
                                const mu_ns_opts *const *opts, mu_ns_workspace *ws);

/* Named coefficient schedules ("legacy", "asym5", "polar_express",
 * "deepseekv4", "cans", "polar_express_8", "aol", "cubic5"; their sources in
 * src/ns.c and the README): writes `steps` triples into coeffs (cap triples room) and
 * the preset's norm_scale. steps <= 0 means the preset's natural length;
 * a preset with per-step triples (all but "legacy") stops at its length
 * when asked for more (as the seed's asym5 does); the number written goes
 * to *nsteps (norm_scale and nsteps may be NULL). */
MU_API int mu_ns_preset(const char *name, int steps, double *coeffs, int cap, double *norm_scale,
                        int *nsteps);
/* The preconditioning a preset runs with (mu_ns_opts.precond):
 * MU_NS_PRECOND_AOL for "aol", else MU_NS_PRECOND_NONE. */
MU_API int mu_ns_preset_precond(const char *name);

/* ------------------------------------------------- fused multi-tensor ops */

/* All mu_foreach_* calls take arrays of n contiguous tensors of one dtype
 * (MU_F32 or MU_F64; else MU_EDTYPE, non-contiguous MU_EINVAL), except that
 * optimizer state (momentum's bufs/new_bufs, AdamW's and Lion's moments, and
 * all_finite's xs) may be MU_BF16 beside MU_F32 tensors: loaded exactly,
 * computed in float32, rounded once to nearest even when stored (as
 * mu_tensor_copy does); the other arrays stay MU_F32. Tensors of
 * index i have the same numel (else MU_ESHAPE naming the index). Everything
 * is validated before any memory is touched. Tensors of one index are the
 * same memory or disjoint (partial overlap is MU_EINVAL). Float32 results
 * reproduce the rounding of the torch sequences they replace (see
 * src/foreach.c); results do not depend on the thread count or on the
 * kernel variant (portable C, AVX2, AVX-512: picked per op from the CPU;
 * env MU_FOREACH_SIMD=portable|avx2|avx512 asks for one). Large calls run
 * on the process's CPUs (env MU_FOREACH_THREADS overrides). */

/* Muon momentum as the seed: u = g + m1*buf; buf' = m2*buf + g;
 * nesterov: u = m1*u + g (float32: u = fma(m1, buf, g) as torch's
 * add(alpha=), then separately rounded products and sums). Reads
 * grads/bufs, writes new_bufs and updates (new_bufs may alias bufs for an
 * in-place update; updates must not alias the others). The same pass
 * checks what it writes: returns 1 when every update and every new buffer
 * value (as stored: rounded to bfloat16 for bfloat16 state) is finite; 0
 * when one is NaN or Inf (everything is still written), with *bad (when
 * not NULL) the index of the first such tensor; a negative status on a
 * bad argument (nothing written). A NaN or Inf gradient always shows in
 * its update. In two parts (a step that keeps one buffer per state and
 * updates it in place at its commit), with the same bits: new_bufs NULL
 * writes only the updates, still checking the new buffers as they would
 * be stored; updates NULL writes (and checks) only new_bufs, which may be
 * bufs. Both NULL is MU_EINVAL. */
MU_API int mu_foreach_momentum(int n, mu_tensor *const *grads, mu_tensor *const *bufs,
                               mu_tensor *const *new_bufs, mu_tensor *const *updates,
                               double m1, double m2, int nesterov, int *bad);

/* Decoupled decay + apply: p = fma(alpha, update * scales[i], p * decay),
 * i.e. the seed's update.mul_(s); p.mul_(decay); p.add_(update, alpha=)
 * in one pass without writing update (scales NULL means 1). */
MU_API int mu_foreach_apply(int n, mu_tensor *const *params, mu_tensor *const *updates,
                            const double *scales, double decay, double alpha);

/* Cautious weight decay (weight_decay_mode = "cautious"): as
 * mu_foreach_apply, but the decay multiplies p only where the update the
 * seed subtracts (-alpha * update * scale) has the sign of p:
 * p = fma(alpha, u s, (alpha u s) * p < 0 ? p * decay : p). */
MU_API int mu_foreach_apply_cautious(int n, mu_tensor *const *params, mu_tensor *const *updates,
                                     const double *scales, double decay, double alpha);

/* Whether mu_foreach_apply (cautious = 0) or mu_foreach_apply_cautious
 * (cautious != 0) with these arguments would write only finite values,
 * writing nothing: the same operations, one read of params and updates.
 * Returns 1 when every result is finite; 0 when one is NaN or Inf, with
 * *bad (when not NULL) the index of the first such parameter; a negative
 * status on a bad argument (as mu_foreach_apply). The engine checks its
 * commit with it. */
MU_API int mu_foreach_apply_finite(int n, mu_tensor *const *params, mu_tensor *const *updates,
                                   const double *scales, double decay, double alpha, int cautious,
                                   int *bad);

/* x *= scales[i] (or scale when scales is NULL). */
MU_API int mu_foreach_scale(int n, mu_tensor *const *xs, const double *scales, double scale);

/* torch 2.x's torch.optim.AdamW (bias-corrected, decoupled decay; 1 ulp
 * from torch 1.13's form), step >= 1 (the
 * step number after incrementing); 0 <= beta < 1. */
MU_API int mu_foreach_adamw(int n, mu_tensor *const *params, mu_tensor *const *grads,
                            mu_tensor *const *exp_avgs, mu_tensor *const *exp_avg_sqs,
                            double lr, double beta1, double beta2, double eps,
                            double weight_decay, int64_t step);

/* AdamW without touching the parameters: new moments (new_exp_avgs /
 * new_exp_avg_sqs, which may be exp_avgs / exp_avg_sqs themselves) and the
 * update direction (-lr/bc1 * m') / (sqrt(v')/sqrt(bc2) + eps); then
 * mu_foreach_apply(params, updates, NULL, 1 - lr*weight_decay, 1.0) gives
 * exactly the bits of mu_foreach_adamw. Used where the update is computed
 * before the step commits (atomic steps, replicated state). The same pass
 * checks: with params (read only, else NULL) the value that apply with
 * decay and alpha would write, p * decay + alpha * update, else the update,
 * and the new moments as stored. Returns 1 when all are finite, 0 when one
 * is NaN or Inf (everything is still written) with *bad (when not NULL)
 * the first such index, or a negative status (nothing written). */
MU_API int mu_foreach_adamw_update(int n, mu_tensor *const *grads, mu_tensor *const *exp_avgs,
                                   mu_tensor *const *exp_avg_sqs, mu_tensor *const *new_exp_avgs,
                                   mu_tensor *const *new_exp_avg_sqs, mu_tensor *const *updates,
                                   double lr, double beta1, double beta2, double eps, int64_t step,
                                   mu_tensor *const *params, double decay, double alpha, int *bad);

/* Lion (Chen et al. 2023) without touching the parameters: the update
 * direction sign(beta1*m + (1-beta1)*g) into updates (sign(0) = 0) and the
 * new moment beta2*m + (1-beta2)*g into new_exp_avgs (which may be
 * exp_avgs itself), reading grads and exp_avgs (m). Each is one fused
 * multiply-add over the rounded product, as lion-pytorch's
 * m.mul(beta1).add(g, alpha=1-beta1) in float32. Then
 * mu_foreach_apply(params, updates, NULL, 1 - lr*weight_decay, -lr) is
 * Lion's step. updates must not alias the others. Checks as
 * mu_foreach_adamw_update (params, decay, alpha: the apply checked; bad;
 * returns 1, 0 or a negative status). */
MU_API int mu_foreach_lion_update(int n, mu_tensor *const *grads, mu_tensor *const *exp_avgs,
                                  mu_tensor *const *new_exp_avgs, mu_tensor *const *updates,
                                  double beta1, double beta2, mu_tensor *const *params,
                                  double decay, double alpha, int *bad);

/* 1 if every element of every tensor is finite; else 0 and *bad is the
 * index of the first tensor holding NaN/Inf (negative on a bad argument). */
MU_API int mu_foreach_all_finite(int n, mu_tensor *const *xs, int *bad);
/* out[i] = the sum of the squares of xs[i]'s elements (contiguous tensors,
 * each of any dtype), in double: eight partial sums over the elements in
 * order (element k goes to sum k % 8), added in order at the end; one
 * thread, the same bits every call. For the step's statistics (gradient
 * norm, update RMS). */
MU_API int mu_foreach_sumsq(int n, mu_tensor *const *xs, double *out);

/* Copy each src[i] into dst at element offset offsets[i] (pack), or back
 * (unpack). dst/src batch buffers are contiguous, of the tensors' dtype;
 * offsets[i] + numel must fit (else MU_ESHAPE). */
MU_API int mu_foreach_pack(int n, mu_tensor *const *srcs, mu_tensor *dst, const int64_t *offsets);
/* Copy src at element offset offsets[i] into each dsts[i] (the inverse of
 * mu_foreach_pack). */
MU_API int mu_foreach_unpack(int n, const mu_tensor *src, mu_tensor *const *dsts,
                             const int64_t *offsets);

/* Benchmark helper (not API): STREAM triad dst = a + s*b over one array
 * each, threaded like the ops above; measures the machine's bandwidth. */
MU_API int mu__foreach_triad(mu_tensor *dst, const mu_tensor *a, const mu_tensor *b, double s);

/* --------------------------------------------------------- communicator */

/* Collectives for distributed steps (src/comm.c). A mu_comm wraps a private
 * duplicate of an MPI communicator; without MPI every communicator is a
 * single process (size 1) and collectives are local copies. Counts and
 * displacements are in elements of the dtype (MU_F32/MU_F64; the moves carry MU_BF16 too). Each handle
 * counts its calls, the logical payload bytes it sent to / received from
 * OTHER ranks (self copies count nothing), and seconds spent in calls. */
typedef struct mu_comm mu_comm;
typedef struct mu_comm_request mu_comm_request;
/* All-reduce ops (mu_comm_allreduce_*). */
enum { MU_COMM_SUM = 0, MU_COMM_MAX = 1, MU_COMM_MIN = 2 };

typedef struct mu_comm_stats {
    int64_t calls;            /* collective calls made */
    int64_t bytes_sent;       /* payload bytes sent to other ranks */
    int64_t bytes_recv;       /* payload bytes received from other ranks */
    double seconds;           /* wall time spent in the calls */
    int64_t nonblocking;      /* of calls: non-blocking ones (counted at their wait) */
    int64_t done_before_wait; /* of those: already complete when the wait began */
} mu_comm_stats;

/* 1 if built with Open MPI. */
MU_API int mu_comm_have_mpi(void);
/* MPI_COMM_WORLD (initializing MPI with MPI_Init_thread if needed). */
MU_API int mu_comm_world(mu_comm **out);
/* A size-1 communicator of this process alone (never touches MPI). */
MU_API int mu_comm_self(mu_comm **out);
/* Wrap a caller's communicator: mpi_comm_ptr points at an MPI_Comm. */
MU_API int mu_comm_from_handle(void *mpi_comm_ptr, mu_comm **out);
/* MPI_Comm_split: ranks with the same color form one communicator, ordered
 * by key (then by rank). Collective over c. */
MU_API int mu_comm_split(mu_comm *c, int color, int key, mu_comm **out);
/* Free a communicator (its MPI duplicate too, unless MPI was finalized);
 * NULL is a no-op. */
MU_API void mu_comm_free(mu_comm *c);
/* This process's rank in c (0-based); -1 for NULL. */
MU_API int mu_comm_rank(const mu_comm *c);
/* The number of ranks of c; -1 for NULL. */
MU_API int mu_comm_size(const mu_comm *c);
/* c's counters into *out (MU_EINVAL for NULL). */
MU_API int mu_comm_get_stats(const mu_comm *c, mu_comm_stats *out);
/* Zero c's counters (NULL is a no-op). */
MU_API void mu_comm_reset_stats(mu_comm *c);

/* All-to-all-v: to each peer i, sendcounts[i] elements of dtype from
 * sendbuf + sdispls[i]; from it, recvcounts[i] into recvbuf + rdispls[i].
 * The arrays have size(c) entries, >= 0 (MU_EINVAL naming the peer for a
 * negative or overflowing one); collective over c; MU_ECOMM for an MPI
 * failure. */
MU_API int mu_comm_alltoallv(mu_comm *c, int dtype, const void *sendbuf, const int64_t *sendcounts,
                             const int64_t *sdispls, void *recvbuf, const int64_t *recvcounts,
                             const int64_t *rdispls);
/* The same, non-blocking: *out is a request to complete with
 * mu_comm_wait; the buffers stay in use until then. */
MU_API int mu_comm_ialltoallv(mu_comm *c, int dtype, const void *sendbuf, const int64_t *sendcounts,
                              const int64_t *sdispls, void *recvbuf, const int64_t *recvcounts,
                              const int64_t *rdispls, mu_comm_request **out);
/* All-gather-v: every rank's sendcount elements land in recvbuf at
 * displs[r] (recvcounts[r] from rank r). Collective over c. */
MU_API int mu_comm_allgatherv(mu_comm *c, int dtype, const void *sendbuf, int64_t sendcount,
                              void *recvbuf, const int64_t *recvcounts, const int64_t *displs);
/* Broadcast n elements of dtype at buf from rank root. Collective over c. */
MU_API int mu_comm_bcast(mu_comm *c, int dtype, void *buf, int64_t n, int root);
/* Broadcast nbytes raw bytes at buf from rank root. */
MU_API int mu_comm_bcast_bytes(mu_comm *c, void *buf, int64_t nbytes, int root);
/* mu_comm_bcast, non-blocking: *out is a request for mu_comm_wait. */
MU_API int mu_comm_ibcast(mu_comm *c, int dtype, void *buf, int64_t n, int root,
                          mu_comm_request **out);
/* Completes and frees a request (NULL is ok). A request must be waited
 * for even on error paths (MPI cannot cancel a collective). With
 * MPI_THREAD_MULTIPLE (what mu_comm_world asks for) a per-communicator
 * thread progresses pending requests while the caller computes. */
MU_API int mu_comm_wait(mu_comm_request *req);
/* *done = 1 when the request completed (it still needs mu_comm_wait). */
MU_API int mu_comm_test(mu_comm_request *req, int *done);
/* In-place all-reduce (op: MU_COMM_SUM / MAX / MIN). */
MU_API int mu_comm_allreduce_i64(mu_comm *c, int64_t *buf, int64_t n, int op);
/* In-place all-reduce of n doubles (op as above). */
MU_API int mu_comm_allreduce_f64(mu_comm *c, double *buf, int64_t n, int op);
/* Wait until every rank of c has called it (MU_EINVAL for NULL). */
MU_API int mu_comm_barrier(mu_comm *c);
/* MPI_Finalize, only if this library initialized MPI, and only once. */
MU_API int mu_comm_finalize(void);
/* MPI_Abort(MPI_COMM_WORLD, code) when MPI runs with more than one rank;
 * otherwise returns (the caller exits as usual). */
MU_API void mu_comm_abort(int code);
/* World size: from MPI if initialized, else from the launcher's environment
 * (OMPI_COMM_WORLD_SIZE / PMI_SIZE), else 1. Does not initialize MPI. */
MU_API int mu_comm_world_size(void);
/* This process's world rank: from MPI if initialized, else from the
 * launcher's environment (OMPI_COMM_WORLD_RANK / PMI_RANK), else 0. Does
 * not initialize MPI. */
MU_API int mu_comm_world_rank(void);

/* ---------------------------------------------- split Newton-Schulz */

/* For the Lua router (src/ns_split.c); mu__split_* names may change
 * without notice. */

/* The blocked iteration. A rows x cols matrix (n x m with n <= m after the
 * transpose of a tall one) whose long side m is at least 8192 is cut, along
 * m, into k = ceil(m / 2048) blocks X_1..X_k of 2048 (the last shorter):
 * column blocks of a wide matrix, row blocks of a tall one. Per step each
 * block's partial Gram product P_j = X_j X_j^T is formed on its own; A =
 * ((P_1 + P_2) + P_3) + ... in block order; the small side (B = b A + c A A,
 * or the Gram iteration's n x n products) is cut into row stripes of 128
 * (bfloat16: 192) rows, each one BLAS/oneDNN call on the upper trapezoid;
 * then X_j <- (B + a I) X_j per block. Every call's sizes and every sum's
 * order come from the shape only, so a group of g ranks, each holding some
 * blocks and some stripes, gets the bits one process gets, for every g
 * (g > k too: ranks without blocks still take stripes). The Frobenius norm
 * is summed per block (power-of-two scaled, float64) in block order.
 * Matrices below the threshold (k = 1), MU_NS_PLAIN, the AOL
 * preconditioning and the Gram iteration in bfloat16 (method MU_NS_GRAM,
 * or MU_NS_AUTO resolving to it) keep the unblocked iterations of src/ns.c
 * and src/ns_gram_bf16.c: one block, at every size. The knob
 * MU_NS_SPLIT_PLAN="LONG,BLOCK,STRIPE" (tests, measurements; "off": never
 * block) replaces 8192, 2048 and the stripe rows (any other value is
 * ignored, as a bad MU_NS_THREADS is: the defaults hold); every process of
 * a run must then set the same (a distributed engine's first step checks
 * it, muon.step's agreed settings). */
typedef struct mu__split mu__split;
/* Exchange kinds a rank's step machine asks its driver for. */
enum { MU__SPLIT_ALLTOALLV = 1, MU__SPLIT_ALLGATHERV = 2 };
/* One exchange (mu__split_next): counts and displacements in elements of
 * dtype (MU_F32, MU_F64 or MU_BF16), g entries each, as mu_comm_alltoallv
 * (sendcounts, sdispls, recvcounts, rdispls) and mu_comm_allgatherv
 * (sendcount, recvcounts, rdispls) take them. The pointers stay valid until
 * the next call on the machine. */
typedef struct mu__split_xfer {
    int op;                              /* MU__SPLIT_ALLTOALLV or MU__SPLIT_ALLGATHERV */
    int dtype;                           /* of the elements */
    const void *send;                    /* this rank's send buffer */
    int64_t sendcount;                   /* ALLGATHERV: elements this rank sends */
    const int64_t *sendcounts, *sdispls; /* ALLTOALLV: to each peer */
    void *recv;                          /* the receive buffer */
    const int64_t *recvcounts, *rdispls; /* from each peer */
} mu__split_xfer;
/* A rank's view of a plan (mu__split_info). */
typedef struct mu__split_info {
    int64_t blocks, width;       /* k blocks of width (the last shorter) along the long side */
    int64_t stripes, stripe_rows; /* of the n x n side */
    int group, rank;              /* as made */
    int64_t first_block, nblocks; /* this rank's blocks: [first_block, first_block + nblocks) */
    int dim;                      /* the long side of rows x cols: 0 (rows: tall) or 1 (cols) */
    int64_t start, length;        /* this rank's piece along dim (length 0: none) */
    int64_t exchanges;            /* exchanges per matrix (the Gram guard's fallback adds more) */
    int64_t bytes_sent, bytes_recv; /* per matrix: payload to / from other ranks, as
                                     * mu_comm_stats counts it */
    int64_t call_exchanges, call_bytes_sent, call_bytes_recv; /* per call, once */
    int64_t workspace_bytes;      /* buffers this machine holds */
    double flops;                 /* per matrix: this rank's share of the products (2 per
                                   * multiply-add, as mu_ns_cost_of counts them): its blocks'
                                   * partial products and updates, its stripes */
} mu__split_info;
/* The blocks of a rows x cols matrix under opts: *blocks = k (1: not
 * blocked), *width (either may be NULL). */
MU_API int mu__split_plan(int64_t rows, int64_t cols, const mu_ns_opts *opts, int64_t *blocks,
                          int64_t *width);
/* Rank `rank` of a group of `group` ranks running rows x cols matrices of
 * dtype (MU_F32, MU_F64) with opts (copied): its blocks (contiguous, the
 * group's k blocks dealt in rank order), its stripes (dealt by cost, the
 * largest first to the least loaded rank) and its buffers, allocated here
 * once (the step machine allocates nothing). The shape must have k > 1
 * (MU_EINVAL otherwise). */
MU_API int mu__split_new(int dtype, int64_t rows, int64_t cols, const mu_ns_opts *opts,
                         int group, int rank, mu__split **out);
/* Free a machine (NULL is a no-op). */
MU_API void mu__split_free(mu__split *s);
/* The plan as this rank sees it (mu__split_info) into *out. */
MU_API int mu__split_get_info(const mu__split *s, mu__split_info *out);
/* The info rank `rank` of a group of `group` would have (mu__split_new's
 * arguments and checks), without making the machine or its buffers: what
 * the cost model and the distributed plan weigh a split matrix by. */
MU_API int mu__split_info_of(int dtype, int64_t rows, int64_t cols, const mu_ns_opts *opts,
                             int group, int rank, mu__split_info *out);
/* Start a call: in and out hold this rank's piece of every matrix, C
 * contiguous, (batch x) piece rows x piece cols (a tall matrix's rows
 * [start, start + length), a wide one's columns), dtype as made; out may be
 * in. A bad argument is reported to every rank by the first exchange (all
 * fail, nothing written). */
MU_API int mu__split_begin(mu__split *s, const mu_tensor *in, mu_tensor *out);
/* Run the machine to its next exchange: 1 with *x filled (the driver
 * makes the exchange on the group, then calls again), 0 when the call is
 * done (out written), or a negative MU_E* code, the same on every rank
 * (NaN/Inf input, a rank's bad argument or failure). The phases, per
 * matrix: norms (all-gather); per step, the partial products of the own
 * blocks (all-to-all to the stripes' owners), the combine in block order
 * (all-gather of A's stripes), the small-side stripes (all-gather), the
 * update of the own blocks; then one status all-gather per call. With
 * group 1 it never asks for an exchange. */
MU_API int mu__split_next(mu__split *s, mu__split_xfer *x);
/* The whole call over c (size group, this process rank `rank`): begin,
 * then next with each exchange on c. */
MU_API int mu__split_run(mu__split *s, mu_comm *c, const mu_tensor *in, mu_tensor *out);

#ifndef MU_FFI_CDEF
#ifdef __cplusplus
}
#endif
#endif
#endif /* MUON_FFI_H */
