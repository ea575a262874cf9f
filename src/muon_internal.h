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

#endif
