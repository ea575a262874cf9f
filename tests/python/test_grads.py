"""Gradients as torch hands them over: read anew at every step (None: no
gradient this step; a reallocated buffer is the one used), zero copy for
float32 tensors, and a wrong gradient fails naming the parameter with
nothing changed."""
import unittest

import helpers
from helpers import needs_torch

import libmuon

if helpers.HAVE_TORCH:
    import torch

ADAMW = dict(lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)


def pair():
    torch.manual_seed(1)
    w = torch.nn.Parameter(torch.randn(4, 3))
    b = torch.nn.Parameter(torch.randn(3))
    return w, b


@needs_torch
class Grads(unittest.TestCase):
    def run_both(self, grads_per_step, set_to_none):
        """The same gradients through libmuon and torch.optim.AdamW."""
        w, b = pair()
        w2, b2 = torch.nn.Parameter(w.detach().clone()), torch.nn.Parameter(b.detach().clone())
        opt = libmuon.AdamW([("w", w), ("b", b)], **ADAMW)
        ref = torch.optim.AdamW([w2, b2], **ADAMW)
        for gw, gb in grads_per_step:
            for (p, q), g in zip(((w, w2), (b, b2)), (gw, gb)):
                if g is None:
                    p.grad = q.grad = None
                elif p.grad is None or set_to_none:
                    p.grad, q.grad = g.clone(), g.clone()  # a new buffer each step
                else:
                    p.grad.copy_(g)
                    q.grad.copy_(g)
            opt.step()
            ref.step()
            opt.zero_grad(set_to_none=set_to_none)
            ref.zero_grad(set_to_none=set_to_none)
        return (w, b), (w2, b2)

    def test_reallocated_and_none_gradients_step_as_torch_does(self):
        torch.manual_seed(2)
        steps = [(torch.randn(4, 3), torch.randn(3)), (torch.randn(4, 3), None), (None, torch.randn(3)),
                 (torch.randn(4, 3), torch.randn(3))]
        for set_to_none in (True, False):
            (w, b), (w2, b2) = self.run_both(steps, set_to_none)
            torch.testing.assert_close(w, w2, rtol=0, atol=1e-6)
            torch.testing.assert_close(b, b2, rtol=0, atol=1e-6)

    def test_the_new_buffer_is_read_never_the_old_one(self):
        w, b = pair()
        opt = libmuon.AdamW([("w", w), ("b", b)], **ADAMW)
        w.grad, b.grad = torch.ones(4, 3), torch.ones(3)
        opt.step()
        old = w.grad
        w.grad = -torch.ones(4, 3)  # reallocated: the engine must follow
        old.fill_(1e6)  # the old buffer still exists but must not be read
        before = w.detach().clone()
        opt.step()
        self.assertTrue(bool((w > before).all()), "a step with gradient -1 must move w up")

    def test_zero_copy_for_float32_cpu_tensors(self):
        w, b = pair()
        ptr = w.data_ptr()
        opt = libmuon.Muon([("w", w)])
        w.grad = torch.randn(4, 3)
        v = w._version
        opt.step()
        self.assertEqual(w.data_ptr(), ptr)
        self.assertGreater(w._version, v, "autograd must see the in-place update")

    def test_wrong_gradients_fail_naming_the_parameter_nothing_changed(self):
        for bad, cls, words in ((torch.randn(3, 4), libmuon.ESHAPE, "shape"),
                                (torch.randn(4, 3, dtype=torch.float64), libmuon.EDTYPE, "float64"),
                                (torch.randn(3, 4).T, libmuon.EINVAL, "contiguous")):
            w, b = pair()
            opt = libmuon.Optimizer([{"params": [("w", w)]}, {"params": [("b", b)], "optimizer": "adamw"}])
            w.grad, b.grad = torch.randn(4, 3), torch.randn(3)
            opt.step()
            state = opt.state_dict()
            before = (w.detach().clone(), b.detach().clone())
            b.grad = torch.randn(3)
            w.grad.data = bad  # (torch's .grad setter refuses these; .data does not)
            with self.assertRaises(cls) as cm:
                opt.step()
            self.assertIn("parameter 'w'", str(cm.exception))
            self.assertIn(words, str(cm.exception))
            self.assertTrue(torch.equal(w, before[0]) and torch.equal(b, before[1]))
            self.assertEqual(opt.get("step"), 1)
            after = opt.state_dict()
            for i, st in state["state"].items():
                for k, t in st.items():
                    self.assertTrue(torch.equal(t, after["state"][i][k]), (i, k))
            w.grad = torch.randn(4, 3)  # a good one again: it steps
            opt.step()
            self.assertEqual(opt.get("step"), 2)

    def test_a_replaced_parameter_storage_is_refused(self):
        w, b = pair()
        opt = libmuon.Muon([("w", w)])
        w.data = torch.randn(4, 3)
        w.grad = torch.randn(4, 3)
        with self.assertRaises(libmuon.ESTATE) as cm:
            opt.step()
        self.assertIn("parameter 'w'", str(cm.exception))


@needs_torch
class TorchFace(unittest.TestCase):
    def test_an_lr_scheduler_drives_param_groups(self):
        w, b = pair()
        opt = libmuon.Optimizer([{"params": [("w", w)], "lr": 0.02},
                                 {"params": [("b", b)], "optimizer": "adamw", "lr": 1e-3}])
        self.assertIsInstance(opt, torch.optim.Optimizer)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 ** s)
        for k in range(3):
            w.grad, b.grad = torch.randn(4, 3), torch.randn(3)
            opt.step()
            self.assertAlmostEqual(opt.get("lr:1"), 0.02 * 0.5 ** k)  # the lr the step used
            self.assertAlmostEqual(opt.get("lr:2"), 1e-3 * 0.5 ** k)
            sched.step()

    def test_add_param_group_makes_a_group_as_torch_does(self):
        w, b = pair()
        opt = libmuon.Muon([("w", w)], lr=0.01)
        opt.add_param_group({"params": [("b", b)], "optimizer": "adamw", "lr": 0.1})
        self.assertEqual([(g["optimizer"], g["lr"]) for g in opt.param_groups], [("muon", 0.01), ("adamw", 0.1)])
        w.grad, b.grad = torch.randn(4, 3), torch.randn(3)
        b0 = b.detach().clone()
        opt.step()
        torch.testing.assert_close(b.detach(), b0 - 0.1 * b.grad / (b.grad.abs() + 1e-8) - 0.1 * 0.01 * b0,
                                   rtol=0, atol=1e-6)


if __name__ == "__main__":
    unittest.main()
