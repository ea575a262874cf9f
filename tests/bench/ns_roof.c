/*
 * The roof of Newton-Schulz on this machine (tests/bench/ns_roof_bench.lua
 * builds and runs it; `make bench`): in-register peaks, the same-run gemm
 * rates, and Newton-Schulz as a fraction of each, per shape. Every line is
 * printed (and flushed) as soon as it is measured.
 *
 *   ns_roof [SHAPE ...]     SHAPE like 768x3072 or 12x768x768
 *
 * - Peaks: float32 FMA (AVX-512 where the CPU has it, else AVX2+FMA) and the
 *   bfloat16 dot product vdpbf16ps (AVX512_BF16 only), on 1 thread and on
 *   one thread per OpenBLAS thread; each thread runs ACC independent
 *   accumulators (more than FMA latency x FMA units), so latency does not
 *   cap the rate: the rate is the core's throughput.
 * - gemm: OpenBLAS sgemm (its threads) and oneDNN's bf16 matmul (its OpenMP
 *   threads; "n/a" where it has none, e.g. below AVX-512) on the
 *   iteration's largest product, (n x n)(n x m), n <= m the sides.
 * - Newton-Schulz: mu_ns_zeropower with method auto, asym5, 5 steps, in
 *   float32 and in bfloat16; its rate counts the flops it performs (the
 *   cost model, mu_ns_cost_of), as a fraction of the same-run gemm rate of
 *   its dtype and of its peak.
 * Medians of interleaved runs; ms and GFLOP/s.
 */
#include "muon_ffi.h"

#include <cblas.h>
#include <immintrin.h>
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

/* ------------------------------------------------------------- peaks */

/* Accumulators: AVX-512 has 32 vector registers, AVX2 16 (12 accumulators,
 * the two operands and room, so none spills); both more than the FMA
 * latency (4-6 cycles) times the FMA units (2). */
enum { ACC = 16, ACC_AVX2 = 12 };
static volatile float sink;

#define FMA_KERNEL(NAME, ATTR, VEC, SET1, FMA, LANES, ADD, STORE, NACC)                                  \
    ATTR static double NAME(long iters)                                                             \
    {                                                                                               \
        VEC acc[NACC];                                                                               \
        const VEC b = SET1(0.999999f), c = SET1(1e-7f);                                             \
        for (int k = 0; k < NACC; k++) acc[k] = SET1(1.0f + 0.001f * (float)k);                      \
        for (long i = 0; i < iters; i++) {                                                          \
            _Pragma("GCC unroll 16") for (int k = 0; k < NACC; k++) acc[k] = FMA(acc[k], b, c);      \
        }                                                                                           \
        for (int k = 1; k < NACC; k++) acc[0] = ADD(acc[0], acc[k]);                                 \
        float out[LANES];                                                                           \
        STORE(out, acc[0]);                                                                         \
        sink = out[0];                                                                              \
        return 2.0 * LANES * NACC * (double)iters;                                                    \
    }

FMA_KERNEL(fma_avx2, __attribute__((target("avx2,fma"))), __m256, _mm256_set1_ps, _mm256_fmadd_ps, 8,
           _mm256_add_ps, _mm256_storeu_ps, ACC_AVX2)
FMA_KERNEL(fma_avx512, __attribute__((target("avx512f"))), __m512, _mm512_set1_ps, _mm512_fmadd_ps, 16,
           _mm512_add_ps, _mm512_storeu_ps, ACC)

/* vdpbf16ps: per lane two bfloat16 products summed into a float32: 16 lanes
 * x 2 multiply-adds = 64 flops per instruction. */
__attribute__((target("avx512f,avx512bf16"))) static double dot_bf16(long iters)
{
    __m512 acc[ACC];
    const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3380);
    for (int k = 0; k < ACC; k++) acc[k] = _mm512_set1_ps((float)k);
    for (long i = 0; i < iters; i++) {
        _Pragma("GCC unroll 16") for (int k = 0; k < ACC; k++) acc[k] = _mm512_dpbf16_ps(acc[k], a, b);
    }
    for (int k = 1; k < ACC; k++) acc[0] = _mm512_add_ps(acc[0], acc[k]);
    float out[16];
    _mm512_storeu_ps(out, acc[0]);
    sink = out[0];
    return 64.0 * ACC * (double)iters;
}

typedef double (*kernel_fn)(long);
typedef struct {
    kernel_fn fn;
    long iters;
    double flops, secs;
} peak_job;

static void *peak_thread(void *arg)
{
    peak_job *j = arg;
    const double t0 = now();
    j->flops = j->fn(j->iters);
    j->secs = now() - t0;
    return NULL;
}

/* GFLOP/s of fn on `threads` threads at once (best of 5: the in-register
 * rate is a ceiling; a slower run was interrupted). */
static double peak(kernel_fn fn, int threads)
{
    long iters = 1 << 16;
    while (1) { /* about 0.1 s per run */
        const double t0 = now();
        fn(iters);
        if (now() - t0 > 0.05) break;
        iters *= 2;
    }
    double best = 0;
    for (int r = 0; r < 5; r++) {
        peak_job jobs[64];
        pthread_t tid[64];
        for (int t = 0; t < threads; t++) {
            jobs[t] = (peak_job){.fn = fn, .iters = iters};
            pthread_create(&tid[t], NULL, peak_thread, &jobs[t]);
        }
        double flops = 0, secs = 0;
        for (int t = 0; t < threads; t++) {
            pthread_join(tid[t], NULL);
            flops += jobs[t].flops;
            if (jobs[t].secs > secs) secs = jobs[t].secs;
        }
        if (flops / secs > best) best = flops / secs;
    }
    return best * 1e-9;
}

/* ------------------------------------------------------------- gemm rates */

/* GFLOP/s of OpenBLAS sgemm (n x n)(n x m), median of runs. */
static double sgemm_rate(int n, int m)
{
    float *a = malloc(sizeof(float) * (size_t)n * n), *b = malloc(sizeof(float) * (size_t)n * m),
          *c = malloc(sizeof(float) * (size_t)n * m);
    for (long i = 0; i < (long)n * n; i++) a[i] = (float)((i * 7) % 13) * 0.01f;
    for (long i = 0; i < (long)n * m; i++) b[i] = (float)((i * 5) % 11) * 0.01f;
    double t[7];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, m, n, 1.0f, a, n, b, m, 0.0f, c, m);
    for (int r = 0; r < 7; r++) {
        const double t0 = now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, m, n, 1.0f, a, n, b, m, 0.0f, c, m);
        t[r] = now() - t0;
    }
    free(a);
    free(b);
    free(c);
    return 2.0 * n * (double)n * m / median(t, 7) * 1e-9;
}

/* GFLOP/s of oneDNN's bf16 matmul (bf16 inputs, float32 output), or -1 when
 * oneDNN has none on this CPU. */
static double bf16_gemm_rate(int n, int m)
{
    dnnl_engine_t eng;
    dnnl_stream_t st;
    if (dnnl_engine_create(&eng, dnnl_cpu, 0) != dnnl_success) return -1;
    dnnl_stream_create(&st, eng, dnnl_stream_default_flags);
    const dnnl_dims_t da = {n, n}, db = {n, m}, dc = {n, m};
    dnnl_memory_desc_t ma, mb, mc;
    dnnl_memory_desc_init_by_tag(&ma, 2, da, dnnl_bf16, dnnl_ab);
    dnnl_memory_desc_init_by_tag(&mb, 2, db, dnnl_bf16, dnnl_ab);
    dnnl_memory_desc_init_by_tag(&mc, 2, dc, dnnl_f32, dnnl_ab);
    dnnl_matmul_desc_t desc;
    dnnl_primitive_desc_t pd = NULL;
    double rate = -1;
    if (dnnl_matmul_desc_init(&desc, &ma, &mb, NULL, &mc) == dnnl_success &&
        dnnl_primitive_desc_create(&pd, &desc, NULL, eng, NULL) == dnnl_success) {
        dnnl_primitive_t prim;
        dnnl_primitive_create(&prim, pd);
        dnnl_memory_t A, B, Cm;
        dnnl_memory_create(&A, &ma, eng, DNNL_MEMORY_ALLOCATE);
        dnnl_memory_create(&B, &mb, eng, DNNL_MEMORY_ALLOCATE);
        dnnl_memory_create(&Cm, &mc, eng, DNNL_MEMORY_ALLOCATE);
        void *pa, *pb;
        dnnl_memory_get_data_handle(A, &pa);
        dnnl_memory_get_data_handle(B, &pb);
        memset(pa, 0x3f, sizeof(uint16_t) * (size_t)n * n);
        memset(pb, 0x3f, sizeof(uint16_t) * (size_t)n * m);
        dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, A}, {DNNL_ARG_WEIGHTS, B}, {DNNL_ARG_DST, Cm}};
        double t[7];
        dnnl_primitive_execute(prim, st, 3, args);
        dnnl_stream_wait(st);
        for (int r = 0; r < 7; r++) {
            const double t0 = now();
            dnnl_primitive_execute(prim, st, 3, args);
            dnnl_stream_wait(st);
            t[r] = now() - t0;
        }
        rate = 2.0 * n * (double)n * m / median(t, 7) * 1e-9;
        dnnl_memory_destroy(A);
        dnnl_memory_destroy(B);
        dnnl_memory_destroy(Cm);
        dnnl_primitive_destroy(prim);
    }
    if (pd) dnnl_primitive_desc_destroy(pd);
    dnnl_stream_destroy(st);
    dnnl_engine_destroy(eng);
    return rate;
}

/* ------------------------------------------------------- Newton-Schulz */

typedef struct {
    double ms, gflops;
    int method;
} ns_rate;

/* Median ms of mu_ns_zeropower (auto, asym5, 5 steps) on a batch x rows x
 * cols input in dtype (MU_F32 or MU_BF16), and its rate in the flops it
 * performs; ms < 0 when the call fails (e.g. no oneDNN). */
static ns_rate ns_time(int64_t batch, int64_t rows, int64_t cols, int dtype)
{
    double coeffs[15];
    int steps;
    mu_ns_preset("asym5", 5, coeffs, 5, NULL, &steps);
    const mu_ns_opts o = {.steps = steps, .coeffs = coeffs, .eps = 1e-10, .norm_scale = 1.0,
                          .method = MU_NS_AUTO, .dtype = dtype};
    const int64_t shape[3] = {batch, rows, cols};
    mu_tensor *x = NULL, *y = NULL;
    mu_tensor_new(MU_F32, 3, shape, &x);
    mu_tensor_new(MU_F32, 3, shape, &y);
    float *p = x->data;
    uint32_t s = 12345;
    for (int64_t i = 0; i < batch * rows * cols; i++) {
        s = s * 1103515245u + 12345u;
        p[i] = (float)((double)(s >> 8) / (1 << 24) - 0.5);
    }
    mu_ns_workspace *ws = NULL;
    mu_ns_workspace_new(MU_F32, rows, cols, &ws);
    ns_rate r = {.ms = -1};
    mu_ns_cost c;
    mu_ns_cost_of(rows, cols, &o, &c);
    r.method = c.method;
    if (mu_ns_zeropower(x, y, &o, ws) == MU_OK) {
        double t[7];
        for (int k = 0; k < 7; k++) {
            const double t0 = now();
            mu_ns_zeropower(x, y, &o, ws);
            t[k] = now() - t0;
        }
        const double secs = median(t, 7);
        r.ms = secs * 1e3;
        r.gflops = (double)batch * c.flops / secs * 1e-9;
    }
    mu_ns_workspace_free(ws);
    mu_tensor_free(x);
    mu_tensor_free(y);
    return r;
}

/* ------------------------------------------------------------------ main */

static void cpu_line(char *model, size_t cap, int *avx512, int *bf16, int *amx)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[8192];
    snprintf(model, cap, "?");
    *avx512 = *bf16 = *amx = 0;
    int got_model = 0, got_flags = 0;
    while (f && fgets(line, sizeof line, f) && !(got_model && got_flags)) {
        if (!got_model && strncmp(line, "model name", 10) == 0) {
            const char *v = strchr(line, ':');
            snprintf(model, cap, "%s", v ? v + 2 : "?");
            model[strcspn(model, "\n")] = 0;
            got_model = 1;
        } else if (!got_flags && strncmp(line, "flags", 5) == 0) {
            *avx512 = strstr(line, " avx512f") != NULL;
            *bf16 = strstr(line, " avx512_bf16") != NULL;
            *amx = strstr(line, " amx_bf16") != NULL || strstr(line, " amx_tile") != NULL;
            got_flags = 1;
        }
    }
    if (f) fclose(f);
}

int main(int argc, char **argv)
{
    mu_blas_fix_core(argv);
    static const char *defaults[] = {"768x768", "2048x2048", "768x3072", "3072x768", "1024x4096", "12x768x768"};
    const char **shapes = argc > 1 ? (const char **)argv + 1 : defaults;
    const int nshapes = argc > 1 ? argc - 1 : (int)(sizeof defaults / sizeof *defaults);
    setvbuf(stdout, NULL, _IOLBF, 0);

    char model[256];
    int avx512, bf16, amx;
    cpu_line(model, sizeof model, &avx512, &bf16, &amx);
    mu_blas_info info;
    mu_blas_get_info(&info);
    const int threads = info.threads < 1 ? 1 : info.threads;
    printf("CPU %s; AVX-512 %s, AVX512_BF16 %s, AMX %s; OpenBLAS core %s, %d threads; bf16 products: %s\n", model,
           avx512 ? "yes" : "no", bf16 ? "yes" : "no", amx ? "yes" : "no", info.core, threads, info.bf16);

    const kernel_fn fma = avx512 ? fma_avx512 : fma_avx2;
    const double f1 = peak(fma, 1), fn = peak(fma, threads);
    printf("peak fp32 FMA (%s, %d accumulators): %.0f GFLOP/s on 1 thread, %.0f on %d\n",
           avx512 ? "AVX-512" : "AVX2", avx512 ? ACC : ACC_AVX2, f1, fn, threads);
    double b1 = -1, bn = -1;
    if (bf16) {
        b1 = peak(dot_bf16, 1);
        bn = peak(dot_bf16, threads);
        printf("peak bf16 dot (vdpbf16ps, %d accumulators): %.0f GFLOP/s on 1 thread, %.0f on %d\n", ACC, b1, bn,
               threads);
    } else {
        printf("peak bf16 dot: n/a (no AVX512_BF16 on this CPU)\n");
    }

    printf("\n%-11s %8s %8s %8s %8s %7s %7s | %8s %8s %8s %8s %7s %7s\n", "shape", "sgemm", "f32 NS", "ms", "method",
           "/sgemm", "/peak", "bf16 mm", "bf16 NS", "ms", "method", "/mm", "/peak");
    for (int i = 0; i < nshapes; i++) {
        long v[3];
        const int k = sscanf(shapes[i], "%ldx%ldx%ld", &v[0], &v[1], &v[2]);
        if (k < 2) {
            fprintf(stderr, "ns_roof: bad shape '%s'\n", shapes[i]);
            return 2;
        }
        const int64_t batch = k == 3 ? v[0] : 1, rows = v[k - 2], cols = v[k - 1];
        const int n = (int)(rows < cols ? rows : cols), m = (int)(rows < cols ? cols : rows);
        const double sg = sgemm_rate(n, m), mm = bf16_gemm_rate(n, m);
        const ns_rate a = ns_time(batch, rows, cols, MU_F32), b = ns_time(batch, rows, cols, MU_BF16);
        char mmv[16] = "n/a", bns[16] = "n/a", bms[16] = "n/a", bfm[16] = "n/a", bfp[16] = "n/a";
        if (mm > 0) snprintf(mmv, sizeof mmv, "%.0f", mm);
        if (b.ms > 0) {
            snprintf(bns, sizeof bns, "%.0f", b.gflops);
            snprintf(bms, sizeof bms, "%.1f", b.ms);
            if (mm > 0) snprintf(bfm, sizeof bfm, "%.2f", b.gflops / mm);
            if (bn > 0) snprintf(bfp, sizeof bfp, "%.2f", b.gflops / bn);
        }
        printf("%-11s %8.0f %8.0f %8.1f %8s %7.2f %7.2f | %8s %8s %8s %8s %7s %7s\n", shapes[i], sg, a.gflops, a.ms,
               a.method == MU_NS_GRAM ? "gram" : "standard", a.gflops / sg, a.gflops / fn, mmv, bns, bms,
               b.method == MU_NS_GRAM ? "gram" : "standard", bfm, bfp);
    }
    printf("GFLOP/s; sgemm, bf16 mm: OpenBLAS sgemm and oneDNN's bf16 matmul on the (n x n)(n x m) product, all\n"
           "threads; NS: Newton-Schulz (auto, asym5, 5 steps) in the flops it performs (mu_ns_cost_of) per second,\n"
           "and as a fraction of its dtype's gemm rate and of its peak on all threads; medians of 7 runs.\n");
    (void)b1;
    return 0;
}
