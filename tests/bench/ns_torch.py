"""Times the seed's zeropower_via_newtonschulz5 in torch (2 threads), in
float32 and as the seed runs it, in bfloat16 (its Newton-Schulz inputs are
cast to bfloat16; torch's bf16 matmuls run on oneDNN), and torch's bf16
matmul rate on the iteration's largest product.

  python3 ns_torch.py SHAPE...   (SHAPE like 768x768 or 12x768x768)
prints "# torch <version> oneDNN <version> threads <n>", then per shape
"<shape> <f32 median ms> <bf16 median ms> <bf16 gemm GFLOP/s>".
  python3 ns_torch.py --serve
prints the same first line, then reads requests "<shape> f32|bf16|gemm",
one a line, and answers each with the ms of one call (inputs made once per
shape, the cast to bfloat16 outside the timing): ns_bench.lua times these
calls in the same interleaved rounds as its own.
tests/fixtures/ns_bf16/make.py imports the function.
"""
import re
import sys
import time
from typing import Optional, Sequence, Tuple

import torch

torch.set_num_threads(2)

_NS_LEGACY_COEFFS = (3.4445, -4.7750, 2.0315)
_NS_ASYM5_COEFFS = (
    (4.0848, -6.8946, 2.9270),
    (3.9505, -6.3029, 2.6377),
    (3.7418, -5.5913, 2.3037),
    (2.8769, -3.1427, 1.2046),
    (2.8366, -3.0525, 1.2012),
)


# The seed's function, as the seed writes it.
def zeropower_via_newtonschulz5(
    ns_inputs: torch.Tensor,
    steps: int,
    ns_variant: str = "asym5",
    epsilon: float = 1e-10,
    ns_coefficients: Optional[Sequence[Tuple[float, float, float]]] = None,
) -> torch.Tensor:
    """Newton-Schulz orthogonalization with preallocated matmul buffers."""
    mat_x = ns_inputs
    transposed = ns_inputs.size(-2) > ns_inputs.size(-1)
    if transposed:
        mat_x = mat_x.mT

    # Normalize input before Newton-Schulz iteration.
    mat_x = mat_x / (mat_x.norm(dim=(-2, -1), keepdim=True) + epsilon)

    n_size = mat_x.size(-2)
    buf_a = torch.empty(mat_x.shape[:-2] + (n_size, n_size), dtype=mat_x.dtype, device=mat_x.device)
    buf_b = torch.empty_like(buf_a)
    buf_c = torch.empty(mat_x.shape, dtype=mat_x.dtype, device=mat_x.device)

    if ns_variant == "legacy":
        step_coeffs = [_NS_LEGACY_COEFFS] * steps
    elif ns_variant == "asym5":
        step_coeffs = _NS_ASYM5_COEFFS[:steps]
    elif ns_variant == "custom":
        if ns_coefficients is None:
            raise ValueError("ns_coefficients must be provided when ns_variant='custom'")
        if steps > len(ns_coefficients):
            raise ValueError(
                f"ns_steps={steps} exceeds the {len(ns_coefficients)} provided coefficient groups"
            )
        step_coeffs = tuple(ns_coefficients[:steps])
    else:
        raise ValueError(
            f"ns_variant must be 'legacy', 'asym5', or 'custom', got {ns_variant!r}"
        )

    for coeff_a, coeff_b, coeff_c in step_coeffs:
        torch.matmul(mat_x, mat_x.mT, out=buf_a)
        torch.matmul(buf_a, buf_a, out=buf_b)
        buf_a.mul_(coeff_b)
        buf_b.mul_(coeff_c)
        buf_a.add_(buf_b)
        torch.matmul(buf_a, mat_x, out=buf_c)
        mat_x.mul_(coeff_a).add_(buf_c)

    del buf_a, buf_b, buf_c

    if transposed:
        mat_x = mat_x.mT

    return mat_x


def median_ms(fn, budget=2.0, max_runs=7):
    with torch.no_grad():
        t0 = time.perf_counter()
        fn()  # warm-up
        first = time.perf_counter() - t0
        runs = max(2 if first > 3 else 3, min(max_runs, int(budget / max(first, 1e-6))))
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2] * 1e3


def inputs(shape):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(*shape, generator=g, dtype=torch.float32)
    xb = x.to(torch.bfloat16)  # the seed's cast (its momentum step), outside the timing
    # bf16 matmul (n x n)(n x m), n the smaller dim: the iteration's largest product
    n, m = min(shape[-2:]), max(shape[-2:])
    a = torch.randn(n, n, generator=g).to(torch.bfloat16)
    b = torch.randn(n, m, generator=g).to(torch.bfloat16)
    c = torch.empty(n, m, dtype=torch.bfloat16)
    return {
        "f32": lambda: zeropower_via_newtonschulz5(x, 5),
        "bf16": lambda: zeropower_via_newtonschulz5(xb, 5),
        "gemm": lambda: torch.matmul(a, b, out=c),
    }, 2.0 * n * n * m


def bench(shape):
    fns, gemm_flops = inputs(shape)
    ms = median_ms(fns["gemm"], budget=0.5)
    return median_ms(fns["f32"]), median_ms(fns["bf16"]), gemm_flops / (ms * 1e-3) / 1e9


def serve():
    cache = {}
    with torch.no_grad():
        for line in sys.stdin:
            words = line.split()
            if len(words) != 2:
                break
            shape, kind = words
            if shape not in cache:
                cache[shape] = inputs(tuple(int(v) for v in shape.split("x")))[0]
            fn = cache[shape][kind]
            t0 = time.perf_counter()
            fn()
            print(f"{(time.perf_counter() - t0) * 1e3:.4f}", flush=True)


def main():
    m = re.search(r"MKL-DNN v([0-9.]+)", torch.__config__.show())
    onednn = m.group(1) if m and torch.backends.mkldnn.is_available() else "none"
    print(f"# torch {torch.__version__} oneDNN {onednn} threads {torch.get_num_threads()}", flush=True)
    if sys.argv[1:] == ["--serve"]:
        serve()
        return
    for arg in sys.argv[1:]:
        shape = tuple(int(v) for v in arg.split("x"))
        f32, bf16, rate = bench(shape)
        print(f"{arg} {f32:.3f} {bf16:.3f} {rate:.1f}", flush=True)


if __name__ == "__main__":
    main()
