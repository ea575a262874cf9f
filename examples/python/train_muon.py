"""Train the char model or the transformer with libmuon and configs/muon.lua.

    PYTHONPATH=src python3 examples/python/train_muon.py [--model char|transformer] [--steps N]

examples/python/train_torch.py is the same loop with torch.optim.AdamW (diff them).
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402
import libmuon  # noqa: E402 (PYTHONPATH=src from the source tree)

ap = argparse.ArgumentParser()
ap.add_argument("--model", default="char", choices=["char", "transformer"])
ap.add_argument("--steps", type=int, default=1000)
ap.add_argument("--batch", type=int, default=512)
ap.add_argument("--hidden", type=int, default=384)
args = ap.parse_args()

torch.manual_seed(0)
(x, y), (hx, hy) = models.dataset(ctx=8)
model = models.make(args.model, **({"hidden": args.hidden} if args.model == "char" else {}))
opt = libmuon.Optimizer(model.named_parameters(), config=libmuon.config_path("muon"))  # warmup, cosine

for step in range(1, args.steps + 1):
    idx = torch.randint(0, len(x), (args.batch,))
    loss = F.cross_entropy(model(x[idx]), y[idx])
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if step == 1 or step % max(1, args.steps // 5) == 0:
        with torch.no_grad():
            held = F.cross_entropy(model(hx), hy).item()
        print("step %5d  train %.4f  held-out %.4f" % (step, loss.item(), held), flush=True)
