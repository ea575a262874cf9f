/*
 * Private tensor helpers (src/tensor.c): layout validation with checked
 * arithmetic, and the one strided iterator behind every elementwise and
 * reduction loop (src/tensor_math.c).
 */
#ifndef MU_TENSOR_INTERNAL_H
#define MU_TENSOR_INTERNAL_H

#include "muon_internal.h"

/* ------------------------------------------------------ layout checks */

/* Element offsets (from the storage base) of the first and last element a
 * view addresses, computed with overflow checks. Strides of size-1 dims are
 * ignored (never followed). 0 on success; -1 when a size or stride is
 * negative or the arithmetic overflows. For an empty view *lo = *hi = -1. */
int mu__layout_extent(int ndim, const int64_t *dims, const int64_t *strides, int64_t offset,
                      int64_t *lo, int64_t *hi);

/* Validate a tensor handle before touching its memory: dtype, ndim, sizes,
 * strides >= 0, data == storage base + offset, and every element it
 * addresses inside its storage. On failure MU_EINVAL with a message naming
 * `what` (e.g. "add: other"). Views are checked when they are made, so
 * this only fails for handles whose fields were changed through the FFI. */
int mu__tensor_check(const mu_tensor *t, const char *what);

/* 1 if the tensor's elements are distinct and fill [lo, hi] completely
 * (contiguous up to a permutation of dims: torch's
 * is_non_overlapping_and_dense). */
int mu__tensor_dense(const mu_tensor *t);
/* 1 if two distinct elements of t share a memory location. */
int mu__tensor_self_overlap(const mu_tensor *t);
/* Written tensor `out` against a read tensor `in`: MU_EINVAL when they
 * share memory in a way whose result would depend on the visiting order
 * (both dense, the byte ranges intersect, and the layouts differ); the same
 * layout (in-place x op= x) is fine. Non-dense views whose ranges
 * intersect are accepted, as torch does. */
int mu__check_overlap(const mu_tensor *out, const mu_tensor *in, const char *what);
/* 1 if a and b share storage and their byte ranges intersect. */
int mu__ranges_overlap(const mu_tensor *a, const mu_tensor *b);

/* "[2, 3]" into buf (size n). */
const char *mu__shape_str(int ndim, const int64_t *dims, char *buf, size_t n);

/* ------------------------------------------------------------ iterator */

enum { MU__ITER_MAX_OPS = 4 };
/* Keep the last dim as the inner loop even when its size is 0 or 1, and
 * never merge it with outer dims (reductions: one call per output element
 * over the whole reduced dim). */
enum { MU__ITER_KEEP_INNER = 1 };

/* A walk in row-major order over a shape, with up to MU__ITER_MAX_OPS
 * operands, each a base pointer with byte strides (0 along broadcast
 * dims). Adjacent dims that are contiguous for every operand are merged,
 * size-1 dims dropped, so a contiguous walk is one inner call. */
typedef struct mu__iter {
    int ndim, nops, flags;
    int64_t dims[MU_MAX_DIMS];
    char *base[MU__ITER_MAX_OPS];
    int64_t stride[MU__ITER_MAX_OPS][MU_MAX_DIMS]; /* bytes */
} mu__iter;

/* Inner loop: n elements; operand k starts at p[k] and advances s[k] bytes
 * per element. A non-zero return stops the walk (returned by run). */
typedef int (*mu__loop_fn)(void *ctx, int64_t n, char *const *p, const int64_t *s);

void mu__iter_init(mu__iter *it, int ndim, const int64_t *dims, int flags);
/* Add tensor t, broadcast to the iterator's shape (NumPy rules: trailing
 * dims aligned, size-1 dims repeated). The caller checked compatibility
 * (mu__check_broadcast) and validity (mu__tensor_check). */
void mu__iter_add(mu__iter *it, const mu_tensor *t);
/* Add an operand with explicit element strides over the iterator's dims. */
void mu__iter_add_strided(mu__iter *it, void *base, const int64_t *elem_strides, size_t esize);
/* Add one value repeated everywhere (stride 0). */
void mu__iter_add_scalar(mu__iter *it, void *value);
int mu__iter_run(mu__iter *it, mu__loop_fn fn, void *ctx);

/* MU_ESHAPE unless t broadcasts to the shape (ndim, dims) (NumPy rules:
 * trailing dims aligned, each of t's sizes equal or 1). */
int mu__check_broadcast(const mu_tensor *t, int ndim, const int64_t *dims, const char *what);

#endif
