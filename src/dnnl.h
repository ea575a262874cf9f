/* The oneDNN adapter (src/dnnl.c): bfloat16 matrix products for the
 * bfloat16 Newton-Schulz iterations, one adapter per workspace (not part
 * of the public API). */
#ifndef MUON_DNNL_H
#define MUON_DNNL_H

#include <stddef.h>
#include <stdint.h>

typedef struct mu__dnnl mu__dnnl;
int mu__dnnl_open(mu__dnnl **out);
void mu__dnnl_close(mu__dnnl *d);
/* The calling thread's OpenMP thread count (oneDNN's), and setting it. */
int mu__dnnl_threads(const mu__dnnl *d);
void mu__dnnl_set_threads(const mu__dnnl *d, int n);
/* MU_OK, or MU_ENOMEM (and clear) when a product failed since the last call. */
int mu__dnnl_take_failure(mu__dnnl *d);
/* A product C (M x N float32, ld ldc) = A (M x K bfloat16, ld lda) * op(B):
 * B K x N with ld ldb (transb 0), or B^T with B N x K, ld ldb (transb 1);
 * row-major. */
typedef struct mu__dnnl_shape {
    int64_t M, N, K, lda, ldb, ldc;
    int transb;
} mu__dnnl_shape;
/* Before a call's workers start (serial, allocating): mu__dnnl_want for
 * every product shape the call runs, then mu__dnnl_workers for its most
 * workers (ranks 0 .. workers-1). Both keep what they made until
 * mu__dnnl_close; MU_ENOMEM / MU_EIO on failure. */
int mu__dnnl_want(mu__dnnl *d, const mu__dnnl_shape *s);
int mu__dnnl_workers(mu__dnnl *d, int workers);
/* The bytes of the per-worker buffers (0 for NULL). */
size_t mu__dnnl_bytes(const mu__dnnl *d);
/* Run a product of a wanted shape on worker w (the calling thread, one
 * OpenMP thread); no allocation. A failure is kept for mu__dnnl_take_failure. */
void mu__dnnl_gemm(mu__dnnl *d, int w, const mu__dnnl_shape *s, const uint16_t *a,
                   const uint16_t *b, float *c);
void mu__dnnl_describe(char *buf, size_t cap);
#endif
