/* Strided float32/float64 tensors over refcounted storage. */
#include "muon_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

size_t mu_dtype_size(int dtype)
{
    return dtype == MU_F32 ? 4 : dtype == MU_F64 ? 8 : 0;
}

int64_t mu__shape_numel(int ndim, const int64_t *shape)
{
    /* span: product of the extents counting 0 as 1, so that the strides of
     * a contiguous layout fit too (a (0, 10^16, 10^4) shape is rejected). */
    int64_t n = 1, span = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return -1;
        int64_t d = shape[i] ? shape[i] : 1;
        if (span > INT64_MAX / 8 / d) return -1;
        span *= d;
        n = shape[i] ? n * shape[i] : 0;
    }
    return n;
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

static void contiguous_strides(int ndim, const int64_t *shape, int64_t *stride)
{
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        stride[i] = s;
        s *= shape[i] > 0 ? shape[i] : 1;
    }
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
    mu_tensor *t = calloc(1, sizeof *t);
    if (!t) return mu__fail(MU_ENOMEM, "out of memory for a tensor handle");
    atomic_fetch_add(&s->refcount, 1);
    t->storage = s;
    t->scalar = dtype;
    t->ndim = ndim;
    t->offset = offset;
    t->data = (char *)s->base + offset * (int64_t)mu_dtype_size(dtype);
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
    int64_t stride[MU_MAX_DIMS];
    mu_storage *s = NULL;
    if (strides) memcpy(stride, strides, sizeof(int64_t) * ndim);
    else contiguous_strides(ndim, shape, stride);
    int64_t nbytes = mu__shape_numel(ndim, shape) * (int64_t)mu_dtype_size(dtype);
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

int64_t mu_tensor_numel(const mu_tensor *t) { return mu__shape_numel(t->ndim, t->dims); }

int mu_tensor_is_contiguous(const mu_tensor *t)
{
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->dims[i] == 0) return 1;
        if (t->dims[i] != 1 && t->strides[i] != s) return 0;
        s *= t->dims[i];
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
    if (ndim < 0 || ndim > MU_MAX_DIMS)
        return mu__fail(MU_EINVAL, "ndim %d is outside 0..%d", ndim, MU_MAX_DIMS);
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
        } else {
            known *= shape[i];
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
    contiguous_strides(ndim, sh, st);
    return mu__tensor_over(t->storage, t->scalar, t->offset, ndim, sh, st, out);
}

int mu_tensor_transpose(const mu_tensor *t, int d0, int d1, mu_tensor **out)
{
    if (!out) return mu__fail(MU_EINVAL, "out is NULL");
    *out = NULL;
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
    if (dim < 0 || dim >= t->ndim)
        return mu__fail(MU_EINVAL, "narrow dim %d out of range for %d dims", dim, t->ndim);
    if (start < 0 || length < 0 || start > t->dims[dim] || length > t->dims[dim] - start)
        return mu__fail(MU_EINVAL, "narrow [%lld, %lld) out of range for size %lld in dim %d",
                        (long long)start, (long long)(start + length), (long long)t->dims[dim],
                        dim);
    int64_t sh[MU_MAX_DIMS];
    memcpy(sh, t->dims, sizeof sh);
    sh[dim] = length;
    return mu__tensor_over(t->storage, t->scalar, t->offset + start * t->strides[dim], t->ndim, sh,
                           t->strides, out);
}

int mu_tensor_squeeze(const mu_tensor *t, int dim, mu_tensor **out)
{
    if (!out) return mu__fail(MU_EINVAL, "out is NULL");
    *out = NULL;
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
    if (dim < 0 || dim > t->ndim || t->ndim >= MU_MAX_DIMS)
        return mu__fail(MU_EINVAL, "unsqueeze: dim %d out of range", dim);
    int64_t sh[MU_MAX_DIMS], st[MU_MAX_DIMS];
    for (int i = 0, j = 0; i <= t->ndim; i++) {
        if (i == dim) {
            sh[i] = 1;
            st[i] = (dim < t->ndim) ? t->strides[dim] * t->dims[dim] : 1;
        } else {
            sh[i] = t->dims[j];
            st[i] = t->strides[j++];
        }
    }
    return mu__tensor_over(t->storage, t->scalar, t->offset, t->ndim + 1, sh, st, out);
}

/* Visit every element in row-major order; fn gets both element pointers. */
typedef void (*pair_fn)(void *d, const void *s, int dd, int ds);

static void each_pair(mu_tensor *dst, const mu_tensor *src, pair_fn fn)
{
    int nd = dst->ndim;
    int64_t n = mu_tensor_numel(dst);
    if (n == 0) return;
    int64_t idx[MU_MAX_DIMS] = {0};
    size_t ed = mu_dtype_size(dst->scalar), es = mu_dtype_size(src->scalar);
    char *pd = dst->data;
    const char *ps = src->data;
    for (int64_t k = 0; k < n; k++) {
        fn(pd, ps, dst->scalar, src->scalar);
        for (int i = nd - 1; i >= 0; i--) {
            pd += dst->strides[i] * (int64_t)ed;
            ps += src->strides[i] * (int64_t)es;
            if (++idx[i] < dst->dims[i]) break;
            pd -= dst->strides[i] * dst->dims[i] * (int64_t)ed;
            ps -= src->strides[i] * src->dims[i] * (int64_t)es;
            idx[i] = 0;
        }
    }
}

static void copy_one(void *d, const void *s, int dd, int ds)
{
    double v = ds == MU_F32 ? *(const float *)s : *(const double *)s;
    if (dd == MU_F32) *(float *)d = (float)v;
    else *(double *)d = v;
}

static int same_shape(const mu_tensor *a, const mu_tensor *b)
{
    if (a->ndim != b->ndim) return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->dims[i] != b->dims[i]) return 0;
    return 1;
}

int mu_tensor_copy(mu_tensor *dst, const mu_tensor *src)
{
    if (!dst || !src) return mu__fail(MU_EINVAL, "tensor is NULL");
    if (!same_shape(dst, src) && !(mu_tensor_numel(dst) == mu_tensor_numel(src) &&
                                   mu_tensor_is_contiguous(dst) && mu_tensor_is_contiguous(src)))
        return mu__fail(MU_ESHAPE, "copy between different shapes");
    if (dst->data == src->data && dst->scalar == src->scalar && same_shape(dst, src) &&
        memcmp(dst->strides, src->strides, sizeof(int64_t) * dst->ndim) == 0)
        return MU_OK;
    if (dst->scalar == src->scalar && mu_tensor_is_contiguous(dst) && mu_tensor_is_contiguous(src)) {
        memmove(dst->data, src->data, (size_t)mu_tensor_numel(dst) * mu_dtype_size(dst->scalar));
        return MU_OK;
    }
    if (!same_shape(dst, src)) { /* contiguous, same numel, other dtype: flat copy */
        int64_t n = mu_tensor_numel(dst);
        mu_tensor fd = *dst, fs = *src;
        fd.ndim = fs.ndim = 1;
        fd.dims[0] = fs.dims[0] = n;
        fd.strides[0] = fs.strides[0] = 1;
        each_pair(&fd, &fs, copy_one);
        return MU_OK;
    }
    each_pair(dst, src, copy_one);
    return MU_OK;
}

static void fill_one(void *d, const void *s, int dd, int ds)
{
    MU__UNUSED(ds);
    double v = *(const double *)s;
    if (dd == MU_F32) *(float *)d = (float)v;
    else *(double *)d = v;
}

int mu_tensor_fill(mu_tensor *t, double value)
{
    if (!t) return mu__fail(MU_EINVAL, "tensor is NULL");
    /* A zero-stride source tensor of doubles broadcasts the value. */
    mu_tensor src = *t;
    src.scalar = MU_F64;
    src.data = &value;
    for (int i = 0; i < src.ndim; i++) src.strides[i] = 0;
    each_pair(t, &src, fill_one);
    return MU_OK;
}

static double elem(const mu_tensor *t, const char *p)
{
    return t->scalar == MU_F32 ? *(const float *)p : *(const double *)p;
}

int mu_tensor_norm(const mu_tensor *t, double *out)
{
    if (!t || !out) return mu__fail(MU_EINVAL, "tensor or out is NULL");
    double acc = 0;
    int64_t n = mu_tensor_numel(t);
    if (mu_tensor_is_contiguous(t)) {
        if (t->scalar == MU_F32) {
            const float *x = t->data;
            for (int64_t i = 0; i < n; i++) acc += (double)x[i] * x[i];
        } else {
            const double *x = t->data;
            for (int64_t i = 0; i < n; i++) acc += x[i] * x[i];
        }
    } else if (n > 0) {
        int64_t idx[MU_MAX_DIMS] = {0};
        size_t es = mu_dtype_size(t->scalar);
        const char *p = t->data;
        for (int64_t k = 0; k < n; k++) {
            double v = elem(t, p);
            acc += v * v;
            for (int i = t->ndim - 1; i >= 0; i--) {
                p += t->strides[i] * (int64_t)es;
                if (++idx[i] < t->dims[i]) break;
                p -= t->strides[i] * t->dims[i] * (int64_t)es;
                idx[i] = 0;
            }
        }
    }
    *out = sqrt(acc);
    return MU_OK;
}

void *mu__tensor_ptr(const mu_tensor *t, const int64_t *index)
{
    int64_t off = 0;
    for (int i = 0; i < t->ndim; i++) off += index[i] * t->strides[i];
    return (char *)t->data + off * (int64_t)mu_dtype_size(t->scalar);
}

static int check_index(const mu_tensor *t, const int64_t *index)
{
    for (int i = 0; i < t->ndim; i++)
        if (index[i] < 0 || index[i] >= t->dims[i])
            return mu__fail(MU_EINVAL, "index %lld out of range for size %lld in dim %d",
                            (long long)index[i], (long long)t->dims[i], i);
    return MU_OK;
}

int mu_tensor_get(const mu_tensor *t, const int64_t *index, double *out)
{
    int rc = check_index(t, index);
    if (rc) return rc;
    *out = elem(t, mu__tensor_ptr(t, index));
    return MU_OK;
}

int mu_tensor_set(mu_tensor *t, const int64_t *index, double value)
{
    int rc = check_index(t, index);
    if (rc) return rc;
    void *p = mu__tensor_ptr(t, index);
    if (t->scalar == MU_F32) *(float *)p = (float)value;
    else *(double *)p = value;
    return MU_OK;
}

int mu_tensor_all_finite(const mu_tensor *t, int64_t *where)
{
    int64_t n = mu_tensor_numel(t);
    int64_t idx[MU_MAX_DIMS] = {0};
    size_t es = mu_dtype_size(t->scalar);
    const char *p = t->data;
    if (mu_tensor_is_contiguous(t)) {
        for (int64_t k = 0; k < n; k++)
            if (!isfinite(elem(t, p + k * (int64_t)es))) {
                if (where) *where = k;
                return 0;
            }
        return 1;
    }
    for (int64_t k = 0; k < n; k++) {
        if (!isfinite(elem(t, p))) {
            if (where) *where = k;
            return 0;
        }
        for (int i = t->ndim - 1; i >= 0; i--) {
            p += t->strides[i] * (int64_t)es;
            if (++idx[i] < t->dims[i]) break;
            p -= t->strides[i] * t->dims[i] * (int64_t)es;
            idx[i] = 0;
        }
    }
    return 1;
}

int mu_tensor_contiguous(const mu_tensor *t, mu_tensor **out)
{
    if (!out) return mu__fail(MU_EINVAL, "out is NULL");
    *out = NULL;
    if (mu_tensor_is_contiguous(t))
        return mu__tensor_over(t->storage, t->scalar, t->offset, t->ndim, t->dims, t->strides, out);
    return mu_tensor_clone(t, -1, out);
}

int mu_tensor_clone(const mu_tensor *t, int dtype, mu_tensor **out)
{
    if (!out) return mu__fail(MU_EINVAL, "out is NULL");
    *out = NULL;
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
