"""State in torch's layout and the engine's checkpoints:
state_dict -> torch.save -> torch.load -> load_state_dict resumes bitwise;
an engine checkpoint written from Python loads in Lua, and Lua's in Python."""
import io
import os
import subprocess
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

MUON = os.path.join(helpers.CONFIGS, "muon.lua")  # (with its warmup-cosine schedule: the step count matters)


def data():
    torch.manual_seed(0)
    (x, y), _ = models.dataset(ctx=8, n_words=300)
    return x, y


def train(model, opt, x, y, steps, seed):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = torch.randint(0, len(x), (64,), generator=g)
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
        opt.zero_grad()


def fresh(hidden=32):
    torch.manual_seed(3)
    return models.CharMLP(hidden=hidden, layers=2)


def trained(steps, hidden=32):
    """A fresh model and its optimizer after steps steps: model, opt, x, y."""
    x, y = data()
    model = fresh(hidden)
    opt = libmuon.Optimizer(model.named_parameters(), config=MUON)
    train(model, opt, x, y, steps, 1)
    return model, opt, x, y


@needs_torch
class StateDict(unittest.TestCase):
    def test_layout_is_torchs(self):
        model, opt, _, _ = trained(2)
        sd = opt.state_dict()
        n = len(list(model.parameters()))
        self.assertEqual(sorted(i for g in sd["param_groups"] for i in g["params"]), list(range(n)))
        named = dict(model.named_parameters())
        hidden = sd["state"][sd["muon"]["names"].index("hidden.0.weight")]
        self.assertEqual(set(hidden), {"momentum_buffer"})
        self.assertEqual(hidden["momentum_buffer"].shape, named["hidden.0.weight"].shape)
        bias = sd["state"][sd["muon"]["names"].index("head.bias")]
        self.assertEqual(set(bias), {"exp_avg", "exp_avg_sq", "step"})
        self.assertEqual(float(bias["step"]), 2.0)
        self.assertEqual(sd["param_groups"][0]["lr"], 0.02)
        self.assertTrue(torch.equal(opt.state[named["hidden.0.weight"]]["momentum_buffer"],
                                    hidden["momentum_buffer"]))

    def test_torch_save_round_trip_resumes_bitwise(self):
        ref, opt, x, y = trained(10)
        model_bytes, opt_bytes = io.BytesIO(), io.BytesIO()
        torch.save(ref.state_dict(), model_bytes)
        torch.save(opt.state_dict(), opt_bytes)
        train(ref, opt, x, y, 10, 2)

        resumed = fresh()
        model_bytes.seek(0)
        opt_bytes.seek(0)
        resumed.load_state_dict(torch.load(model_bytes))
        opt2 = libmuon.Optimizer(resumed.named_parameters(), config=MUON)
        opt2.load_state_dict(torch.load(opt_bytes))
        self.assertEqual(opt2.get("step"), 10)
        train(resumed, opt2, x, y, 10, 2)
        for (n, a), (_, b) in zip(ref.named_parameters(), resumed.named_parameters()):
            self.assertTrue(torch.equal(a, b), "parameter %s after resuming" % n)

    def test_load_state_dict_of_other_shapes_changes_nothing(self):
        sd = trained(1)[1].state_dict()
        opt_b = trained(1, hidden=16)[1]
        before = opt_b.state_dict()
        with self.assertRaises(libmuon.MuonError) as cm:
            opt_b.load_state_dict(sd)
        self.assertIn("hidden.0.weight", str(cm.exception))
        after = opt_b.state_dict()
        for i, st in before["state"].items():
            for k, t in st.items():
                self.assertTrue(torch.equal(t, after["state"][i][k]))


@needs_torch
class Checkpoints(unittest.TestCase):
    def test_a_checksum_mismatch_names_the_python_fix(self):
        _, opt, _, _ = trained(1)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "c.safetensors")
            opt.save(path)
            with open(path, "r+b") as f:  # a byte of the data section
                f.seek(-3, os.SEEK_END)
                b = f.read(1)
                f.seek(-3, os.SEEK_END)
                f.write(bytes([(b[0] + 1) % 256]))
            with self.assertRaises(libmuon.EFORMAT) as cm:
                opt.load(path)
            self.assertIn("checksum mismatch", str(cm.exception))
            self.assertIn("load(path, checksum=False)", str(cm.exception))
            self.assertNotIn("MU_LOAD_NO_CHECKSUM", str(cm.exception))
            opt.load(path, checksum=False)

    def test_python_checkpoint_loads_in_lua_and_luas_in_python(self):
        model, opt, _, _ = trained(3)
        names = [n for n, _ in model.named_parameters()]
        with tempfile.TemporaryDirectory() as d:
            for i, (_, p) in enumerate(model.named_parameters(), 1):
                np.save(os.path.join(d, "p%d.npy" % i), p.detach().numpy())
            with open(os.path.join(d, "names.txt"), "w") as f:
                f.write("\n".join(names) + "\n")
            opt.save(os.path.join(d, "py.safetensors"))
            # one more step with known gradients: in Python ...
            for i, (_, p) in enumerate(model.named_parameters(), 1):
                p.grad = torch.full_like(p, 0.01 * i)
                np.save(os.path.join(d, "g%d.npy" % i), p.grad.numpy())
            opt.step()
            # ... and in Lua from the Python checkpoint: the same bits; Lua
            # saves its own checkpoint after that step
            helpers.run_lua(LUA_RESUME, d, MUON)
            for i, (n, p) in enumerate(model.named_parameters(), 1):
                self.assertTrue(np.array_equal(np.load(os.path.join(d, "out%d.npy" % i)), p.detach().numpy()), n)
            # Lua's checkpoint in a new Python optimizer: the same state as ours
            model2 = fresh()
            with torch.no_grad():
                for a, b in zip(model2.parameters(), model.parameters()):
                    a.copy_(b)
            opt2 = libmuon.Optimizer(model2.named_parameters(), config=MUON)
            opt2.load(os.path.join(d, "lua.safetensors"))
            self.assertEqual(opt2.get("step"), 4)
            s1, s2 = opt.state_dict(), opt2.state_dict()
            for i, st in s1["state"].items():
                for k, t in st.items():
                    self.assertTrue(torch.equal(t, s2["state"][i][k]), (i, k))

    def test_sharded_save_loads_in_a_new_optimizer(self):
        model, opt, _, _ = trained(3)
        with tempfile.TemporaryDirectory() as d:
            ck = os.path.join(d, "ck")
            opt.save(ck, sharded=True)
            self.assertIn("index.json", os.listdir(ck))
            model2 = fresh()
            with torch.no_grad():
                for a, b in zip(model2.parameters(), model.parameters()):
                    a.copy_(b)
            opt2 = libmuon.Optimizer(model2.named_parameters(), config=MUON)
            opt2.load(ck)
            self.assertEqual(opt2.get("step"), 3)
            s1, s2 = opt.state_dict(), opt2.state_dict()
            for i, st in s1["state"].items():
                for k, t in st.items():
                    self.assertTrue(torch.equal(t, s2["state"][i][k]), (i, k))


class NumpyWriter(unittest.TestCase):
    def test_the_numpy_only_writer_loads_without_checksums_only(self):
        # examples/python/write_safetensors.py (the README's "The format"):
        # its file loads with checksum = false and holds what it wrote
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "np.safetensors")
            subprocess.run([sys.executable, os.path.join(helpers.ROOT, "examples", "python", "write_safetensors.py"),
                            path], check=True)
            out = helpers.run_lua(LUA_NUMPY_LOAD, path)
            self.assertIn("no checksum", out)
            self.assertIn("step 3 shape 2x3 norm 0", out)


LUA_NUMPY_LOAD = r"""
local muon = require("muon")
local T = muon.tensor
local eng = muon.engine.new({ groups = { { optimizer = "muon" } } })
eng:add_param("w", T.zeros({ 2, 3 }), T.zeros({ 2, 3 }))
local ok, err = pcall(eng.load, eng, arg[1])
assert(not ok)
print(tostring(err))
eng:load(arg[1], { checksum = false })
local m = eng:state("w").momentum_buffer
print(("step %d shape %s norm %g"):format(eng:get("step"), table.concat(m:size(), "x"), m:norm()))
"""


LUA_RESUME = r"""
local muon = require("muon")
local T = muon.tensor
local dir, cfg = arg[1], arg[2]
local names = {}
for line in io.lines(dir .. "/names.txt") do names[#names + 1] = line end
local eng = muon.engine.new(cfg)
local vals = {}
for i, n in ipairs(names) do
  vals[i] = T.load(("%s/p%d.npy"):format(dir, i))
  eng:add_param(n, vals[i], T.load(("%s/g%d.npy"):format(dir, i)))
end
eng:load(dir .. "/py.safetensors")
eng:step()
for i = 1, #names do vals[i]:save(("%s/out%d.npy"):format(dir, i)) end
eng:save(dir .. "/lua.safetensors")
"""

if __name__ == "__main__":
    unittest.main()
