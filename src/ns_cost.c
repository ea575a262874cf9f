/*
 * The Newton-Schulz cost model, the one of the project: what one
 * rows x cols matrix costs with given options, by the iteration
 * mu_ns_method_for picks (and method = "auto" picks by it). The scheduler
 * weighs matrices by it (mu__ns_cost), and through mu_ns_cost_of the Lua
 * layer does too: the plan's owners and the router's waves (muon.dist),
 * the sandbox's charge for a Newton-Schulz call, `muon check`.
 *
 * flops: the floating-point operations the products perform (2 per
 * multiply-add), as the tile plans run them. With n <= m the sides after
 * the transpose, s steps of which s_c have c != 0 (c = 0 skips the A A
 * product), and r restarts of the Gram iteration (src/ns_gram.c):
 *     standard, symmetric   s 3 n^2 m + s_c n^3   (syrk: its triangle only)
 *     standard, plain       s 4 n^2 m + s_c 2 n^3
 *     Gram                  3 (r + 1) n^2 m + (6 s - 5 (r + 1)) n^3 - (s - s_c) n^3
 *     bfloat16 standard     the blocks of its plan (src/ns_bf16.c): the
 *                           tiles on and above the diagonal of X X^T and
 *                           A A, and B X whole
 *     bfloat16 Gram         the same blocks (src/ns_gram_bf16.c): per phase
 *                           X X^T and Q X, per step its symmetric n x n
 *                           products (2 to 4, tiles on and above the
 *                           diagonal), restarts every 2 steps
 *     blocked               shapes of more than one block (a long side of
 *                           8192 or more, src/ns_split.c): the ops of its
 *                           program, per block a syrk (n^2 w) and a symm
 *                           (2 n^2 w) or their bfloat16 tiles, and every
 *                           n x n product as row stripes on the upper
 *                           trapezoid (about n^3 + n^2 128 each; the Gram
 *                           program keeps all of them symmetric: 4 s - 3
 *                           (r + 1) of them, not 6 s - 5 (r + 1) n^3)
 * bytes: what the products and elementwise passes read and write, each
 * operand once per use, in the iteration's element size (4, or 2 for
 * bfloat16), plus the input read and the output written (float32; twice
 * these for float64 tensors): a memory-traffic estimate, which bounds the
 * time of small matrices (the blocked iteration's, whose partial products
 * and stripes add some, is estimated as the unblocked one's).
 */
#include "ns_internal.h"

#include <math.h>

static int popcount64(uint64_t v)
{
    int c = 0;
    for (; v; v &= v - 1) c++;
    return c;
}

/* Steps whose c (as the iteration rounds it) is not 0. */
static double steps_with_c(const mu_ns_opts *o)
{
    double sc = 0;
    for (int k = 0; k < o->steps; k++) {
        const double c = o->coeffs[3 * k + 2];
        sc += o->dtype == MU_BF16 ? mu__f32_from_bf16(mu__bf16_from_f64(c)) != 0.0f : c != 0.0;
    }
    return sc;
}

static double std_flops(double n, double m, const mu_ns_opts *o)
{
    const double s = o->steps, sc = steps_with_c(o);
    return o->path == MU_NS_PLAIN ? s * 4 * n * n * m + sc * 2 * n * n * n
                                  : s * 3 * n * n * m + sc * n * n * n;
}

static double gram_flops(double n, double m, const mu_ns_opts *o)
{
    const double phases = 1 + popcount64(mu__ns_gram_restarts(o->steps, MU_F32));
    return 3 * phases * n * n * m + (6.0 * o->steps - 5 * phases) * n * n * n -
           (o->steps - steps_with_c(o)) * n * n * n;
}

/* The flops of the iteration `method` (standard or Gram) on a rows x cols
 * matrix with valid opts: from the blocked program when the shape has
 * more than one block, from the bfloat16 tile plan, or the formulas. */
static double flops_of(int64_t rows, int64_t cols, const mu_ns_opts *o, int method)
{
    const double n = (double)(rows < cols ? rows : cols), m = (double)(rows < cols ? cols : rows);
    double blocked;
    if (mu__ns_split_flops(rows, cols, o, method, &blocked)) return blocked;
    if (o->dtype != MU_BF16) return method == MU_NS_GRAM ? gram_flops(n, m, o) : std_flops(n, m, o);
    mu__ns_plan p;
    mu__ns_plan_init(&p, MU_F32, rows, cols, MU_NS_SYMMETRIC, 1);
    return method == MU_NS_GRAM ? mu__ns_gram16_flops(&p, o) : mu__ns_bf16_flops(&p, o);
}

/* auto: the Gram iteration when its flops, weighted by GRAM_AUTO_WEIGHT
 * (its n x n products run below the rate of the standard iteration's
 * n x m ones), are fewer, and n is at least GRAM_AUTO_MIN_N (below, call
 * overheads dominate). Checked against measurements (README). */
#define GRAM_AUTO_WEIGHT 1.15
enum { GRAM_AUTO_MIN_N = 64 };
/* bfloat16: the same rule on the tile plans' flops (src/ns_gram_bf16.c,
 * src/ns_bf16.c); measured (README). */
#define GRAM16_AUTO_WEIGHT 1.15

int mu_ns_method_for(int64_t rows, int64_t cols, const mu_ns_opts *opts)
{
    int rc = mu__ns_check_opts(opts);
    if (rc != MU_OK) return rc;
    if (rows < 0 || cols < 0)
        return mu__fail(MU_EINVAL, "ns: rows and cols must be >= 0, got %lld x %lld",
                        (long long)rows, (long long)cols);
    if (opts->precond == MU_NS_PRECOND_AOL) return MU_NS_STANDARD; /* (AOL: src/ns.c only) */
    if (opts->method != MU_NS_AUTO) return opts->method;
    if (opts->steps < 2 || (rows < cols ? rows : cols) < GRAM_AUTO_MIN_N) return MU_NS_STANDARD;
    const double weight = opts->dtype == MU_BF16 ? GRAM16_AUTO_WEIGHT : GRAM_AUTO_WEIGHT;
    return weight * flops_of(rows, cols, opts, MU_NS_GRAM) < flops_of(rows, cols, opts, MU_NS_STANDARD)
               ? MU_NS_GRAM
               : MU_NS_STANDARD;
}

/* The model for a valid opts and method. */
static mu_ns_cost cost_of(int64_t rows, int64_t cols, const mu_ns_opts *o, int method)
{
    const double n = (double)(rows < cols ? rows : cols), m = (double)(rows < cols ? cols : rows);
    const double s = o->steps, sc = steps_with_c(o);
    const double io = 4, es = o->dtype == MU_BF16 ? 2 : 4;
    mu_ns_cost c = {.method = method};
    if (n == 0) return c;
    double elems; /* elements the iteration reads and writes */
    if (method == MU_NS_GRAM) {
        const double phases = 1 + popcount64(mu__ns_gram_restarts(o->steps, o->dtype));
        /* per phase R = X X^T (X in, R out) and X = Q X; per step the n x n
         * products and passes (P, Q, R: eight n x n operands) */
        elems = phases * (3 * n * m + 2 * n * n) + s * 8 * n * n;
    } else {
        /* per step X X^T (X in, A out), A A (A in, B out) when c != 0, B X
         * (B, X in, X out), the elementwise passes over A and B */
        elems = s * (3 * n * m + 3 * n * n) + sc * 2 * n * n;
    }
    c.flops = flops_of(rows, cols, o, method);
    c.bytes = es * (elems + n * m) + io * 2 * n * m; /* + the normalization; in, out */
    return c;
}

int mu_ns_cost_of(int64_t rows, int64_t cols, const mu_ns_opts *opts, mu_ns_cost *out)
{
    if (!out) return mu__fail(MU_EINVAL, "ns: out is NULL");
    memset(out, 0, sizeof *out);
    const int method = mu_ns_method_for(rows, cols, opts);
    if (method < 0) return method;
    *out = cost_of(rows, cols, opts, method);
    return MU_OK;
}

double mu__ns_cost(int64_t rows, int64_t cols, const mu_ns_opts *opts)
{
    mu_ns_cost c;
    return mu_ns_cost_of(rows, cols, opts, &c) == MU_OK ? c.flops : 0.0;
}
