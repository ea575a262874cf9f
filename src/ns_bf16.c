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
 * (mu__dnnl_workers); the per-worker buffers, sized by the largest shape,
 * are made then and kept with the workspace (mu_ns_workspace_bytes counts
 * them).
 *
 * Reproducible bits: every product here runs on one thread (the calling
 * worker's; its OpenMP thread count is set to 1 around the call, and the
 * primitive cache keys on that count), on a tile whose sizes, strides and
 * scalars come from the shape only (src/ns.c). oneDNN's kernels depend on
 * the CPU's ISA (as OpenBLAS's on its core): processes of one distributed
 * run must share it (ONEDNN_MAX_CPU_ISA can pin it).
 */
#include "muon_internal.h"

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
    X(dnnl_primitive_execute)                                                                   \
    X(dnnl_get_effective_cpu_isa)                                                               \
    X(dnnl_cpu_isa2str)                                                                         \
    X(dnnl_version)

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
};
#undef MU__DNNL_FIELD

static const char *const dnnl_soname = "libdnnl.so.2";

void mu__dnnl_close(mu__dnnl *d)
{
    if (!d) return;
    for (int w = 0; w < d->nworkers; w++) free(d->stage[w]);
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

/* Bytes of a per-worker buffer of `bytes` (rounded up to a cache line, at least one). */
static size_t dnnl_round(size_t bytes) { return ((bytes ? bytes : 1) + 63) & ~(size_t)63; }

int mu__dnnl_want(mu__dnnl *d, const mu__dnnl_shape *s)
{
    if (d->widen) {
        const int64_t need = s->M * s->K + s->K * s->N;
        if (need > d->stage_need) d->stage_need = need;
    }
    return MU_OK;
}

int mu__dnnl_workers(mu__dnnl *d, int workers)
{
    if (workers > MU__POOL_MAX) workers = MU__POOL_MAX;
    if (workers < d->nworkers) workers = d->nworkers;
    if (d->stage_need > d->stage_elems) { /* every worker's stage grows */
        for (int w = 0; w < d->nworkers; w++) {
            free(d->stage[w]);
            d->stage[w] = NULL;
        }
        d->stage_elems = d->stage_need;
    }
    for (int w = 0; w < workers; w++) {
        if (d->widen && !d->stage[w]) {
            d->stage[w] = aligned_alloc(64, dnnl_round((size_t)d->stage_elems * sizeof(float)));
            if (!d->stage[w]) {
                /* the workers before w keep theirs; w and after have none */
                d->nworkers = w;
                return mu__fail(MU_ENOMEM, "ns: out of memory (bfloat16 staging, %lld floats)",
                                (long long)d->stage_elems);
            }
        }
        if (w >= d->nworkers) d->nworkers = w + 1;
    }
    return MU_OK;
}

size_t mu__dnnl_bytes(const mu__dnnl *d)
{
    if (!d) return 0;
    size_t n = 0;
    for (int w = 0; w < d->nworkers; w++)
        if (d->stage[w]) n += dnnl_round((size_t)d->stage_elems * sizeof(float));
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
    const int64_t M = s->M, N = s->N, K = s->K, lda = s->lda, ldb = s->ldb, ldc = s->ldc;
    const int transb = s->transb;
    dnnl_memory_desc_t ma, mb, mc;
    const dnnl_dims_t da = {M, K}, db = {K, N}, dc = {M, N};
    const dnnl_dims_t sa = {lda, 1}, sc = {ldc, 1};
    dnnl_dims_t sb = {ldb, 1};
    if (transb) {
        sb[0] = 1;
        sb[1] = ldb;
    }
    if (d->widen) {
        dnnl_widened(d, w, s, a, b, c);
        return;
    }
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t prim = NULL;
    dnnl_memory_t mx = NULL, my = NULL, mz = NULL;
    dnnl_stream_t stream = NULL;
    dnnl_matmul_desc_t desc;
    int ok = 0;
    d->omp_set_num_threads(1); /* this thread's products: one thread (fixed bits) */
    if (d->dnnl_memory_desc_init_by_strides(&ma, 2, da, dnnl_bf16, sa) == dnnl_success &&
        d->dnnl_memory_desc_init_by_strides(&mb, 2, db, dnnl_bf16, sb) == dnnl_success &&
        d->dnnl_memory_desc_init_by_strides(&mc, 2, dc, dnnl_f32, sc) == dnnl_success &&
        d->dnnl_matmul_desc_init(&desc, &ma, &mb, NULL, &mc) == dnnl_success &&
        d->dnnl_primitive_desc_create(&pd, &desc, NULL, d->engine, NULL) == dnnl_success &&
        d->dnnl_primitive_create(&prim, pd) == dnnl_success &&
        d->dnnl_memory_create(&mx, &ma, d->engine, (void *)a) == dnnl_success &&
        d->dnnl_memory_create(&my, &mb, d->engine, (void *)b) == dnnl_success &&
        d->dnnl_memory_create(&mz, &mc, d->engine, c) == dnnl_success &&
        d->dnnl_stream_create(&stream, d->engine, dnnl_stream_default_flags) == dnnl_success) {
        const dnnl_exec_arg_t args[3] = {
            {DNNL_ARG_SRC, mx}, {DNNL_ARG_WEIGHTS, my}, {DNNL_ARG_DST, mz}};
        ok = d->dnnl_primitive_execute(prim, stream, 3, args) == dnnl_success &&
             d->dnnl_stream_wait(stream) == dnnl_success;
    }
    if (stream) d->dnnl_stream_destroy(stream);
    if (mx) d->dnnl_memory_destroy(mx);
    if (my) d->dnnl_memory_destroy(my);
    if (mz) d->dnnl_memory_destroy(mz);
    if (prim) d->dnnl_primitive_destroy(prim);
    if (pd) d->dnnl_primitive_desc_destroy(pd);
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
