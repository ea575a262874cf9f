"""Train the char model or the transformer with torch.optim.AdamW.

    python3 examples/python/train_torch.py [--model char|transformer] [--steps N]

examples/python/train_muon.py is this loop ported to libmuon (diff them).
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--model", default="char", choices=["char", "transformer"])
ap.add_argument("--steps", type=int, default=1000)
ap.add_argument("--batch", type=int, default=512)
ap.add_argument("--hidden", type=int, default=384)
args = ap.parse_args()

torch.manual_seed(0)
(x, y), (hx, hy) = models.dataset(ctx=8)
model = models.make(args.model, **({"hidden": args.hidden} if args.model == "char" else {}))
opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20))

for step in range(1, args.steps + 1):
    idx = torch.randint(0, len(x), (args.batch,))
    loss = F.cross_entropy(model(x[idx]), y[idx])
    loss.backward()
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    if step == 1 or step % max(1, args.steps // 5) == 0:
        with torch.no_grad():
            held = F.cross_entropy(model(hx), hy).item()
        print("step %5d  train %.4f  held-out %.4f" % (step, loss.item(), held), flush=True)
