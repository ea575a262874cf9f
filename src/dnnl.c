/*
 * bfloat16 matrix products for Newton-Schulz (mu_ns_opts.dtype = MU_BF16),
 * on oneDNN's matmul primitive (Debian libdnnl2): bfloat16 inputs,
 * float32 accumulation and output. oneDNN picks its kernels by CPU:
 * AVX512_BF16 (vdpbf16ps) or AMX where the CPU has them, else an emulation
 * on AVX-512 / AVX2 (slower, the same maths); `muon info` names the path.
 *
 * The library is opened with dlopen on a workspace's first bfloat16 call
 * (and closed with it), so a process that never asks for bfloat16 does not
 * load it (nor its OpenMP runtime and OpenCL loader); without it, bfloat16
 * calls fail with MU_EIO naming the library.
 *
 * Below AVX-512 (e.g. ONEDNN_MAX_CPU_ISA=AVX2), oneDNN 2.x has no bfloat16
 * matmul: each product then widens its bfloat16 tiles to float32 (exact)
 * into its worker's staging buffer and runs OpenBLAS sgemm, the same maths
 * (float32 accumulation of exact products), slower.
 *
 * No allocation per product: before a call's workers start, src/ns.c names
 * every product shape of the call (mu__dnnl_want) and its most workers
 * (mu__dnnl_workers). Made then and kept with the workspace: a matmul
 * primitive per distinct shape (a handful per matrix shape: the plan's
 * full and ragged blocks), each worker's stream and, per primitive, its
 * memory objects, and each worker's buffers sized by the largest shape:
 * oneDNN's scratchpad (the primitives use a user scratchpad, so any worker
 * may run any of them, concurrently, each with its own) or the widened
 * path's copies; mu_ns_workspace_bytes counts the buffers. A product then
 * only points its worker's memory objects at the tile and runs.
 *
 * Reproducible bits: every product here runs on one thread (the calling
 * worker's; its OpenMP thread count is set to 1 for the call and was 1
 * when its primitive was made, which fixes the kernels' split), on a tile
 * whose sizes, strides and scalars come from the shape only (src/ns.c);
 * which worker runs it, and where its scratchpad is, do not change the
 * kernels. oneDNN's kernels depend on
 * the CPU's ISA (as OpenBLAS's on its core): processes of one distributed
 * run must share it (ONEDNN_MAX_CPU_ISA can pin it).
 */
#include "dnnl.h"
#include "muon_internal.h"
#include "pool.h"

#include <cblas.h>
#include <dlfcn.h>
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The functions muon calls, looked up in the library (their types come
 * from its header). */
#define MU__DNNL_FNS(X)                                                                         \
    X(dnnl_engine_create)                                                                       \
    X(dnnl_engine_destroy)                                                                      \
    X(dnnl_stream_create)                                                                       \
    X(dnnl_stream_destroy)                                                                      \
    X(dnnl_stream_wait)                                                                         \
    X(dnnl_memory_desc_init_by_strides)                                                         \
    X(dnnl_matmul_desc_init)                                                                    \
    X(dnnl_primitive_desc_create)                                                               \
    X(dnnl_primitive_desc_destroy)                                                              \
    X(dnnl_primitive_create)                                                                    \
    X(dnnl_primitive_destroy)                                                                   \
    X(dnnl_memory_create)                                                                       \
    X(dnnl_memory_destroy)                                                                      \
    X(dnnl_memory_set_data_handle)                                                              \
    X(dnnl_memory_desc_get_size)                                                                \
    X(dnnl_primitive_attr_create)                                                               \
    X(dnnl_primitive_attr_destroy)                                                              \
    X(dnnl_primitive_attr_set_scratchpad_mode)                                                  \
    X(dnnl_primitive_desc_query_md)                                                             \
    X(dnnl_primitive_execute)                                                                   \
    X(dnnl_get_effective_cpu_isa)                                                               \
    X(dnnl_cpu_isa2str)                                                                         \
    X(dnnl_version)

enum { DNNL_NARGS = 4 }; /* src, weights, dst, scratchpad */

/* A matmul primitive of one product shape, made once, and each worker's
 * memory objects for it (their data handles set per product). */
typedef struct dnnl_prim {
    mu__dnnl_shape key;
    dnnl_primitive_t prim;
    dnnl_memory_desc_t md[DNNL_NARGS];
    int nargs; /* 4 with a scratchpad, else 3 */
    size_t scratch_bytes;
    dnnl_memory_t mem[MU__POOL_MAX][DNNL_NARGS];
} dnnl_prim;

#define MU__DNNL_FIELD(f) __typeof__(&f) f;
struct mu__dnnl {
    void *lib;
    MU__DNNL_FNS(MU__DNNL_FIELD)
    int (*omp_get_max_threads)(void);
    void (*omp_set_num_threads)(int);
    dnnl_engine_t engine;
    int widen;         /* oneDNN has no bfloat16 matmul on this CPU (below AVX-512) */
    atomic_int failed; /* a product failed (set by any worker) */
    int nworkers;      /* workers with buffers: ranks 0 .. nworkers-1 */
    int64_t stage_need;  /* widened: float32 elements of the largest wanted product's copies */
    int64_t stage_elems; /* widened: elements of each worker's stage (>= stage_need once ready) */
    float *stage[MU__POOL_MAX]; /* widened: worker w's copies of A and B */
    dnnl_prim *prims;           /* the wanted shapes' primitives */
    int nprims, prims_cap;
    int *index;                 /* open addressing into prims: -1 free; at most half full */
    size_t index_cap;           /* a power of two (0: none yet) */
    size_t scratch_need;        /* bytes of the largest primitive's scratchpad */
    size_t scratch_bytes;       /* bytes of each worker's scratchpad (>= scratch_need once ready) */
    void *scratch[MU__POOL_MAX];
    dnnl_stream_t stream[MU__POOL_MAX];
};
#undef MU__DNNL_FIELD

static const char *const dnnl_soname = "libdnnl.so.2";

void mu__dnnl_close(mu__dnnl *d)
{
    if (!d) return;
    for (int i = 0; i < d->nprims; i++) {
        dnnl_prim *e = &d->prims[i];
        for (int w = 0; w < MU__POOL_MAX; w++)
            for (int a = 0; a < DNNL_NARGS; a++)
                if (e->mem[w][a]) d->dnnl_memory_destroy(e->mem[w][a]);
        d->dnnl_primitive_destroy(e->prim);
    }
    free(d->prims);
    free(d->index);
    for (int w = 0; w < MU__POOL_MAX; w++) {
        free(d->stage[w]);
        free(d->scratch[w]);
        if (d->stream[w]) d->dnnl_stream_destroy(d->stream[w]);
    }
    if (d->engine) d->dnnl_engine_destroy(d->engine);
    if (d->lib) dlclose(d->lib);
    free(d);
}

/* Open the library: its functions, a CPU engine. */
int mu__dnnl_open(mu__dnnl **out)
{
    *out = NULL;
    mu__dnnl *d = calloc(1, sizeof *d);
    if (!d) return mu__fail(MU_ENOMEM, "ns: out of memory");
    d->lib = dlopen(dnnl_soname, RTLD_NOW | RTLD_LOCAL);
    if (!d->lib) {
        const char *why = dlerror();
        free(d);
        return mu__fail(MU_EIO, "ns: dtype bfloat16 needs oneDNN (%s, Debian package libdnnl2): %s",
                        dnnl_soname, why ? why : "not found");
    }
    const char *missing = NULL;
#define MU__DNNL_LOAD(f)                                                                        \
    if (!missing && !(*(void **)&d->f = dlsym(d->lib, #f))) missing = #f;
    MU__DNNL_FNS(MU__DNNL_LOAD)
#undef MU__DNNL_LOAD
    if (!missing && !(*(void **)&d->omp_get_max_threads = dlsym(d->lib, "omp_get_max_threads")))
        missing = "omp_get_max_threads";
    if (!missing && !(*(void **)&d->omp_set_num_threads = dlsym(d->lib, "omp_set_num_threads")))
        missing = "omp_set_num_threads";
    if (missing) {
        mu__dnnl_close(d);
        return mu__fail(MU_EIO, "ns: %s lacks %s (oneDNN 2.x with an OpenMP runtime is needed)",
                        dnnl_soname, missing);
    }
    if (d->dnnl_engine_create(&d->engine, dnnl_cpu, 0) != dnnl_success) {
        d->engine = NULL;
        mu__dnnl_close(d);
        return mu__fail(MU_EIO, "ns: oneDNN: no CPU engine");
    }
    atomic_init(&d->failed, 0);
    /* Whether oneDNN has a bfloat16 matmul here (a 16 x 16 one). */
    dnnl_memory_desc_t md;
    const dnnl_dims_t dims = {16, 16}, st = {16, 1};
    dnnl_matmul_desc_t desc;
    dnnl_primitive_desc_t pd = NULL;
    d->dnnl_memory_desc_init_by_strides(&md, 2, dims, dnnl_bf16, st);
    dnnl_memory_desc_t mc;
    d->dnnl_memory_desc_init_by_strides(&mc, 2, dims, dnnl_f32, st);
    d->widen = d->dnnl_matmul_desc_init(&desc, &md, &md, NULL, &mc) != dnnl_success ||
               d->dnnl_primitive_desc_create(&pd, &desc, NULL, d->engine, NULL) != dnnl_success;
    if (pd) d->dnnl_primitive_desc_destroy(pd);
    *out = d;
    return MU_OK;
}

/* The 2-D row-major memory descriptors of a product: A, B (or B^T's
 * strides), C. */
static int dnnl_mds(const mu__dnnl *d, const mu__dnnl_shape *s, dnnl_memory_desc_t md[3])
{
    const dnnl_dims_t da = {s->M, s->K}, db = {s->K, s->N}, dc = {s->M, s->N};
    const dnnl_dims_t sa = {s->lda, 1}, sc = {s->ldc, 1};
    dnnl_dims_t sb = {s->ldb, 1};
    if (s->transb) {
        sb[0] = 1;
        sb[1] = s->ldb;
    }
    return d->dnnl_memory_desc_init_by_strides(&md[0], 2, da, dnnl_bf16, sa) == dnnl_success &&
           d->dnnl_memory_desc_init_by_strides(&md[1], 2, db, dnnl_bf16, sb) == dnnl_success &&
           d->dnnl_memory_desc_init_by_strides(&md[2], 2, dc, dnnl_f32, sc) == dnnl_success;
}

static size_t dnnl_hash(const mu__dnnl_shape *s)
{
    const uint64_t v[7] = {(uint64_t)s->M,   (uint64_t)s->N,   (uint64_t)s->K,     (uint64_t)s->lda,
                           (uint64_t)s->ldb, (uint64_t)s->ldc, (uint64_t)s->transb};
    uint64_t h = 14695981039346656037ull;
    for (int i = 0; i < 7; i++) h = (h ^ v[i]) * 1099511628211ull;
    return (size_t)(h ^ (h >> 29));
}

static int dnnl_same(const mu__dnnl_shape *a, const mu__dnnl_shape *b)
{
    return a->M == b->M && a->N == b->N && a->K == b->K && a->lda == b->lda &&
           a->ldb == b->ldb && a->ldc == b->ldc && a->transb == b->transb;
}

/* The primitive of shape s, or -1. */
static int dnnl_find(const mu__dnnl *d, const mu__dnnl_shape *s)
{
    if (!d->index_cap) return -1;
    for (size_t i = dnnl_hash(s) & (d->index_cap - 1);; i = (i + 1) & (d->index_cap - 1)) {
        const int e = d->index[i];
        if (e < 0 || dnnl_same(&d->prims[e].key, s)) return e;
    }
}

/* Room for one more primitive in prims and index. */
static int dnnl_room(mu__dnnl *d)
{
    if (d->nprims == d->prims_cap) {
        const int cap = d->prims_cap ? 2 * d->prims_cap : 16;
        dnnl_prim *p = realloc(d->prims, (size_t)cap * sizeof *p);
        if (!p) return 0;
        d->prims = p;
        d->prims_cap = cap;
    }
    if (2 * ((size_t)d->nprims + 1) > d->index_cap) { /* rebuild, twice as large */
        const size_t cap = d->index_cap ? 2 * d->index_cap : 32;
        int *ix = malloc(cap * sizeof *ix);
        if (!ix) return 0;
        for (size_t i = 0; i < cap; i++) ix[i] = -1;
        for (int e = 0; e < d->nprims; e++) {
            size_t i = dnnl_hash(&d->prims[e].key) & (cap - 1);
            while (ix[i] >= 0) i = (i + 1) & (cap - 1);
            ix[i] = e;
        }
        free(d->index);
        d->index = ix;
        d->index_cap = cap;
    }
    return 1;
}

/* Make the primitive of shape s into e (one OpenMP thread: the kernels'
 * thread count is fixed when the primitive is made). */
static int dnnl_make(mu__dnnl *d, const mu__dnnl_shape *s, dnnl_prim *e)
{
    memset(e, 0, sizeof *e);
    e->key = *s;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_matmul_desc_t desc;
    const int saved = d->omp_get_max_threads();
    d->omp_set_num_threads(1);
    int ok = d->dnnl_primitive_attr_create(&attr) == dnnl_success &&
             d->dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) ==
                 dnnl_success &&
             dnnl_mds(d, s, e->md) &&
             d->dnnl_matmul_desc_init(&desc, &e->md[0], &e->md[1], NULL, &e->md[2]) ==
                 dnnl_success &&
             d->dnnl_primitive_desc_create(&pd, &desc, attr, d->engine, NULL) == dnnl_success &&
             d->dnnl_primitive_create(&e->prim, pd) == dnnl_success;
    if (ok) {
        const dnnl_memory_desc_t *sp = d->dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
        e->scratch_bytes = sp ? d->dnnl_memory_desc_get_size(sp) : 0;
        e->nargs = e->scratch_bytes ? 4 : 3;
        if (e->scratch_bytes) e->md[3] = *sp;
    }
    d->omp_set_num_threads(saved);
    if (pd) d->dnnl_primitive_desc_destroy(pd);
    if (attr) d->dnnl_primitive_attr_destroy(attr);
    if (!ok)
        return mu__fail(MU_EIO, "ns: oneDNN made no bfloat16 matmul for %lld x %lld x %lld",
                        (long long)s->M, (long long)s->N, (long long)s->K);
    return MU_OK;
}

int mu__dnnl_want(mu__dnnl *d, const mu__dnnl_shape *s)
{
    if (d->widen) {
        const int64_t need = s->M * s->K + s->K * s->N;
        if (need > d->stage_need) d->stage_need = need;
        return MU_OK;
    }
    if (dnnl_find(d, s) >= 0) return MU_OK;
    if (!dnnl_room(d)) return mu__fail(MU_ENOMEM, "ns: out of memory (oneDNN primitives)");
    dnnl_prim *e = &d->prims[d->nprims];
    const int rc = dnnl_make(d, s, e);
    if (rc != MU_OK) return rc;
    if (e->scratch_bytes > d->scratch_need) d->scratch_need = e->scratch_bytes;
    size_t i = dnnl_hash(s) & (d->index_cap - 1);
    while (d->index[i] >= 0) i = (i + 1) & (d->index_cap - 1);
    d->index[i] = d->nprims++;
    return MU_OK;
}

/* Bytes of a per-worker buffer of `bytes` (rounded up to a cache line, at least one). */
static size_t dnnl_round(size_t bytes) { return ((bytes ? bytes : 1) + 63) & ~(size_t)63; }

/* Worker w's stream, buffers and memory objects for every primitive. */
static int dnnl_worker(mu__dnnl *d, int w)
{
    if (d->widen) {
        if (!d->stage[w] &&
            !(d->stage[w] = aligned_alloc(64, dnnl_round((size_t)d->stage_elems * sizeof(float)))))
            return mu__fail(MU_ENOMEM, "ns: out of memory (bfloat16 staging, %lld floats)",
                            (long long)d->stage_elems);
        return MU_OK;
    }
    if (!d->stream[w] &&
        d->dnnl_stream_create(&d->stream[w], d->engine, dnnl_stream_default_flags) != dnnl_success) {
        d->stream[w] = NULL;
        return mu__fail(MU_EIO, "ns: oneDNN: no stream");
    }
    if (d->scratch_bytes && !d->scratch[w] &&
        !(d->scratch[w] = aligned_alloc(4096, d->scratch_bytes))) /* page-aligned as oneDNN's own */
        return mu__fail(MU_ENOMEM, "ns: out of memory (oneDNN scratchpad, %zu bytes)",
                        d->scratch_bytes);
    for (int i = 0; i < d->nprims; i++) {
        dnnl_prim *e = &d->prims[i];
        for (int a = 0; a < e->nargs; a++)
            if (!e->mem[w][a] && d->dnnl_memory_create(&e->mem[w][a], &e->md[a], d->engine,
                                                       DNNL_MEMORY_NONE) != dnnl_success) {
                e->mem[w][a] = NULL;
                return mu__fail(MU_ENOMEM, "ns: out of memory (oneDNN memory objects)");
            }
        if (e->nargs == 4 &&
            d->dnnl_memory_set_data_handle(e->mem[w][3], d->scratch[w]) != dnnl_success)
            return mu__fail(MU_EIO, "ns: oneDNN: cannot set the scratchpad");
    }
    return MU_OK;
}

int mu__dnnl_workers(mu__dnnl *d, int workers)
{
    if (workers > MU__POOL_MAX) workers = MU__POOL_MAX;
    if (workers < d->nworkers) workers = d->nworkers;
    if (d->stage_need > d->stage_elems) { /* every worker's stage grows */
        for (int w = 0; w < MU__POOL_MAX; w++) {
            free(d->stage[w]);
            d->stage[w] = NULL;
        }
        d->stage_elems = d->stage_need;
    }
    if (d->scratch_need > d->scratch_bytes) { /* every worker's scratchpad grows */
        for (int w = 0; w < MU__POOL_MAX; w++) {
            free(d->scratch[w]);
            d->scratch[w] = NULL;
        }
        d->scratch_bytes = (d->scratch_need + 4095) & ~(size_t)4095;
    }
    for (int w = 0; w < workers; w++) {
        const int rc = dnnl_worker(d, w);
        if (rc != MU_OK) {
            d->nworkers = w; /* the workers before w are ready */
            return rc;
        }
    }
    d->nworkers = workers;
    return MU_OK;
}

size_t mu__dnnl_bytes(const mu__dnnl *d)
{
    if (!d) return 0;
    size_t n = 0;
    for (int w = 0; w < MU__POOL_MAX; w++) {
        if (d->stage[w]) n += dnnl_round((size_t)d->stage_elems * sizeof(float));
        if (d->scratch[w]) n += d->scratch_bytes;
    }
    return n;
}

/* The widened product (no bfloat16 matmul in oneDNN on this CPU), through
 * worker w's stage. */
static void dnnl_widened(mu__dnnl *d, int w, const mu__dnnl_shape *s, const uint16_t *a,
                         const uint16_t *b, float *c)
{
    const int64_t M = s->M, N = s->N, K = s->K, lda = s->lda, ldb = s->ldb;
    if (w < 0 || w >= d->nworkers || M * K + K * N > d->stage_elems) { /* not wanted first */
        atomic_store(&d->failed, 1);
        return;
    }
    float *wa = d->stage[w], *wb = wa + M * K;
    for (int64_t i = 0; i < M; i++)
        for (int64_t k = 0; k < K; k++) wa[i * K + k] = mu__f32_from_bf16(a[i * lda + k]);
    const int64_t br = s->transb ? N : K, bc = s->transb ? K : N;
    for (int64_t i = 0; i < br; i++)
        for (int64_t k = 0; k < bc; k++) wb[i * bc + k] = mu__f32_from_bf16(b[i * ldb + k]);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, s->transb ? CblasTrans : CblasNoTrans, (int)M, (int)N,
                (int)K, 1.0f, wa, (int)K, wb, (int)bc, 0.0f, c, (int)s->ldc);
}

int mu__dnnl_threads(const mu__dnnl *d) { return d->omp_get_max_threads(); }

void mu__dnnl_set_threads(const mu__dnnl *d, int n) { d->omp_set_num_threads(n); }

int mu__dnnl_take_failure(mu__dnnl *d)
{
    if (!atomic_exchange(&d->failed, 0)) return MU_OK;
    return mu__fail(MU_ENOMEM, "ns: a oneDNN bfloat16 product failed (out of memory?)");
}

void mu__dnnl_gemm(mu__dnnl *d, int w, const mu__dnnl_shape *s, const uint16_t *a,
                   const uint16_t *b, float *c)
{
    if (d->widen) {
        dnnl_widened(d, w, s, a, b, c);
        return;
    }
    const int i = dnnl_find(d, s);
    if (i < 0 || w < 0 || w >= d->nworkers) { /* not wanted first */
        atomic_store(&d->failed, 1);
        return;
    }
    const dnnl_prim *e = &d->prims[i];
    dnnl_memory_t const *m = e->mem[w];
    const dnnl_exec_arg_t args[DNNL_NARGS] = {{DNNL_ARG_SRC, m[0]},
                                              {DNNL_ARG_WEIGHTS, m[1]},
                                              {DNNL_ARG_DST, m[2]},
                                              {DNNL_ARG_SCRATCHPAD, m[3]}};
    d->omp_set_num_threads(1); /* this thread's products: one thread (fixed bits) */
    const int ok = d->dnnl_memory_set_data_handle(m[0], (void *)a) == dnnl_success &&
                   d->dnnl_memory_set_data_handle(m[1], (void *)b) == dnnl_success &&
                   d->dnnl_memory_set_data_handle(m[2], c) == dnnl_success &&
                   d->dnnl_primitive_execute(e->prim, d->stream[w], e->nargs, args) ==
                       dnnl_success &&
                   d->dnnl_stream_wait(d->stream[w]) == dnnl_success;
    if (!ok) atomic_store(&d->failed, 1);
}

/* "oneDNN 2.6.3 avx512_core_bf16 (AVX512_BF16 instructions)" or why not. */
void mu__dnnl_describe(char *buf, size_t cap)
{
    mu__dnnl *d;
    if (mu__dnnl_open(&d) != MU_OK) {
        snprintf(buf, cap, "none (%s not loadable)", dnnl_soname);
        mu__clear_error();
        return;
    }
    const dnnl_version_t *v = d->dnnl_version();
    const dnnl_cpu_isa_t isa = d->dnnl_get_effective_cpu_isa();
    const char *how = d->widen ? "no bf16 kernels here: widened to float32, OpenBLAS sgemm"
                      : (isa & dnnl_cpu_isa_avx512_core_amx) == dnnl_cpu_isa_avx512_core_amx
                          ? "AMX"
                      : (isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16
                          ? "AVX512_BF16 instructions"
                          : "emulated on AVX-512, no bf16 instructions";
    snprintf(buf, cap, "oneDNN %d.%d.%d %s (%s)", v->major, v->minor, v->patch,
             d->dnnl_cpu_isa2str(isa), how);
    mu__dnnl_close(d);
}
