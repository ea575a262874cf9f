/* safetensors: raw file I/O, size validation, atomic writes and the data
 * checksum. The JSON header is parsed and produced in Lua (lua-cjson); this
 * file only moves bytes and checks every length against the file before
 * anything is allocated or read.
 *
 * File layout: u64 little-endian header length N, N bytes of JSON header
 * (padded with spaces to a multiple of 8 by the writer), then the data
 * section; tensor offsets in the header are relative to its first byte. */
#include "tensor_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host"
#endif

enum { ST_MAX_HEADER = 100000000 }; /* same bound as the reference reader */

struct mu_st_reader {
    int fd;
    char *path;
    char *header;       /* N bytes + NUL */
    uint64_t header_len;
    uint64_t file_size;
    uint64_t data_start; /* 8 + N */
};

/* ------------------------------------------------------------ checksum */

/* XXH64 (seed 0), streaming, as specified by the xxHash project. */
#define P1 0x9E3779B185EBCA87ULL
#define P2 0xC2B2AE3D27D4EB4FULL
#define P3 0x165667B19E3779F9ULL
#define P4 0x85EBCA77C2B2AE63ULL
#define P5 0x27D4EB2F165667C5ULL

typedef struct {
    uint64_t total, v[4];
    unsigned char mem[32];
    unsigned memsize;
} xxh64_state;

static inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static inline uint64_t rd64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static inline uint32_t rd32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline uint64_t xxh_round(uint64_t acc, uint64_t in)
{
    acc += in * P2;
    acc = rotl64(acc, 31);
    return acc * P1;
}

static inline uint64_t xxh_merge(uint64_t acc, uint64_t val)
{
    acc ^= xxh_round(0, val);
    return acc * P1 + P4;
}

static void xxh64_init(xxh64_state *s)
{
    memset(s, 0, sizeof *s);
    s->v[0] = P1 + P2;
    s->v[1] = P2;
    s->v[2] = 0;
    s->v[3] = 0 - P1;
}

static const unsigned char *xxh64_stripes(uint64_t v[4], const unsigned char *p,
                                          const unsigned char *limit)
{
    uint64_t v1 = v[0], v2 = v[1], v3 = v[2], v4 = v[3];
    while (p + 32 <= limit) {
        v1 = xxh_round(v1, rd64(p));
        v2 = xxh_round(v2, rd64(p + 8));
        v3 = xxh_round(v3, rd64(p + 16));
        v4 = xxh_round(v4, rd64(p + 24));
        p += 32;
    }
    v[0] = v1, v[1] = v2, v[2] = v3, v[3] = v4;
    return p;
}

static void xxh64_update(xxh64_state *s, const void *data, size_t len)
{
    const unsigned char *p = data, *end = p + len;
    s->total += len;
    if (s->memsize + len < 32) {
        if (len) memcpy(s->mem + s->memsize, p, len);
        s->memsize += (unsigned)len;
        return;
    }
    if (s->memsize) {
        size_t fill = 32 - s->memsize;
        memcpy(s->mem + s->memsize, p, fill);
        xxh64_stripes(s->v, s->mem, s->mem + 32);
        p += fill;
        s->memsize = 0;
    }
    p = xxh64_stripes(s->v, p, end);
    if (p < end) {
        memcpy(s->mem, p, (size_t)(end - p));
        s->memsize = (unsigned)(end - p);
    }
}

static uint64_t xxh64_digest(const xxh64_state *s)
{
    uint64_t h;
    if (s->total >= 32) {
        const uint64_t *v = s->v;
        h = rotl64(v[0], 1) + rotl64(v[1], 7) + rotl64(v[2], 12) + rotl64(v[3], 18);
        h = xxh_merge(h, v[0]);
        h = xxh_merge(h, v[1]);
        h = xxh_merge(h, v[2]);
        h = xxh_merge(h, v[3]);
    } else {
        h = P5; /* seed 0 */
    }
    h += s->total;
    const unsigned char *p = s->mem, *end = s->mem + s->memsize;
    while (p + 8 <= end) {
        h ^= xxh_round(0, rd64(p));
        h = rotl64(h, 27) * P1 + P4;
        p += 8;
    }
    if (p + 4 <= end) {
        h ^= (uint64_t)rd32(p) * P1;
        h = rotl64(h, 23) * P2 + P3;
        p += 4;
    }
    while (p < end) {
        h ^= (uint64_t)(*p) * P5;
        h = rotl64(h, 11) * P1;
        p++;
    }
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    h ^= h >> 32;
    return h;
}

int mu_st_checksum_bytes(const void *data, size_t len, uint64_t *out)
{
    if (!out) return mu__fail(MU_EINVAL, "out is NULL");
    *out = 0;
    if (!data && len) return mu__fail(MU_EINVAL, "data is NULL");
    xxh64_state s;
    xxh64_init(&s);
    xxh64_update(&s, data, len);
    *out = xxh64_digest(&s);
    return MU_OK;
}

static size_t tensor_nbytes(const mu_tensor *t)
{
    return (size_t)mu_tensor_numel(t) * mu_dtype_size(t->scalar);
}

int mu_st_checksum(int n, mu_tensor *const *ts, uint64_t *out)
{
    if (!out) return mu__fail(MU_EINVAL, "out is NULL");
    *out = 0;
    if (n < 0 || (n > 0 && !ts)) return mu__fail(MU_EINVAL, "bad tensor list (n = %d)", n);
    xxh64_state s;
    xxh64_init(&s);
    for (int i = 0; i < n; i++) {
        char what[32];
        snprintf(what, sizeof what, "tensor %d", i);
        int vrc = mu__tensor_check(ts[i], what);
        if (vrc) return vrc;
        if (mu_tensor_is_contiguous(ts[i])) {
            xxh64_update(&s, ts[i]->data, tensor_nbytes(ts[i]));
        } else {
            mu_tensor *c;
            int rc = mu_tensor_contiguous(ts[i], &c);
            if (rc) return rc;
            xxh64_update(&s, c->data, tensor_nbytes(c));
            mu_tensor_free(c);
        }
    }
    *out = xxh64_digest(&s);
    return MU_OK;
}

/* -------------------------------------------------------------- reader */

void mu_st_reader_close(mu_st_reader *r)
{
    if (!r) return;
    if (r->fd >= 0) close(r->fd);
    free(r->header);
    free(r->path);
    free(r);
}

int mu_st_reader_open(const char *path, mu_st_reader **out)
{
    if (!out) return mu__fail(MU_EINVAL, "out is NULL");
    *out = NULL;
    if (!path) return mu__fail(MU_EINVAL, "path is NULL");
    mu_st_reader *r = calloc(1, sizeof *r);
    if (!r) return mu__fail(MU_ENOMEM, "safetensors '%s': out of memory", path);
    r->fd = -1;
    r->path = strdup(path);
    if (!r->path) {
        mu_st_reader_close(r);
        return mu__fail(MU_ENOMEM, "safetensors '%s': out of memory", path);
    }
    int rc = MU_OK;
    int64_t fsize;
    rc = mu__open_regular(path, &r->fd, &fsize); /* EIO naming the path */
    if (rc) goto fail;
    r->file_size = (uint64_t)fsize;
    if (r->file_size < 8) {
        rc = mu__fail(MU_EFORMAT,
                      "safetensors '%s': file is %llu bytes, too short for the 8-byte header length",
                      path, (unsigned long long)r->file_size);
        goto fail;
    }
    unsigned char lenbuf[8];
    size_t got;
    if (mu__read_full(r->fd, lenbuf, 8, 0, &got) != 0 || got != 8) {
        rc = mu__fail(MU_EIO, "cannot read '%s': %s", path, got == 8 ? strerror(errno) : "short read");
        goto fail;
    }
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | lenbuf[i];
    if (n > ST_MAX_HEADER) {
        rc = mu__fail(MU_EFORMAT, "safetensors '%s': header length %llu exceeds the limit of %d bytes",
                      path, (unsigned long long)n, (int)ST_MAX_HEADER);
        goto fail;
    }
    if (n > r->file_size - 8) {
        rc = mu__fail(MU_EFORMAT,
                      "safetensors '%s': header length %llu is larger than the file (%llu bytes after "
                      "the length field); truncated file?",
                      path, (unsigned long long)n, (unsigned long long)(r->file_size - 8));
        goto fail;
    }
    r->header_len = n;
    r->data_start = 8 + n;
    r->header = malloc((size_t)n + 1);
    if (!r->header) {
        rc = mu__fail(MU_ENOMEM, "safetensors '%s': cannot allocate a %llu-byte header", path,
                      (unsigned long long)n);
        goto fail;
    }
    if (mu__read_full(r->fd, r->header, (size_t)n, 8, &got) != 0) {
        rc = mu__fail(MU_EIO, "cannot read '%s': %s", path, strerror(errno));
        goto fail;
    }
    if (got != n) {
        rc = mu__fail(MU_EFORMAT, "safetensors '%s': file truncated inside its header", path);
        goto fail;
    }
    r->header[n] = '\0';
    *out = r;
    return MU_OK;
fail:
    mu_st_reader_close(r);
    return rc;
}

const char *mu_st_reader_header(const mu_st_reader *r, size_t *len)
{
    if (len) *len = r ? (size_t)r->header_len : 0;
    return r ? r->header : NULL;
}

int64_t mu_st_reader_data_size(const mu_st_reader *r)
{
    return r ? (int64_t)(r->file_size - r->data_start) : -1;
}

/* Check [begin, end) against the data section and dst (contiguous, numel
 * elements of es bytes filling the span exactly). */
static int check_span(const mu_st_reader *r, int64_t begin, int64_t end, const mu_tensor *dst,
                      size_t es)
{
    const char *path = r->path;
    uint64_t dsize = r->file_size - r->data_start;
    if (begin < 0 || end < begin)
        return mu__fail(MU_EFORMAT, "safetensors '%s': bad data offsets [%lld, %lld)", path,
                        (long long)begin, (long long)end);
    if ((uint64_t)end > dsize)
        return mu__fail(MU_EFORMAT,
                        "safetensors '%s': data offsets [%lld, %lld) run past the end of the data "
                        "section (%llu bytes)",
                        path, (long long)begin, (long long)end, (unsigned long long)dsize);
    if (!mu_tensor_is_contiguous(dst))
        return mu__fail(MU_EINVAL, "safetensors '%s': destination tensor is not contiguous", path);
    int64_t numel = mu_tensor_numel(dst);
    uint64_t span = (uint64_t)(end - begin);
    if (numel < 0 || es == 0 || (uint64_t)numel > span / es || (uint64_t)numel * es != span)
        return mu__fail(MU_ESHAPE,
                        "safetensors '%s': data offsets [%lld, %lld) hold %llu bytes but the "
                        "tensor needs %lld elements of %zu bytes",
                        path, (long long)begin, (long long)end, (unsigned long long)span,
                        (long long)numel, es);
    return MU_OK;
}

static int read_bytes(mu_st_reader *r, void *buf, size_t len, uint64_t off)
{
    size_t got;
    if (mu__read_full(r->fd, buf, len, (int64_t)(r->data_start + off), &got) != 0)
        return mu__fail(MU_EIO, "cannot read '%s': %s", r->path, strerror(errno));
    if (got != len)
        return mu__fail(MU_EFORMAT, "safetensors '%s': file truncated while reading data", r->path);
    return MU_OK;
}

int mu_st_reader_read(mu_st_reader *r, int64_t begin, int64_t end, mu_tensor *dst)
{
    if (!r || !dst) return mu__fail(MU_EINVAL, "reader or dst is NULL");
    int rc = mu__tensor_check(dst, "dst");
    if (rc || (rc = check_span(r, begin, end, dst, mu_dtype_size(dst->scalar)))) return rc;
    if (end == begin) return MU_OK;
    return read_bytes(r, dst->data, (size_t)(end - begin), (uint64_t)begin);
}

size_t mu_st_dtype_size(const char *name) { return mu__file_type_size(mu__file_type(name)); }

int mu_st_reader_read_as(mu_st_reader *r, int64_t begin, int64_t end, const char *dtype,
                         mu_tensor *dst)
{
    if (!r || !dst || !dtype) return mu__fail(MU_EINVAL, "reader, dtype or dst is NULL");
    int rc = mu__tensor_check(dst, "dst");
    if (rc) return rc;
    int ft = mu__file_type(dtype);
    if (ft < 0) return mu__fail(MU_EDTYPE, "safetensors '%s': dtype '%s' is not one muon reads", r->path, dtype);
    if (ft == mu__file_type_of(dst->scalar)) return mu_st_reader_read(r, begin, end, dst);
    size_t es = mu__file_type_size(ft), ds = mu_dtype_size(dst->scalar);
    if ((rc = check_span(r, begin, end, dst, es))) return rc;
    enum { CHUNK = 1 << 16 }; /* elements per read */
    char *buf = malloc(CHUNK * es);
    if (!buf) return mu__fail(MU_ENOMEM, "safetensors '%s': no memory for a read buffer", r->path);
    int64_t numel = mu_tensor_numel(dst);
    for (int64_t k = 0; k < numel && !rc; k += CHUNK) {
        int64_t m = numel - k < CHUNK ? numel - k : CHUNK;
        rc = read_bytes(r, buf, (size_t)m * es, (uint64_t)begin + (uint64_t)k * es);
        if (!rc) mu__file_convert(ft, buf, m, (char *)dst->data + k * (int64_t)ds, dst->scalar);
    }
    free(buf);
    return rc;
}

int mu_st_reader_checksum(mu_st_reader *r, uint64_t *out)
{
    if (!r || !out) return mu__fail(MU_EINVAL, "reader or out is NULL");
    enum { CHUNK = 1 << 20 };
    char *buf = malloc(CHUNK);
    if (!buf) return mu__fail(MU_ENOMEM, "safetensors '%s': no memory for a read buffer", r->path);
    xxh64_state st;
    xxh64_init(&st);
    uint64_t dsize = r->file_size - r->data_start;
    int rc = MU_OK;
    for (uint64_t k = 0; k < dsize && !rc; k += CHUNK) {
        size_t m = dsize - k < CHUNK ? (size_t)(dsize - k) : CHUNK;
        if (!(rc = read_bytes(r, buf, m, k))) xxh64_update(&st, buf, m);
    }
    free(buf);
    if (!rc) *out = xxh64_digest(&st);
    return rc;
}

/* -------------------------------------------------------------- writer */

int mu_st_write(const char *path, const char *header, size_t header_len, int n,
                mu_tensor *const *ts)
{
    if (!path || !*path) return mu__fail(MU_EINVAL, "path is NULL or empty");
    if (!header && header_len) return mu__fail(MU_EINVAL, "header is NULL");
    if (n < 0 || (n > 0 && !ts)) return mu__fail(MU_EINVAL, "bad tensor list (n = %d)", n);
    size_t pad = (8 - header_len % 8) % 8;
    if (header_len + pad > ST_MAX_HEADER)
        return mu__fail(MU_EINVAL, "safetensors '%s': header of %zu bytes exceeds the limit of %d",
                        path, header_len, (int)ST_MAX_HEADER);
    for (int i = 0; i < n; i++) {
        char what[32];
        snprintf(what, sizeof what, "tensor %d", i);
        int vrc = mu__tensor_check(ts[i], what);
        if (vrc) return vrc;
    }

    char *tmp;
    int fd;
    int rc = mu__tmp_create(path, &tmp, &fd);
    if (rc) return rc;
    unsigned char pre[8];
    uint64_t total = (uint64_t)(header_len + pad);
    for (int i = 0; i < 8; i++) pre[i] = (unsigned char)(total >> (8 * i));
    static const char spaces[8] = {' ', ' ', ' ', ' ', ' ', ' ', ' ', ' '};
    if (mu__write_full(fd, pre, 8) || mu__write_full(fd, header, header_len) ||
        mu__write_full(fd, spaces, pad))
        goto io_fail;
    for (int i = 0; i < n; i++) {
        const mu_tensor *t = ts[i];
        mu_tensor *c = NULL;
        if (!mu_tensor_is_contiguous(t)) {
            rc = mu_tensor_contiguous(t, &c);
            if (rc) goto fail;
            t = c;
        }
        int bad = mu__write_full(fd, t->data, tensor_nbytes(t));
        int saved = errno;
        mu_tensor_free(c);
        errno = saved;
        if (bad) goto io_fail;
    }
    return mu__tmp_commit(path, tmp, fd);
io_fail:
    rc = mu__fail(MU_EIO, "cannot save '%s': writing temporary file '%s' failed: %s", path, tmp,
                  strerror(errno));
fail:
    mu__tmp_abort(tmp, fd);
    return rc;
}
