"""Times the seed's zeropower_via_newtonschulz5 (float32, torch, 2 threads).

Usage: python3 ns_torch.py SHAPE... where SHAPE is like 768x768 or 12x768x768.
Prints one line per shape: "<shape> <median ms>". Used by ns_bench.lua.
"""
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


# Copied from the seed (reference/seed_muon.py.txt), indentation restored.
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


def bench(shape, budget=2.0, max_runs=7):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(*shape, generator=g, dtype=torch.float32)
    with torch.no_grad():
        t0 = time.perf_counter()
        zeropower_via_newtonschulz5(x, 5)  # warm-up
        first = time.perf_counter() - t0
        runs = max(2 if first > 3 else 3, min(max_runs, int(budget / max(first, 1e-6))))
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            zeropower_via_newtonschulz5(x, 5)
            times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2] * 1e3


def main():
    for arg in sys.argv[1:]:
        shape = tuple(int(v) for v in arg.split("x"))
        print(f"{arg} {bench(shape):.3f}", flush=True)


if __name__ == "__main__":
    main()
