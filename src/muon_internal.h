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
 * failure, the temporary removed) or abort (close, remove, free). A path
 * that is a directory, a FIFO, a socket or a device, itself or through
 * symbolic links, is refused (MU_EIO); through a link to a file, that file
 * is replaced and the link stays. */
int mu__tmp_create(const char *path, char **tmp, int *fd);
int mu__tmp_commit(const char *path, char *tmp, int fd);
void mu__tmp_abort(char *tmp, int fd);
#endif
