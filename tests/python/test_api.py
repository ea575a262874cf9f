"""The package's surface with NumPy arrays (no torch needed): configs in
every form, hand-computed steps, param_groups, exceptions per MU_E* code,
a closed optimizer, add_param_group."""
import os
import tempfile
import unittest

import numpy as np

import helpers  # noqa: F401 (the package from src/, the library from build/)
import libmuon

ADAMW = {"optimizer": "adamw", "lr": 0.01, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0}


def adamw_once(w, g, lr=0.01):
    """One AdamW step from zero moments, no decay: w - lr * g / (|g| + eps) in float64."""
    return w - lr * g / (np.abs(g) + 1e-8)


class Basics(unittest.TestCase):
    def test_numpy_step_in_place_matches_hand_computed_adamw(self):
        w = np.array([1.0, 2.0, 3.0], np.float32)
        g = np.array([0.5, -2.0, 4.0], np.float32)
        opt = libmuon.AdamW([("b", w, g)], lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0)
        before = w.copy()
        opt.step()
        np.testing.assert_allclose(w, adamw_once(before.astype(np.float64), g), rtol=0, atol=1e-6)
        self.assertEqual(opt.get("step"), 1)
        opt.close()
        opt.close()  # idempotent

    def test_config_file_lua_source_and_dict_route_the_same(self):
        src = 'return { groups = { { optimizer = "adamw", lr = 0.01, betas = { 0.9, 0.999 }, weight_decay = 0 } } }'
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "c.lua")
            with open(path, "w") as f:
                f.write(src)
            outs = []
            for cfg in (path, libmuon.lua(src), {"groups": [ADAMW]}):
                w = np.array([1.0, -1.0], np.float32)
                with libmuon.Optimizer([("p", w, np.array([1.0, 3.0], np.float32))], config=cfg) as opt:
                    opt.step()
                outs.append(w.copy())
        for o in outs[1:]:
            self.assertTrue(np.array_equal(outs[0], o), outs)

    def test_keyword_options_use_the_seeds_names_and_defaults(self):
        w = np.zeros((4, 3), np.float32)
        opt = libmuon.Muon([("w", w, np.ones((4, 3), np.float32))])
        g = opt.param_groups[0]
        self.assertEqual((g["optimizer"], g["lr"], g["weight_decay"], g["matched_adamw_rms"], g["ns_steps"],
                          g["ns_variant"], g["nesterov"]), ("muon", 0.02, 0.1, 0.2, 5, "asym5", True))
        self.assertEqual(g["momentum"], 0.95)
        self.assertIs(g["params"][0], w)

    def test_torch_muon_names(self):
        w = np.zeros((4, 3), np.float32)
        opt = libmuon.Muon([("w", w, None)], lr=1e-3, eps=1e-7, adjust_lr_fn=None,
                           ns_coefficients=(3.4445, -4.775, 2.0315))
        g = opt.param_groups[0]
        self.assertEqual((g["ns_epsilon"], g["scale_mode"], g["ns_variant"]), (1e-7, "keller", "custom"))
        self.assertEqual(len(g["ns_coefficients"]), 5)
        opt = libmuon.Muon([("w", w, None)], adjust_lr_fn="match_rms_adamw")
        self.assertEqual(opt.param_groups[0]["scale_mode"], "matched_adamw_rms")
        with self.assertRaises(ValueError):
            libmuon.Muon([("w", w, None)], adjust_lr_fn="other")


class Errors(unittest.TestCase):
    def test_one_class_per_code_under_one_base(self):
        names = ["EINVAL", "ENOMEM", "EIO", "EFORMAT", "EDTYPE", "ESHAPE", "ENONFINITE", "ESTATE", "ELUA", "ECOMM"]
        for i, n in enumerate(names):
            cls = getattr(libmuon, n)
            self.assertTrue(issubclass(cls, libmuon.MuonError))
            self.assertEqual(cls.code, -(i + 1))
        self.assertTrue(issubclass(libmuon.EINVAL, ValueError) and issubclass(libmuon.EIO, OSError))

    def test_unknown_option_is_einval_with_the_engines_message(self):
        with self.assertRaises(libmuon.EINVAL) as cm:
            libmuon.Muon([("w", np.zeros((2, 2), np.float32), None)], momentm=0.9)
        msg = str(cm.exception)
        self.assertIn("Muon got unexpected keyword arguments: momentm (did you mean 'momentum' for 'momentm'?)", msg)
        self.assertEqual(cm.exception.code, -1)

    def test_a_config_of_another_type_is_einval(self):
        with self.assertRaises(libmuon.EINVAL) as cm:
            libmuon.Optimizer([("w", np.zeros(2, np.float32), None)], config=123)
        self.assertIn("config must be a file path", str(cm.exception))

    def test_missing_config_is_eio_syntax_error_eformat(self):
        with self.assertRaises(libmuon.EIO):
            libmuon.Optimizer([("w", np.zeros(2, np.float32), None)], config="/nonexistent/c.lua")
        with self.assertRaises(libmuon.EFORMAT):
            libmuon.Optimizer([("w", np.zeros(2, np.float32), None)], config=libmuon.lua("return {"))

    def test_nan_gradient_is_enonfinite_nothing_changed(self):
        w = np.ones((4, 3), np.float32)
        g = np.ones((4, 3), np.float32)
        opt = libmuon.Muon([("w", w, g)])
        opt.step()
        before = w.copy()
        g[1, 1] = np.nan
        with self.assertRaises(libmuon.ENONFINITE) as cm:
            opt.step()
        self.assertIn("parameter 'w'", str(cm.exception))
        self.assertTrue(np.array_equal(w, before))
        self.assertEqual(opt.get("step"), 1)

    def test_hook_error_is_elua(self):
        cfg = libmuon.lua('return { groups = { { optimizer = "muon", post_update_fn = function() error("boom") end } } }')
        opt = libmuon.Optimizer([("w", np.ones((3, 3), np.float32), np.ones((3, 3), np.float32))], config=cfg)
        with self.assertRaises(libmuon.ELUA) as cm:
            opt.step()
        self.assertIn("boom", str(cm.exception))

    def test_python_callables_are_refused_with_the_way_to_write_hooks(self):
        with self.assertRaises(TypeError) as cm:
            libmuon.Muon([("w", np.ones((3, 3), np.float32), None)], post_update_fn=lambda *a: None)
        self.assertIn("libmuon.lua", str(cm.exception))

    def test_closed_optimizer_raises_estate(self):
        opt = libmuon.Muon([("w", np.ones((3, 3), np.float32), np.ones((3, 3), np.float32))])
        opt.close()
        with self.assertRaises(libmuon.ESTATE):
            opt.step()

    def test_unnamed_parameters_are_refused(self):
        with self.assertRaises(libmuon.EINVAL) as cm:
            libmuon.Muon([np.ones((3, 3), np.float32)])
        self.assertIn("named_parameters", str(cm.exception))

    def test_names_are_utf8_without_nul_and_at_most_mu_max_name_bytes(self):
        for name, want in (("caf\udce9", "is not valid UTF-8"), ("a\0b", "NUL character"),
                           ("n" * 65537, "is longer than 65536 bytes (MU_MAX_NAME)")):
            with self.assertRaises(libmuon.EINVAL) as cm:
                libmuon.AdamW([(name, np.ones(3, np.float32), np.ones(3, np.float32))])
            self.assertIn(want, str(cm.exception))
        w = np.ones(3, np.float32)
        opt = libmuon.AdamW([("café", w, np.ones(3, np.float32))], lr=0.01, weight_decay=0)
        opt.step()
        np.testing.assert_allclose(w, 0.99, rtol=0, atol=1e-6)
        opt.close()


class Groups(unittest.TestCase):
    def two_groups(self):
        w, gw = np.ones((4, 3), np.float32), np.full((4, 3), 0.5, np.float32)
        b, gb = np.ones(3, np.float32), np.array([1.0, -1.0, 2.0], np.float32)
        opt = libmuon.Optimizer([{"params": [("w", w, gw)], "lr": 0.02},
                                 {"params": [("b", b, gb)], "optimizer": "adamw", "lr": 0.01, "weight_decay": 0}])
        return opt, w, b

    def test_torch_style_groups_become_config_groups(self):
        opt, w, b = self.two_groups()
        self.assertEqual([g["optimizer"] for g in opt.param_groups], ["muon", "adamw"])
        self.assertIs(opt.param_groups[1]["params"][0], b)

    def test_changing_lr_takes_effect_at_the_next_step(self):
        opt, w, b = self.two_groups()
        opt.param_groups[1]["lr"] = 0.1
        before = b.astype(np.float64)
        opt.step()
        np.testing.assert_allclose(b, adamw_once(before, np.array([1.0, -1.0, 2.0]), lr=0.1), atol=1e-6)
        self.assertAlmostEqual(opt.get("lr:2"), 0.1)

    def test_other_options_cannot_change_between_steps(self):
        opt, w, b = self.two_groups()
        opt.param_groups[0]["weight_decay"] = 0.5
        w0 = w.copy()
        with self.assertRaises(libmuon.EINVAL) as cm:
            opt.step()
        self.assertIn("weight_decay", str(cm.exception))
        self.assertTrue(np.array_equal(w, w0))

    def test_add_param_group_before_the_first_step_makes_a_group(self):
        opt, w, b = self.two_groups()
        v = np.ones((2, 5), np.float32)
        opt.add_param_group({"params": [("v", v, np.ones((2, 5), np.float32))], "lr": 0.05})
        self.assertEqual(len(opt.param_groups), 3)
        self.assertEqual(opt.param_groups[2]["lr"], 0.05)
        opt.step()
        self.assertFalse(np.array_equal(v, np.ones((2, 5), np.float32)))

    def test_add_param_group_after_a_step_routes_by_the_config(self):
        w = np.ones((4, 3), np.float32)
        opt = libmuon.Muon([("w", w, np.ones((4, 3), np.float32))])
        opt.step()
        v = np.ones((2, 5), np.float32)
        opt.add_param_group({"params": [("v", v, np.ones((2, 5), np.float32))]})
        self.assertEqual(len(opt.param_groups[0]["params"]), 2)
        with self.assertRaises(libmuon.EINVAL) as cm:
            opt.add_param_group({"params": [("u", np.ones((2, 2), np.float32), None)], "lr": 0.5})
        self.assertIn("the config decides the groups", str(cm.exception))

    def test_closure_is_called_first_and_its_value_returned(self):
        w, g = np.ones((3, 3), np.float32), np.zeros((3, 3), np.float32)
        opt = libmuon.Muon([("w", w, g)])

        def closure():
            g[:] = 1.0
            return 42.0
        self.assertEqual(opt.step(closure), 42.0)
        self.assertFalse(np.array_equal(w, np.ones((3, 3), np.float32)))

    def test_zero_grad_numpy_in_place_and_to_none(self):
        w, g = np.ones((3, 3), np.float32), np.ones((3, 3), np.float32)
        opt = libmuon.Muon([("w", w, g)])
        opt.zero_grad()
        self.assertTrue(np.array_equal(g, np.zeros((3, 3))))
        opt.zero_grad(set_to_none=True)
        before = w.copy()
        opt.step()  # no gradient: nothing to step
        self.assertTrue(np.array_equal(w, before))
        self.assertEqual(opt.get("stepped"), 0)


if __name__ == "__main__":
    unittest.main()
