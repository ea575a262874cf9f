/* NumPy .npy reader and writer: '<f4'/'<f8', C order, header v1.0-3.0.
 * The reader treats its input as hostile: every length is checked against
 * the bytes actually present before anything is allocated or read. */
#include "tensor_internal.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { NPY_MAX_HEADER = 1 << 20, NPY_MAX_FILE_HEADER_SCAN = 16 };

typedef struct {
    const char *p, *end;
} cursor;

static void skip_ws(cursor *c)
{
    while (c->p < c->end && isspace((unsigned char)*c->p)) c->p++;
}

static int eat(cursor *c, char ch)
{
    skip_ws(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return 1;
    }
    return 0;
}

/* A Python string literal in quotes; copies at most cap-1 chars. Only
 * printable ASCII without escapes (the keys and dtypes accepted here). */
static int parse_str(cursor *c, char *buf, size_t cap)
{
    skip_ws(c);
    if (c->p >= c->end || (*c->p != '\'' && *c->p != '"')) return 0;
    char q = *c->p++;
    size_t n = 0;
    while (c->p < c->end && *c->p != q) {
        if (n + 1 >= cap || *c->p < 0x20 || *c->p > 0x7e || *c->p == '\\') return 0;
        buf[n++] = *c->p++;
    }
    if (c->p >= c->end) return 0;
    c->p++;
    buf[n] = '\0';
    return 1;
}

static int parse_word(cursor *c, const char *w)
{
    skip_ws(c);
    size_t n = strlen(w);
    if ((size_t)(c->end - c->p) >= n && memcmp(c->p, w, n) == 0) {
        c->p += n;
        return 1;
    }
    return 0;
}

static int parse_shape(cursor *c, int *ndim, int64_t *shape)
{
    if (!eat(c, '(')) return 0;
    *ndim = 0;
    for (;;) {
        if (eat(c, ')')) return 1;
        skip_ws(c);
        if (c->p >= c->end || !isdigit((unsigned char)*c->p)) return 0;
        int64_t v = 0;
        while (c->p < c->end && isdigit((unsigned char)*c->p)) {
            if (v > (INT64_MAX - 9) / 10) return 0;
            v = v * 10 + (*c->p++ - '0');
        }
        while (c->p < c->end && (*c->p == 'L')) c->p++; /* Python 2 longs */
        if (*ndim >= MU_MAX_DIMS) return 0;
        shape[(*ndim)++] = v;
        if (!eat(c, ',')) {
            if (!eat(c, ')')) return 0;
            return 1;
        }
    }
}

typedef struct {
    int ft, ndim, have_descr, have_order, have_shape; /* ft: the file type (MU__FT_*) */
    char descr[32];
    int64_t shape[MU_MAX_DIMS];
} npy_header;

static int parse_header(const char *text, size_t len, npy_header *h)
{
    cursor c = {text, text + len};
    char key[32], val[32];
    memset(h, 0, sizeof *h);
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)text[i];
        if (ch > 0x7e || (ch < 0x20 && ch != '\n' && ch != '\t' && ch != '\r'))
            return mu__fail(MU_EFORMAT, "npy header: byte 0x%02x at %zu is not printable ASCII",
                            ch, i);
    }
    if (!eat(&c, '{')) return mu__fail(MU_EFORMAT, "npy header is not a dict");
    for (;;) {
        if (eat(&c, '}')) break;
        if (!parse_str(&c, key, sizeof key) || !eat(&c, ':'))
            return mu__fail(MU_EFORMAT, "npy header: malformed key");
        if ((strcmp(key, "descr") == 0 && h->have_descr) ||
            (strcmp(key, "fortran_order") == 0 && h->have_order) ||
            (strcmp(key, "shape") == 0 && h->have_shape))
            return mu__fail(MU_EFORMAT, "npy header: duplicate key '%s'", key);
        if (strcmp(key, "descr") == 0) {
            if (!parse_str(&c, val, sizeof val))
                return mu__fail(MU_EFORMAT, "npy header: descr is not a string");
            h->ft = mu__file_type_npy(val);
            if (h->ft < 0)
                return mu__fail(MU_EDTYPE, "npy dtype '%s' is not supported (floats, integers and "
                                "booleans, little-endian)", val);
            snprintf(h->descr, sizeof h->descr, "%s", val);
            h->have_descr = 1;
        } else if (strcmp(key, "fortran_order") == 0) {
            if (parse_word(&c, "True"))
                return mu__fail(MU_EFORMAT,
                                "npy file is in Fortran order; only C order is supported");
            if (!parse_word(&c, "False"))
                return mu__fail(MU_EFORMAT, "npy header: fortran_order is not a boolean");
            h->have_order = 1;
        } else if (strcmp(key, "shape") == 0) {
            if (!parse_shape(&c, &h->ndim, h->shape))
                return mu__fail(MU_EFORMAT, "npy header: malformed shape (at most %d dims)",
                                MU_MAX_DIMS);
            h->have_shape = 1;
        } else {
            return mu__fail(MU_EFORMAT, "npy header: unexpected key '%s'", key);
        }
        if (!eat(&c, ',')) {
            if (!eat(&c, '}')) return mu__fail(MU_EFORMAT, "npy header: expected ',' or '}'");
            break;
        }
    }
    /* As NumPy writes it: the dict, padding spaces, one final newline. */
    while (c.p < c.end && *c.p == ' ') c.p++;
    if (c.end - c.p != 1 || *c.p != '\n')
        return mu__fail(MU_EFORMAT, "npy header: bytes after the dict other than space padding "
                        "and one final newline");
    if (!h->have_descr || !h->have_order || !h->have_shape)
        return mu__fail(MU_EFORMAT, "npy header lacks descr, fortran_order or shape");
    return MU_OK;
}

static int load_mem(const void *buf, size_t len, int dtype, mu_tensor **out)
{
    if (!out) return mu__fail(MU_EINVAL, "out is NULL");
    *out = NULL;
    const unsigned char *b = buf;
    if (!b) return mu__fail(MU_EINVAL, "buffer is NULL");
    if (len < 10 || memcmp(b, "\x93NUMPY", 6) != 0)
        return mu__fail(MU_EFORMAT, "not an npy file (bad magic)");
    unsigned major = b[6];
    size_t hlen, start;
    if (major == 1) {
        hlen = (size_t)b[8] | (size_t)b[9] << 8;
        start = 10;
    } else if (major == 2 || major == 3) {
        if (len < 12) return mu__fail(MU_EFORMAT, "npy file truncated in its header length");
        hlen = (size_t)b[8] | (size_t)b[9] << 8 | (size_t)b[10] << 16 | (size_t)b[11] << 24;
        start = 12;
    } else {
        return mu__fail(MU_EFORMAT, "npy version %u.%u is not supported", major, b[7]);
    }
    if (hlen > NPY_MAX_HEADER) return mu__fail(MU_EFORMAT, "npy header too long (%zu)", hlen);
    if (hlen > len - start) return mu__fail(MU_EFORMAT, "npy file truncated inside its header");
    npy_header h;
    int rc = parse_header((const char *)b + start, hlen, &h);
    if (rc) return rc;
    int64_t numel = mu__shape_numel(h.ndim, h.shape);
    if (dtype < 0) dtype = h.ft == MU__FT_F32 ? MU_F32 : h.ft == MU__FT_F64 ? MU_F64 : -1;
    if (dtype < 0)
        return mu__fail(MU_EDTYPE, "npy dtype '%s' (%s) is not float32 or float64: ask for a "
                        "conversion (T.load(path, { dtype = \"float32\" }), mu_npy_load_as)",
                        h.descr, mu__file_type_name(h.ft));
    if (!mu_dtype_size(dtype)) return mu__fail(MU_EDTYPE, "unsupported dtype %d", dtype);
    size_t es = mu__file_type_size(h.ft), avail = len - start - hlen;
    if (numel < 0 || (uint64_t)numel > avail / es)
        return mu__fail(MU_EFORMAT, "npy header claims %lld elements but the file holds %zu bytes",
                        (long long)numel, avail);
    if ((size_t)numel * es != avail)
        return mu__fail(MU_EFORMAT, "npy file has %zu trailing bytes after the data",
                        avail - (size_t)numel * es);
    mu_tensor *t;
    rc = mu_tensor_new(dtype, h.ndim, h.shape, &t);
    if (rc) return rc;
    if (h.ft == mu__file_type_of(dtype)) memcpy(t->data, b + start + hlen, (size_t)numel * es);
    else mu__file_convert(h.ft, b + start + hlen, numel, t->data, dtype);
    *out = t;
    return MU_OK;
}

int mu_npy_load_mem(const void *buf, size_t len, mu_tensor **out) { return load_mem(buf, len, -1, out); }

int mu_npy_load(const char *path, mu_tensor **out) { return mu_npy_load_as(path, -1, out); }

int mu_npy_load_as(const char *path, int dtype, mu_tensor **out)
{
    if (!out) return mu__fail(MU_EINVAL, "out is NULL");
    *out = NULL;
    if (!path) return mu__fail(MU_EINVAL, "path is NULL");
    int fd;
    int64_t size;
    int rc = mu__open_regular(path, &fd, &size); /* EIO naming the path */
    if (rc) return rc;
    if ((uint64_t)size > SIZE_MAX - 1) {
        close(fd);
        return mu__fail(MU_ENOMEM, "cannot read '%s' (%lld bytes)", path, (long long)size);
    }
    char *buf = malloc(size > 0 ? (size_t)size : 1);
    if (!buf) {
        close(fd);
        return mu__fail(MU_ENOMEM, "cannot read '%s' (%lld bytes)", path, (long long)size);
    }
    size_t got;
    int bad = mu__read_full(fd, buf, (size_t)size, 0, &got);
    int err = errno;
    close(fd);
    rc = bad ? mu__fail(MU_EIO, "cannot read '%s': %s", path, strerror(err))
             : got != (size_t)size ? mu__fail(MU_EIO, "short read on '%s'", path)
                                   : load_mem(buf, got, dtype, out);
    free(buf);
    if (rc && rc != MU_EIO) {
        char msg[900];
        snprintf(msg, sizeof msg, "%s", mu_last_error());
        mu__fail(rc, "%s: %s", path, msg);
    }
    return rc;
}

int mu_npy_save(const mu_tensor *t, const char *path)
{
    if (!t || !path || !*path) return mu__fail(MU_EINVAL, "tensor or path is NULL");
    int rc = mu__tensor_check(t, "tensor");
    if (rc) return rc;
    if (t->scalar != MU_F32 && t->scalar != MU_F64)
        return mu__fail(MU_EDTYPE, "cannot save '%s': .npy has no %s type (save a float32 copy, "
                        "or use safetensors)", path, mu_dtype_name(t->scalar));
    char dict[512];
    int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (",
                     t->scalar == MU_F32 ? "<f4" : "<f8");
    for (int i = 0; i < t->ndim; i++)
        n += snprintf(dict + n, sizeof dict - n, "%lld%s", (long long)t->dims[i],
                      t->ndim == 1 || i + 1 < t->ndim ? ", " : "");
    n += snprintf(dict + n, sizeof dict - n, "), }");
    /* magic(6) + version(2) + len(2) + dict + spaces + '\n', multiple of 64 */
    size_t total = 10 + (size_t)n + 1;
    size_t pad = (64 - total % 64) % 64;
    size_t hlen = (size_t)n + pad + 1;
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0,
                             (unsigned char)(hlen & 0xff), (unsigned char)(hlen >> 8)};
    memset(dict + n, ' ', pad);
    dict[n + pad] = '\n';
    mu_tensor *c;
    rc = mu_tensor_contiguous(t, &c);
    if (rc) return rc;
    char *tmp;
    int fd;
    rc = mu__tmp_create(path, &tmp, &fd); /* atomic: never a torn file at path */
    if (rc) {
        mu_tensor_free(c);
        return rc;
    }
    size_t nbytes = (size_t)mu_tensor_numel(c) * mu_dtype_size(c->scalar);
    int bad = mu__write_full(fd, pre, 10) || mu__write_full(fd, dict, hlen) ||
              mu__write_full(fd, c->data, nbytes);
    int err = errno;
    mu_tensor_free(c);
    if (bad) {
        rc = mu__fail(MU_EIO, "cannot save '%s': writing temporary file '%s' failed: %s", path,
                      tmp, strerror(err));
        mu__tmp_abort(tmp, fd);
        return rc;
    }
    return mu__tmp_commit(path, tmp, fd);
}
