"""The Python side of tests/bench/python_bench.lua: the GPT-2-small
parameter set of tests/bench/step_host.c as torch tensors (NumPy arrays
without torch) with fixed gradients, through libmuon.Optimizer on the same
config; STEPS timed opt.step() calls after one warm-up. Prints
"RESULT <median seconds per step> <seconds of the package's own work per
step>" (checking and handing over every gradient: opt._sync, timed apart).
    PYTHONPATH=src python3 tests/bench/python_step.py CONFIG STEPS
"""
import sys
import time

import numpy as np

import libmuon

try:
    import torch
except ImportError:
    torch = None

config, steps = sys.argv[1], int(sys.argv[2])


def filled(shape, phase):
    return (0.02 * np.sin(0.37 * np.arange(shape[0] * shape[1]) + phase)).astype(np.float32).reshape(shape)


params, k = [], 0
for layer in range(12):
    for s, shape in enumerate([(768, 768)] * 4 + [(768, 3072), (3072, 768)]):
        params.append(("h.%d.w%d" % (layer, s), filled(shape, k), filled(shape, 1000 + k)))
        k += 1
params.append(("wte", filled((50257, 768), 7), filled((50257, 768), 8)))
if torch is not None:
    named = []
    for name, v, g in params:
        p = torch.nn.Parameter(torch.from_numpy(v))
        p.grad = torch.from_numpy(g)
        named.append((name, p))
    opt = libmuon.Optimizer(named, config=config)
else:
    opt = libmuon.Optimizer(params, config=config)
opt.step()  # warm-up: state and buffers
times = []
for _ in range(steps):
    t0 = time.perf_counter()
    opt.step()
    times.append(time.perf_counter() - t0)
t0 = time.perf_counter()
for _ in range(100):
    opt._sync()
own = (time.perf_counter() - t0) / 100
print("RESULT %.9f %.9f" % (sorted(times)[(steps - 1) // 2], own))
