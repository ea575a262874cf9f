/*
 * Strided float32/float64 tensors over refcounted storage: construction,
 * views, layout checks (checked arithmetic, one place) and the strided
 * iterator used by every elementwise and reduction loop (tensor_math.c).
 */
#include "tensor_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The dtypes, from the one table (MU_DTYPES in muon_ffi.h), whose values
 * the enums of muon.h (MU_F32, MU_F64) and muon_ffi.h (MU_BF16,
 * MU_DTYPE_COUNT) must hold. */
#define MU__DTYPE_CHECK(name, value, bytes, lname, fname) \
    _Static_assert(MU_##name == (value), "MU_" #name " differs from its MU_DTYPES row");
MU_DTYPES(MU__DTYPE_CHECK)
#undef MU__DTYPE_CHECK
#define MU__DTYPE_ONE(name, value, bytes, lname, fname) +1
_Static_assert(0 MU_DTYPES(MU__DTYPE_ONE) == MU_DTYPE_COUNT, "MU_DTYPE_COUNT is not the number of MU_DTYPES rows");
#undef MU__DTYPE_ONE

static const struct dtype_row {
    size_t bytes;
    const char *name, *file_name;
} DTYPES[MU_DTYPE_COUNT] = {
#define MU__DTYPE_ROW(name, value, bytes, lname, fname) [MU_##name] = { bytes, lname, fname },
    MU_DTYPES(MU__DTYPE_ROW)
#undef MU__DTYPE_ROW
};

static const struct dtype_row *dtype_row(int dtype)
{
    return dtype >= 0 && dtype < MU_DTYPE_COUNT ? &DTYPES[dtype] : NULL;
}

size_t mu_dtype_size(int dtype) { return dtype_row(dtype) ? dtype_row(dtype)->bytes : 0; }
const char *mu_dtype_name(int dtype) { return dtype_row(dtype) ? dtype_row(dtype)->name : NULL; }
const char *mu_dtype_file_name(int dtype)
{
    return dtype_row(dtype) ? dtype_row(dtype)->file_name : NULL;
}

/* Checked int64 arithmetic (src/muon_internal.h). */
#define ck_mul mu__mul_i64
#define ck_add mu__add_i64

int64_t mu__shape_numel(int ndim, const int64_t *shape)
{
    /* span: product of the extents counting 0 as 1, so that the strides of
     * a contiguous layout fit too, in bytes of the widest dtype (a
     * (0, 10^16, 10^4) shape is rejected). */
    int64_t n = 1, span = 8;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return -1;
        if (ck_mul(span, shape[i] ? shape[i] : 1, &span)) return -1;
        n = shape[i] ? n * shape[i] : 0; /* n <= span / 8 */
    }
    return n;
}

int mu__layout_extent(int ndim, const int64_t *dims, const int64_t *strides, int64_t offset,
                      int64_t *lo, int64_t *hi)
{
    int64_t last = offset;
    if (offset < 0 || ndim < 0 || ndim > MU_MAX_DIMS) return -1;
    int empty = 0;
    for (int i = 0; i < ndim; i++) {
        if (dims[i] < 0) return -1;
        if (dims[i] == 0) empty = 1;
        if (dims[i] <= 1) continue; /* a size-1 dim's stride is never followed */
        int64_t step;
        if (strides[i] < 0 || ck_mul(dims[i] - 1, strides[i], &step) || ck_add(last, step, &last))
            return -1;
    }
    if (mu__shape_numel(ndim, dims) < 0) return -1;
    *lo = empty ? -1 : offset;
    *hi = empty ? -1 : last;
    return 0;
}

const char *mu__shape_str(int ndim, const int64_t *dims, char *buf, size_t n)
{
    size_t len = 0;
    buf[0] = '\0';
    len += (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && len < n; i++)
        len += (size_t)snprintf(buf + len, n - len, "%s%lld", i ? ", " : "", (long long)dims[i]);
    if (len < n) snprintf(buf + len, n - len, "]");
    return buf;
}

int mu__tensor_check(const mu_tensor *t, const char *what)
{
    if (!t) return mu__fail(MU_EINVAL, "%s is NULL", what);
    size_t es = mu_dtype_size(t->scalar);
    if (!es) return mu__fail(MU_EDTYPE, "%s has unsupported dtype %d", what, (int)t->scalar);
    if (t->ndim < 0 || t->ndim > MU_MAX_DIMS)
        return mu__fail(MU_EINVAL, "%s has %d dims (0..%d allowed)", what, (int)t->ndim,
                        MU_MAX_DIMS);
    const mu_storage *s = t->storage;
    int64_t lo, hi, base_off, end;
    if (!s) return mu__fail(MU_EINVAL, "%s has no storage", what);
    if (mu__layout_extent(t->ndim, t->dims, t->strides, t->offset, &lo, &hi))
        return mu__fail(MU_EINVAL, "%s has a bad layout (negative size or stride, or sizes "
                        "and strides that overflow)", what);
    if (ck_mul(t->offset, (int64_t)es, &base_off) ||
        (char *)t->data - (char *)s->base != base_off)
        return mu__fail(MU_EINVAL, "%s: data pointer and offset disagree", what);
    if (lo >= 0 && (ck_add(hi, 1, &end) || ck_mul(end, (int64_t)es, &end) || end > s->nbytes))
        return mu__fail(MU_EINVAL, "%s addresses elements %lld..%lld outside its storage of "
                        "%lld bytes", what, (long long)lo, (long long)hi, (long long)s->nbytes);
    return MU_OK;
}

int mu_tensor_check(const mu_tensor *t) { return mu__tensor_check(t, "tensor"); }

/* Dims of size > 1 ordered by increasing stride (insertion sort, <= 8). */
static int sorted_dims(const mu_tensor *t, int64_t *dims, int64_t *strides)
{
    int n = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (t->dims[i] <= 1) continue;
        int j = n++;
        while (j > 0 && strides[j - 1] > t->strides[i]) {
            strides[j] = strides[j - 1];
            dims[j] = dims[j - 1];
            j--;
        }
        strides[j] = t->strides[i];
        dims[j] = t->dims[i];
    }
    return n;
}

int mu__tensor_dense(const mu_tensor *t)
{
    int64_t d[MU_MAX_DIMS], s[MU_MAX_DIMS], expect = 1;
    int n = sorted_dims(t, d, s);
    for (int i = 0; i < n; i++) {
        if (s[i] != expect) return 0;
        expect *= d[i];
    }
    return 1;
}

int mu__tensor_self_overlap(const mu_tensor *t)
{
    /* Sufficient for distinct elements: each stride exceeds the span of
     * the smaller ones (every view made here satisfies it). */
    int64_t d[MU_MAX_DIMS], s[MU_MAX_DIMS], span = 0;
    int n = sorted_dims(t, d, s);
    if (mu_tensor_numel(t) <= 1) return 0;
    for (int i = 0; i < n; i++) {
        if (s[i] <= span) return 1;
        span += (d[i] - 1) * s[i]; /* bounded by the checked extent */
    }
    return 0;
}

int mu__ranges_overlap(const mu_tensor *a, const mu_tensor *b)
{
    if (!a || !b || a->storage != b->storage) return 0;
    int64_t alo, ahi, blo, bhi;
    if (mu__layout_extent(a->ndim, a->dims, a->strides, a->offset, &alo, &ahi) ||
        mu__layout_extent(b->ndim, b->dims, b->strides, b->offset, &blo, &bhi) || alo < 0 ||
        blo < 0)
        return 0; /* empty (invalid layouts were rejected before) */
    /* in bytes; bounded by the checked storage size */
    int64_t ae = (int64_t)mu_dtype_size(a->scalar), be = (int64_t)mu_dtype_size(b->scalar);
    return alo * ae < (bhi + 1) * be && blo * be < (ahi + 1) * ae;
}

int mu__check_overlap(const mu_tensor *out, const mu_tensor *in, const char *what)
{
    if (!mu__ranges_overlap(out, in)) return MU_OK;
    /* Same place for every element: in, broadcast to out's shape, has out's
     * data pointer, dtype and strides along out's non-trivial dims. */
    int same = out->data == in->data && out->scalar == in->scalar && in->ndim <= out->ndim;
    for (int i = 0; same && i < out->ndim; i++) {
        int j = i - (out->ndim - in->ndim);
        int64_t st = j < 0 || in->dims[j] == 1 ? 0 : in->strides[j];
        if (out->dims[i] > 1 && st != out->strides[i]) same = 0;
    }
    if (same) return MU_OK;
    if (mu__tensor_dense(out) && mu__tensor_dense(in))
        return mu__fail(MU_EINVAL, "%s shares memory with the output in a different layout "
                        "(partial overlap); clone() it first", what);
    return MU_OK;
}

static int check_dims(int dtype, int ndim, const int64_t *shape)
{
    if (!mu_dtype_size(dtype)) return mu__fail(MU_EDTYPE, "unsupported dtype %d", dtype);
    if (ndim < 0 || ndim > MU_MAX_DIMS)
        return mu__fail(MU_EINVAL, "ndim %d is outside 0..%d", ndim, MU_MAX_DIMS);
    if (ndim > 0 && !shape) return mu__fail(MU_EINVAL, "shape is NULL");
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0)
            return mu__fail(MU_EINVAL, "negative size %lld in dim %d", (long long)shape[i], i);
    if (mu__shape_numel(ndim, shape) < 0) return mu__fail(MU_EINVAL, "shape too large");
    return MU_OK;
}

/* C-order strides; -1 when they overflow. */
static int contiguous_strides(int ndim, const int64_t *shape, int64_t *stride)
{
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        stride[i] = s;
        if (i > 0 && ck_mul(s, shape[i] > 0 ? shape[i] : 1, &s)) return -1;
    }
    return 0;
}

static void storage_release(mu_storage *s)
{
    if (!s) return;
    if (atomic_fetch_sub(&s->refcount, 1) == 1) {
        if (s->owned) free(s->base);
        free(s);
    }
}

int mu__tensor_over(mu_storage *s, int dtype, int64_t offset, int ndim, const int64_t *shape,
                    const int64_t *stride, mu_tensor **out)
{
    /* Every view is made here: check that it stays inside its storage. */
    int64_t lo, hi, end, base_off, es = (int64_t)mu_dtype_size(dtype);
    if (mu__layout_extent(ndim, shape, stride, offset, &lo, &hi))
        return mu__fail(MU_EINVAL, "view with negative or overflowing sizes, strides or offset");
    /* An empty view addresses nothing, and every view of it is empty: its
     * offset only has to be valid, and is pinned at the storage's end when
     * it lies beyond (a select on a huge-strided empty tensor), so that its
     * data pointer stays inside the storage's bytes. */
    if (ck_mul(offset, es, &base_off) ||
        (lo >= 0 && (ck_add(hi, 1, &end) || ck_mul(end, es, &end) || end > s->nbytes)))
        return mu__fail(MU_EINVAL, "view of elements %lld..%lld is outside its storage of %lld "
                        "elements", (long long)lo, (long long)hi, (long long)(s->nbytes / es));
    if (lo < 0 && base_off > s->nbytes) {
        offset = s->nbytes / es;
        base_off = offset * es;
    }
    mu_tensor *t = calloc(1, sizeof *t);
    if (!t) return mu__fail(MU_ENOMEM, "out of memory for a tensor handle");
    atomic_fetch_add(&s->refcount, 1);
    t->storage = s;
    t->scalar = dtype;
    t->ndim = ndim;
    t->offset = offset;
    t->data = (char *)s->base + base_off;
    for (int i = 0; i < ndim; i++) {
        t->dims[i] = shape[i];
        t->strides[i] = stride[i];
    }
    *out = t;
    return MU_OK;
}

static int storage_new(void *base, int64_t nbytes, int owned, mu_storage **out)
{
    mu_storage *s = calloc(1, sizeof *s);
    if (!s) return mu__fail(MU_ENOMEM, "out of memory for a storage");
    s->base = base;
    s->nbytes = nbytes;
    s->owned = owned;
    atomic_init(&s->refcount, 0);
    *out = s;
    return MU_OK;
}

static int make_tensor(int dtype, int ndim, const int64_t *shape, const int64_t *strides,
                       void *data, int owned, mu_tensor **out)
{
    int64_t stride[MU_MAX_DIMS], lo, hi, nbytes = 0;
    mu_storage *s = NULL;
    if (strides) memcpy(stride, strides, sizeof(int64_t) * ndim);
    else if (contiguous_strides(ndim, shape, stride)) return mu__fail(MU_EINVAL, "shape too large");
    /* The storage spans the elements the layout addresses (for a caller's
     * strided buffer: up to its last element). */
    if (mu__layout_extent(ndim, shape, stride, 0, &lo, &hi) ||
        (hi >= 0 && (ck_add(hi, 1, &nbytes) || ck_mul(nbytes, (int64_t)mu_dtype_size(dtype), &nbytes))))
        return mu__fail(MU_EINVAL, "negative or overflowing strides");
    int rc = storage_new(data, nbytes, owned, &s);
    if (rc) return rc;
    rc = mu__tensor_over(s, dtype, 0, ndim, shape, stride, out);
    if (rc) free(s);
    return rc;
}

int mu_tensor_new(int dtype, int ndim, const int64_t *shape, mu_tensor **out)
{
    if (!out) return mu__fail(MU_EINVAL, "out is NULL");
    *out = NULL;
    int rc = check_dims(dtype, ndim, shape);
    if (rc) return rc;
    int64_t n = mu__shape_numel(ndim, shape);
    void *data = calloc((size_t)(n > 0 ? n : 1), mu_dtype_size(dtype));
    if (!data)
        return mu__fail(MU_ENOMEM, "cannot allocate %lld elements", (long long)n);
    rc = make_tensor(dtype, ndim, shape, NULL, data, 1, out);
    if (rc) free(data);
    return rc;
}

int mu_tensor_wrap(int dtype, int ndim, const int64_t *shape, const int64_t *strides, void *data,
                   mu_tensor **out)
{
    if (!out) return mu__fail(MU_EINVAL, "out is NULL");
    *out = NULL;
    int rc = check_dims(dtype, ndim, shape);
    if (rc) return rc;
    if (!data && mu__shape_numel(ndim, shape) > 0)
        return mu__fail(MU_EINVAL, "data pointer is NULL for a non-empty tensor");
    return make_tensor(dtype, ndim, shape, strides, data, 0, out);
}

void mu_tensor_free(mu_tensor *t)
{
    if (!t) return;
    storage_release(t->storage);
    free(t);
}

int64_t mu_tensor_numel(const mu_tensor *t)
{
    if (!t || t->ndim < 0 || t->ndim > MU_MAX_DIMS) return -1;
    return mu__shape_numel(t->ndim, t->dims);
}

int mu_tensor_is_contiguous(const mu_tensor *t)
{
    if (!t || t->ndim < 0 || t->ndim > MU_MAX_DIMS) return 0;
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->dims[i] == 0) return 1;
        if (t->dims[i] != 1 && t->strides[i] != s) return 0;
        if (ck_mul(s, t->dims[i], &s)) return 0; /* (a handle changed through the FFI) */
    }
    return 1;
}

int mu_tensor_same_storage(const mu_tensor *a, const mu_tensor *b)
{
    return a && b && a->storage == b->storage;
}

int mu_tensor_view(const mu_tensor *t, int ndim, const int64_t *shape, mu_tensor **out)
{
    if (!out) return mu__fail(MU_EINVAL, "out is NULL");
    *out = NULL;
    int vrc = mu__tensor_check(t, "tensor");
    if (vrc) return vrc;
    if (ndim < 0 || ndim > MU_MAX_DIMS)
        return mu__fail(MU_EINVAL, "ndim %d is outside 0..%d", ndim, MU_MAX_DIMS);
    if (ndim > 0 && !shape) return mu__fail(MU_EINVAL, "view: shape is NULL");
    if (!mu_tensor_is_contiguous(t))
        return mu__fail(MU_ESTATE, "view needs a contiguous tensor (call contiguous() first)");
    int64_t sh[MU_MAX_DIMS], known = 1, numel = mu_tensor_numel(t);
    int infer = -1;
    for (int i = 0; i < ndim; i++) {
        sh[i] = shape[i];
        if (shape[i] == -1) {
            if (infer >= 0) return mu__fail(MU_EINVAL, "only one dimension may be -1");
            infer = i;
        } else if (shape[i] < 0) {
            return mu__fail(MU_EINVAL, "negative size %lld in dim %d", (long long)shape[i], i);
        } else if (ck_mul(known, shape[i], &known)) {
            return mu__fail(MU_EINVAL, "view shape too large (the sizes overflow)");
        }
    }
    if (infer >= 0) {
        if (known == 0 || numel % known)
            return mu__fail(MU_ESHAPE, "cannot infer dim %d: %lld elements do not divide by %lld",
                            infer, (long long)numel, (long long)known);
        sh[infer] = numel / known;
        known = numel;
    }
    if (known != numel)
        return mu__fail(MU_ESHAPE, "view of %lld elements as a shape of %lld elements",
                        (long long)numel, (long long)known);
    int64_t st[MU_MAX_DIMS];
    if (contiguous_strides(ndim, sh, st))
        return mu__fail(MU_EINVAL, "view with negative or overflowing sizes, strides or offset");
    return mu__tensor_over(t->storage, t->scalar, t->offset, ndim, sh, st, out);
}

int mu_tensor_transpose(const mu_tensor *t, int d0, int d1, mu_tensor **out)
{
    if (!out) return mu__fail(MU_EINVAL, "out is NULL");
    *out = NULL;
    int vrc = mu__tensor_check(t, "tensor");
    if (vrc) return vrc;
    if (d0 < 0 || d0 >= t->ndim || d1 < 0 || d1 >= t->ndim)
        return mu__fail(MU_EINVAL, "transpose dims %d, %d out of range for %d dims", d0, d1,
                        t->ndim);
    int64_t sh[MU_MAX_DIMS], st[MU_MAX_DIMS];
    memcpy(sh, t->dims, sizeof sh);
    memcpy(st, t->strides, sizeof st);
    sh[d0] = t->dims[d1]; sh[d1] = t->dims[d0];
    st[d0] = t->strides[d1]; st[d1] = t->strides[d0];
    return mu__tensor_over(t->storage, t->scalar, t->offset, t->ndim, sh, st, out);
}

int mu_tensor_narrow(const mu_tensor *t, int dim, int64_t start, int64_t length, mu_tensor **out)
{
    if (!out) return mu__fail(MU_EINVAL, "out is NULL");
    *out = NULL;
    int vrc = mu__tensor_check(t, "tensor");
    if (vrc) return vrc;
    if (dim < 0 || dim >= t->ndim)
        return mu__fail(MU_EINVAL, "narrow dim %d out of range for %d dims", dim, t->ndim);
    if (start < 0 || length < 0 || start > t->dims[dim] || length > t->dims[dim] - start)
        return mu__fail(MU_EINVAL, "narrow [%lld, %lld) out of range for size %lld in dim %d",
                        (long long)start, (long long)(start + length), (long long)t->dims[dim],
                        dim);
    int64_t sh[MU_MAX_DIMS], off = t->offset;
    memcpy(sh, t->dims, sizeof sh);
    sh[dim] = length;
    if (start > 0 && (ck_mul(start, t->strides[dim], &off) || ck_add(off, t->offset, &off)))
        return mu__fail(MU_EINVAL, "narrow: offset overflows");
    return mu__tensor_over(t->storage, t->scalar, off, t->ndim, sh, t->strides, out);
}

int mu_tensor_squeeze(const mu_tensor *t, int dim, mu_tensor **out)
{
    if (!out) return mu__fail(MU_EINVAL, "out is NULL");
    *out = NULL;
    int vrc = mu__tensor_check(t, "tensor");
    if (vrc) return vrc;
    if (dim < 0 || dim >= t->ndim || t->dims[dim] != 1)
        return mu__fail(MU_EINVAL, "squeeze: dim %d is not a size-1 dim", dim);
    int64_t sh[MU_MAX_DIMS], st[MU_MAX_DIMS];
    for (int i = 0, j = 0; i < t->ndim; i++)
        if (i != dim) {
            sh[j] = t->dims[i];
            st[j++] = t->strides[i];
        }
    return mu__tensor_over(t->storage, t->scalar, t->offset, t->ndim - 1, sh, st, out);
}

int mu_tensor_unsqueeze(const mu_tensor *t, int dim, mu_tensor **out)
{
    if (!out) return mu__fail(MU_EINVAL, "out is NULL");
    *out = NULL;
    int vrc = mu__tensor_check(t, "tensor");
    if (vrc) return vrc;
    if (dim < 0 || dim > t->ndim || t->ndim >= MU_MAX_DIMS)
        return mu__fail(MU_EINVAL, "unsqueeze: dim %d out of range", dim);
    int64_t sh[MU_MAX_DIMS], st[MU_MAX_DIMS];
    for (int i = 0, j = 0; i <= t->ndim; i++) {
        if (i == dim) {
            sh[i] = 1;
            /* any stride does for a size-1 dim; torch's choice when it fits */
            if (dim >= t->ndim || ck_mul(t->strides[dim], t->dims[dim], &st[i])) st[i] = 1;
        } else {
            sh[i] = t->dims[j];
            st[i] = t->strides[j++];
        }
    }
    return mu__tensor_over(t->storage, t->scalar, t->offset, t->ndim + 1, sh, st, out);
}

void *mu__tensor_ptr(const mu_tensor *t, const int64_t *index)
{
    int64_t off = 0;
    for (int i = 0; i < t->ndim; i++) off += index[i] * t->strides[i];
    return (char *)t->data + off * (int64_t)mu_dtype_size(t->scalar);
}

static int check_index(const mu_tensor *t, const int64_t *index)
{
    int rc = mu__tensor_check(t, "tensor");
    if (rc) return rc;
    if (!index && t->ndim > 0) return mu__fail(MU_EINVAL, "index is NULL");
    for (int i = 0; i < t->ndim; i++)
        if (index[i] < 0 || index[i] >= t->dims[i])
            return mu__fail(MU_EINVAL, "index %lld out of range for size %lld in dim %d",
                            (long long)index[i], (long long)t->dims[i], i);
    return MU_OK;
}

int mu_tensor_get(const mu_tensor *t, const int64_t *index, double *out)
{
    if (!out) return mu__fail(MU_EINVAL, "get: out is NULL");
    int rc = check_index(t, index);
    if (rc) return rc;
    const void *p = mu__tensor_ptr(t, index);
    *out = t->scalar == MU_F32   ? *(const float *)p
           : t->scalar == MU_F64 ? *(const double *)p
                                 : mu__f32_from_bf16(*(const uint16_t *)p);
    if (*out != *out) *out = NAN; /* one NaN: a LuaJIT number cannot hold every bit pattern */
    return MU_OK;
}

int mu_tensor_set(mu_tensor *t, const int64_t *index, double value)
{
    int rc = check_index(t, index);
    if (rc) return rc;
    void *p = mu__tensor_ptr(t, index);
    if (t->scalar == MU_F32) *(float *)p = (float)value;
    else if (t->scalar == MU_F64) *(double *)p = value;
    else *(uint16_t *)p = mu__bf16_from_f64(value);
    return MU_OK;
}

int mu_tensor_contiguous(const mu_tensor *t, mu_tensor **out)
{
    if (!out) return mu__fail(MU_EINVAL, "out is NULL");
    *out = NULL;
    int vrc = mu__tensor_check(t, "tensor");
    if (vrc) return vrc;
    if (mu_tensor_is_contiguous(t))
        return mu__tensor_over(t->storage, t->scalar, t->offset, t->ndim, t->dims, t->strides, out);
    return mu_tensor_clone(t, -1, out);
}

int mu_tensor_clone(const mu_tensor *t, int dtype, mu_tensor **out)
{
    if (!out) return mu__fail(MU_EINVAL, "out is NULL");
    *out = NULL;
    int vrc = mu__tensor_check(t, "tensor");
    if (vrc) return vrc;
    mu_tensor *c;
    int rc = mu_tensor_new(dtype < 0 ? t->scalar : dtype, t->ndim, t->dims, &c);
    if (rc) return rc;
    rc = mu_tensor_copy(c, t);
    if (rc) {
        mu_tensor_free(c);
        return rc;
    }
    *out = c;
    return MU_OK;
}

/* ------------------------------------------------------------ iterator */

void mu__iter_init(mu__iter *it, int ndim, const int64_t *dims, int flags)
{
    memset(it, 0, sizeof *it);
    it->ndim = ndim;
    it->flags = flags;
    for (int i = 0; i < ndim; i++) it->dims[i] = dims[i];
}

void mu__iter_add_strided(mu__iter *it, void *base, const int64_t *elem_strides, size_t esize)
{
    int k = it->nops++;
    it->base[k] = base;
    for (int i = 0; i < it->ndim; i++)
        /* size-1 dims are never stepped along: stride 0 keeps the merge
         * test simple and no pointer is formed from a foreign stride */
        it->stride[k][i] = it->dims[i] > 1 ? elem_strides[i] * (int64_t)esize : 0;
}

void mu__iter_add(mu__iter *it, const mu_tensor *t)
{
    int64_t st[MU_MAX_DIMS];
    int lead = it->ndim - t->ndim;
    for (int i = 0; i < it->ndim; i++) {
        int j = i - lead;
        st[i] = j < 0 || t->dims[j] == 1 ? 0 : t->strides[j];
    }
    mu__iter_add_strided(it, t->data, st, mu_dtype_size(t->scalar));
}

void mu__iter_add_scalar(mu__iter *it, void *value)
{
    static const int64_t zero[MU_MAX_DIMS];
    mu__iter_add_strided(it, value, zero, 1);
}

/* Drop size-1 dims and merge dim i into i+1 where every operand steps
 * contiguously across them; the row-major visiting order is unchanged. */
static void iter_coalesce(mu__iter *it)
{
    int keep = (it->flags & MU__ITER_KEEP_INNER) && it->ndim > 0;
    int nd = 0, last = it->ndim - 1;
    for (int i = 0; i < it->ndim; i++) {
        if (it->dims[i] == 1 && !(keep && i == last)) continue;
        int merge = nd > 0 && !(keep && i == last) && it->dims[i] != 0 && it->dims[nd - 1] != 0;
        for (int k = 0; merge && k < it->nops; k++)
            if (it->stride[k][nd - 1] != it->stride[k][i] * it->dims[i]) merge = 0;
        if (merge) {
            it->dims[nd - 1] *= it->dims[i]; /* <= numel of a checked shape */
            for (int k = 0; k < it->nops; k++) it->stride[k][nd - 1] = it->stride[k][i];
        } else {
            it->dims[nd] = it->dims[i];
            for (int k = 0; k < it->nops; k++) it->stride[k][nd] = it->stride[k][i];
            nd++;
        }
    }
    if (nd == 0) { /* a single element */
        it->dims[0] = 1;
        for (int k = 0; k < it->nops; k++) it->stride[k][0] = 0;
        nd = 1;
    }
    it->ndim = nd;
}

int mu__iter_run(mu__iter *it, mu__loop_fn fn, void *ctx)
{
    iter_coalesce(it);
    int nd = it->ndim, no = it->nops;
    int64_t inner = it->dims[nd - 1];
    for (int i = 0; i < nd - 1; i++)
        if (it->dims[i] == 0) return 0;
    if (inner == 0 && !(it->flags & MU__ITER_KEEP_INNER)) return 0;
    /* Byte offsets from each base, so no pointer is formed outside the
     * operands while carrying. */
    int64_t off[MU__ITER_MAX_OPS] = {0}, idx[MU_MAX_DIMS] = {0}, s[MU__ITER_MAX_OPS];
    char *p[MU__ITER_MAX_OPS];
    for (int k = 0; k < no; k++) s[k] = it->stride[k][nd - 1];
    for (;;) {
        for (int k = 0; k < no; k++) p[k] = it->base[k] + off[k];
        int rc = fn(ctx, inner, p, s);
        if (rc) return rc;
        int i = nd - 2;
        for (; i >= 0; i--) {
            if (++idx[i] < it->dims[i]) {
                for (int k = 0; k < no; k++) off[k] += it->stride[k][i];
                break;
            }
            for (int k = 0; k < no; k++) off[k] -= it->stride[k][i] * (it->dims[i] - 1);
            idx[i] = 0;
        }
        if (i < 0) return 0;
    }
}

int mu__check_broadcast(const mu_tensor *t, int ndim, const int64_t *dims, const char *what)
{
    int ok = t->ndim <= ndim;
    for (int j = 0; ok && j < t->ndim; j++) {
        int64_t d = t->dims[j];
        if (d != 1 && d != dims[j + ndim - t->ndim]) ok = 0;
    }
    if (ok) return MU_OK;
    char b1[160], b2[160];
    return mu__fail(MU_ESHAPE, "%s of shape %s does not broadcast to the output shape %s", what,
                    mu__shape_str(t->ndim, t->dims, b1, sizeof b1),
                    mu__shape_str(ndim, dims, b2, sizeof b2));
}
