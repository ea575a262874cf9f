"""torch side of tests/bench/maths_bench.lua: the same ops on float32
tensors of the same shapes, one thread. Prints name=seconds lines."""
import statistics
import time

import torch

torch.set_num_threads(1)
torch.manual_seed(0)
x = torch.randn(1024, 1024)
logits = torch.randn(512, 4096)
labels = torch.tensor([[(i * 37) % 4096] for i in range(1, 513)])
parts = [torch.randn(256, 1024), torch.randn(256, 1024), torch.randn(512, 1024)]
y = x.clone()


def median_time(fn, reps=9):
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return sorted(ts)[(len(ts) - 1) // 2]


cases = [
    ("exp_ (1M)", lambda: y.copy_(x).exp_()),
    ("sigmoid (1M)", lambda: x.sigmoid()),
    ("tanh (1M)", lambda: x.tanh()),
    ("pow(2) (1M)", lambda: x.pow(2)),
    ("pow(2.5) of |x| (1M)", lambda: y.copy_(x).abs_().pow_(2.5)),
    ("softmax(2) 512x4096", lambda: logits.softmax(1)),
    ("log_softmax(2) 512x4096", lambda: logits.log_softmax(1)),
    ("softmax(1) 512x4096", lambda: logits.softmax(0)),
    ("argmax(2) 512x4096", lambda: logits.argmax(1)),
    ("gather(2, labels) 512x4096", lambda: logits.gather(1, labels)),
    ("cat(3 parts, 1) 1024x1024", lambda: torch.cat(parts, 0)),
]
with torch.no_grad():
    for name, fn in cases:
        print("%s=%.9f" % (name, median_time(fn)))
