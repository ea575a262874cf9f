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

#endif
