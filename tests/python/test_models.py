"""The port of a torch.optim loop: examples/python/train_muon.py is
train_torch.py with at most 20 lines changed, and trains both models (the
demo's character model in torch, a 2-layer transformer) through the
package: the held-out loss falls."""
import difflib
import os
import re
import unittest

import helpers
from helpers import needs_torch

EX = os.path.join(helpers.ROOT, "examples", "python")


def changed_lines(a, b):
    with open(os.path.join(EX, a)) as f, open(os.path.join(EX, b)) as g:
        diff = difflib.unified_diff(f.read().splitlines(), g.read().splitlines(), lineterm="", n=0)
    return [d for d in diff if d[:1] in "+-" and not d.startswith(("+++", "---"))]


def held_out(out):
    return [float(v) for v in re.findall(r"held-out (\d+\.\d+)", out)]


@needs_torch
class Port(unittest.TestCase):
    def test_at_most_20_changed_lines(self):
        lines = changed_lines("train_torch.py", "train_muon.py")
        self.assertLessEqual(len(lines), 20, "\n".join(lines))
        self.assertTrue(any("libmuon.Optimizer(model.named_parameters()" in d for d in lines))

    def train(self, script, model, steps):
        args = [script, "--model", model, "--steps", str(steps), "--batch", "128"]
        if model == "char":
            args += ["--hidden", "64"]
        code = "import runpy, sys; sys.argv = %r; runpy.run_path(%r, run_name='__main__')" % (
            args, os.path.join(EX, script))
        rc, out = helpers.python(code)
        self.assertEqual(rc, 0, out)
        losses = held_out(out)
        self.assertGreaterEqual(len(losses), 2, out)
        return losses

    def test_char_model_trains_through_the_package(self):
        losses = self.train("train_muon.py", "char", 60)
        self.assertLess(losses[-1], losses[0] - 0.5, losses)

    def test_transformer_trains_through_the_package(self):
        losses = self.train("train_muon.py", "transformer", 60)
        self.assertLess(losses[-1], losses[0] - 0.5, losses)

    def test_the_torch_loop_runs_too(self):
        losses = self.train("train_torch.py", "char", 20)
        self.assertLess(losses[-1], losses[0], losses)


if __name__ == "__main__":
    unittest.main()
