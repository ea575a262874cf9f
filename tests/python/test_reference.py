"""Numbers against independent references, on the demo's character model
written in torch and on a 2-layer transformer (examples/python/models.py):

- configs/keller.lua (Keller-equivalent options) over 100 steps: the Muon
  group within 1e-5 of a float64 Muon written from the seed (helpers.Muon64)
  given the same gradients, the AdamW group within 1e-6 of torch.optim.AdamW;
- the same config and gradients through the Lua engine (build/muon run):
  bitwise the same parameters.
"""
import os
import sys
import tempfile
import unittest

import numpy as np

import helpers
from helpers import needs_torch

import libmuon

if helpers.HAVE_TORCH:
    import torch
    import torch.nn.functional as F
    sys.path.insert(0, os.path.join(helpers.ROOT, "examples", "python"))
    import models

KELLER = os.path.join(helpers.CONFIGS, "keller.lua")
SIZES = {"char": {"hidden": 64}, "transformer": {"d": 32, "heads": 4}}


def setup(name):
    torch.manual_seed(0)
    (x, y), _ = models.dataset(ctx=8, n_words=600)
    model = models.make(name, **SIZES[name])
    return model, x, y


def batches(x, y, n, size=128, seed=1):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        idx = torch.randint(0, len(x), (size,), generator=g)
        yield x[idx], y[idx]


@needs_torch
class AgainstReferences(unittest.TestCase):
    def check_model(self, name):
        model, x, y = setup(name)
        opt = libmuon.Optimizer(model.named_parameters(), config=KELLER)
        named = dict(model.named_parameters())
        muon_names = [n for g in opt.param_groups if g["optimizer"] == "muon"
                      for n, p in named.items() if any(p is t for t in g["params"])]
        adam_names = [n for n in named if n not in muon_names]
        self.assertTrue(muon_names and adam_names)
        ref_muon = helpers.Muon64([named[n] for n in muon_names], lr=0.02, weight_decay=0, momentum=0.95,
                                  ns_variant="legacy", scale="keller")
        adam_copies = [torch.nn.Parameter(named[n].detach().clone()) for n in adam_names]
        ref_adam = torch.optim.AdamW(adam_copies, lr=3e-3, betas=(0.9, 0.95), eps=1e-10, weight_decay=0)
        worst_muon = worst_adam = 0.0
        for xb, yb in batches(x, y, 100):
            F.cross_entropy(model(xb), yb).backward()
            ref_muon.step([named[n].grad for n in muon_names])
            for c, n in zip(adam_copies, adam_names):
                c.grad = named[n].grad.clone()
            ref_adam.step()
            opt.step()
            opt.zero_grad()
            worst_muon = max(worst_muon, max((named[n].detach().double() - r).abs().max().item()
                                             for n, r in zip(muon_names, ref_muon.p)))
            worst_adam = max(worst_adam, max((named[n].detach() - c.detach()).abs().max().item()
                                             for n, c in zip(adam_names, adam_copies)))
        print("# %s: Muon group %.3g from float64, AdamW group %.3g from torch" % (name, worst_muon, worst_adam))
        self.assertLess(worst_muon, 1e-5, "Muon group vs the float64 reference over 100 steps")
        self.assertLess(worst_adam, 1e-6, "AdamW group vs torch.optim.AdamW over 100 steps")
        self.assertGreater(worst_muon, 0.0)  # (float32 against float64: never exactly equal)

    def test_char_model_keller_vs_float64_muon_and_torch_adamw(self):
        self.check_model("char")

    def test_transformer_keller_vs_float64_muon_and_torch_adamw(self):
        self.check_model("transformer")

    def test_bitwise_equal_to_the_lua_engine(self):
        model, x, y = setup("transformer")
        names = [n for n, _ in model.named_parameters()]
        steps = 12
        with tempfile.TemporaryDirectory() as d:
            for i, (_, p) in enumerate(model.named_parameters(), 1):
                np.save(os.path.join(d, "p%d.npy" % i), p.detach().numpy())
            with open(os.path.join(d, "names.txt"), "w") as f:
                f.write("\n".join(names) + "\n")
            opt = libmuon.Optimizer(model.named_parameters(), config=KELLER)
            for s, (xb, yb) in enumerate(batches(x, y, steps), 1):
                F.cross_entropy(model(xb), yb).backward()
                for i, (_, p) in enumerate(model.named_parameters(), 1):
                    np.save(os.path.join(d, "g%d_%d.npy" % (s, i)), p.grad.numpy())
                opt.step()
                opt.zero_grad()
            helpers.run_lua(LUA_REPLAY, d, KELLER, steps)
            for i, (n, p) in enumerate(model.named_parameters(), 1):
                lua = np.load(os.path.join(d, "out%d.npy" % i))
                self.assertTrue(np.array_equal(lua, p.detach().numpy()), "parameter %s differs from Lua's" % n)


# The Lua side: the same parameters and gradients through muon.engine.
LUA_REPLAY = r"""
local muon = require("muon")
local T = muon.tensor
local dir, cfg, steps = arg[1], arg[2], tonumber(arg[3])
local names = {}
for line in io.lines(dir .. "/names.txt") do names[#names + 1] = line end
local eng = muon.engine.new(cfg)
local vals, grads = {}, {}
for i, n in ipairs(names) do
  vals[i] = T.load(("%s/p%d.npy"):format(dir, i))
  grads[i] = T.zeros(vals[i]:size())
  eng:add_param(n, vals[i], grads[i])
end
for s = 1, steps do
  for i = 1, #names do grads[i]:copy(T.load(("%s/g%d_%d.npy"):format(dir, s, i))) end
  eng:step()
end
for i = 1, #names do vals[i]:save(("%s/out%d.npy"):format(dir, i)) end
"""

if __name__ == "__main__":
    unittest.main()
