"""The OpenBLAS core whatever the import order: libmuon first presets it,
after torch or numpy (which load OpenBLAS) it switches the running one, a
value of OPENBLAS_CORETYPE set before Python started stays, and a switch
that would not be safe (other Python threads) fails saying what to do.
Each case runs in a new interpreter with OPENBLAS_CORETYPE unset."""
import unittest

import helpers
from helpers import needs_torch

import libmuon

EXPECTED = libmuon.blas_info()["expected"]
REPORT = "import libmuon; b = libmuon.blas_info(); print('core=%s expected=%s' % (b['core'], b['expected']))"
# OpenBLAS's own answer, asked without libmuon (ctypes on the loaded library)
OPENBLAS_CORE = ("import ctypes; ob = ctypes.CDLL('libopenblas.so.0'); ob.openblas_get_corename.restype = "
                 "ctypes.c_char_p; print('openblas=' + ob.openblas_get_corename().decode())")


def run(code, **env):
    rc, out = helpers.python(code, OPENBLAS_CORETYPE=env.pop("core", None), **env)
    fields = dict(kv.split("=", 1) for kv in out.split() if "=" in kv)
    return rc, out, fields


@unittest.skipUnless(EXPECTED, "this CPU has no core in muon's table (no AVX2)")
class Core(unittest.TestCase):
    def check_order(self, before):
        rc, out, f = run(before + "; " + REPORT + "; " + OPENBLAS_CORE)
        self.assertEqual(rc, 0, out)
        self.assertEqual(f["core"].lower(), EXPECTED.lower(), out)
        self.assertEqual(f["openblas"].lower(), EXPECTED.lower(), out)

    def test_imported_first(self):
        self.check_order("import sys")

    def test_after_numpy(self):
        self.check_order("import numpy")

    @needs_torch
    def test_after_torch(self):
        self.check_order("import torch; torch.ones(64, 64) @ torch.ones(64, 64)")

    @needs_torch
    def test_before_torch(self):
        self.check_order("import libmuon, torch")

    def test_a_users_choice_stays(self):
        other = "Sandybridge" if EXPECTED.lower() != "sandybridge" else "Prescott"
        rc, out, f = run("import numpy; " + REPORT, core=other)
        self.assertEqual(rc, 0, out)
        self.assertEqual(f["core"].lower(), other.lower(), out)

    @needs_torch
    def test_an_unsafe_switch_fails_with_the_fix(self):
        code = ("import threading, torch; " + OPENBLAS_CORE + "\n"
                "t = threading.Thread(target=threading.Event().wait, args=(30,), daemon=True); t.start()\n"
                "try:\n    import libmuon\nexcept Exception as e:\n    print('error=' + type(e).__name__); "
                "print(str(e))\nelse:\n    print('error=none')")
        rc, out, f = run(code)
        self.assertEqual(rc, 0, out)
        if f["openblas"].lower() == EXPECTED.lower():
            self.skipTest("torch's OpenBLAS already runs %s here: nothing to switch" % EXPECTED)
        self.assertEqual(f["error"], "ESTATE", out)
        self.assertIn("other Python threads", out)
        self.assertIn("import libmuon before", out)
        self.assertIn("export OPENBLAS_CORETYPE=" + EXPECTED, out)


if __name__ == "__main__":
    unittest.main()
