"""torch side of tests/bench/foreach_bench.lua: the seed's momentum sequence
(torch._foreach_*) and decay+apply on a GPT-2-small-like float32 set, 2 threads.
Usage: python3 foreach_torch.py [LAYERS]; prints key=value lines."""
import sys
import time

import torch

torch.set_num_threads(2)
layers = int(sys.argv[1]) if len(sys.argv) > 1 else 12
shapes = []
for _ in range(layers):
    shapes += [(768, 768)] * 4 + [(768, 3072), (3072, 768)]
gen = torch.Generator().manual_seed(0)
grads = [torch.randn(s, generator=gen) for s in shapes]
bufs = [torch.randn(s, generator=gen) for s in shapes]
params = [torch.randn(s, generator=gen) for s in shapes]
n = sum(g.numel() for g in grads)


def best_time(fn, reps=7):
    """Best of reps runs, like the Lua side."""
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def momentum(m1=0.95, m2=0.95, nesterov=True):
    us = torch._foreach_add(grads, bufs, alpha=m1)
    torch._foreach_mul_(bufs, m2)
    torch._foreach_add_(bufs, grads)
    if nesterov:
        torch._foreach_mul_(us, m1)
        torch._foreach_add_(us, grads)
    return us


us = momentum()


def apply(lr=0.02, wd=0.1):
    torch._foreach_mul_(params, 1 - lr * wd)
    torch._foreach_add_(params, us, alpha=-lr)


with torch.no_grad():
    tm = best_time(momentum)
    ta = best_time(apply)
print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
print(f"torch momentum_ms={tm * 1e3:.1f} momentum_gbs={16 * n / tm / 1e9:.1f} "
      f"(same 16 B/element as the fused pass)")
print(f"torch apply_ms={ta * 1e3:.1f} apply_gbs={12 * n / ta / 1e9:.1f}")
