"""Shared by tests/python/test_*.py: paths, optional modules, subprocesses,
the Lua engine as a reference, and a float64 Muon written from the seed."""
import math
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BUILD = os.path.join(ROOT, os.environ.get("MUON_BUILD", "build"))
CONFIGS = os.path.join(ROOT, "configs")


def have(module):
    try:
        __import__(module)
        return True
    except ImportError:
        return False


import libmuon  # noqa: E402,F401 (after the path set-up of run.py; before torch: the BLAS core)

HAVE_TORCH = have("torch")
needs_torch = unittest.skipUnless(HAVE_TORCH, "torch is not installed (Debian: python3-torch)")
if HAVE_TORCH:
    import torch


def env(**extra):
    """The environment of a subprocess: this one's, the package on the path."""
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.join(ROOT, "src"), HERE, e.get("PYTHONPATH")]))
    for k, v in extra.items():
        if v is None:
            e.pop(k, None)
        else:
            e[k] = v
    return e


def python(code, timeout=300, **extra):
    """Run Python code in a new interpreter: (exit status, stdout + stderr)."""
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env(**extra), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=timeout)
    return r.returncode, r.stdout.decode("utf-8", "replace")


def run_lua(script, *args, timeout=300):
    """Run a Lua script with the muon CLI (build/muon run): its output;
    fails the test on a non-zero exit."""
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(script)
        path = f.name
    try:
        r = subprocess.run([os.path.join(BUILD, "muon"), "run", "--trust", path] + [str(a) for a in args], cwd=ROOT,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    finally:
        os.unlink(path)
    out = r.stdout.decode("utf-8", "replace")
    if r.returncode != 0:
        raise AssertionError("lua script failed (%d):\n%s" % (r.returncode, out))
    return out


# ---------------------------------------------------------------- references

# The seed's Newton-Schulz coefficients (seed_muon.py: _NS_LEGACY_COEFFS,
# _NS_ASYM5_COEFFS).
LEGACY = (3.4445, -4.7750, 2.0315)
ASYM5 = ((4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
         (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012))


def zeropower64(g, steps=5, variant="asym5", eps=1e-10):
    """The seed's zeropower_via_newtonschulz5 in float64 (2-D)."""
    x = g.double()
    transposed = x.size(0) > x.size(1)
    if transposed:
        x = x.T
    x = x / (x.norm() + eps)
    coeffs = [LEGACY] * steps if variant == "legacy" else ASYM5[:steps]
    for a, b, c in coeffs:
        A = x @ x.T
        B = b * A + c * (A @ A)
        x = a * x + B @ x
    return x.T if transposed else x


class Muon64:
    """The seed's Muon step in float64 (momentum (m, m), Newton-Schulz,
    scale, decoupled decay and apply) over float64 copies of parameters:
    step(grads) takes the float32 gradients the package saw. scale:
    "matched_adamw_rms" (the seed's sqrt(max(A, B)) * rms) or "keller"
    (max(1, A/B)^0.5, Keller Jordan's)."""

    def __init__(self, params, lr=0.02, weight_decay=0.1, momentum=0.95, nesterov=True, ns_steps=5,
                 ns_variant="asym5", matched_adamw_rms=0.2, scale="matched_adamw_rms", eps=1e-10):
        self.p = [p.detach().double().clone() for p in params]
        self.buf = [torch.zeros_like(p) for p in self.p]
        self.lr, self.wd, self.m, self.nesterov = lr, weight_decay, momentum, nesterov
        self.steps, self.variant, self.rms, self.scale, self.eps = ns_steps, ns_variant, matched_adamw_rms, scale, eps

    def step(self, grads):
        for i, g in enumerate(grads):
            g = g.double()
            u = g + self.m * self.buf[i]
            self.buf[i] = self.m * self.buf[i] + g
            if self.nesterov:
                u = self.m * u + g
            o = zeropower64(u, self.steps, self.variant, self.eps)
            rows, cols = o.shape
            if self.scale == "keller":
                s = max(1.0, rows / cols) ** 0.5
            else:
                s = math.sqrt(max(rows, cols)) * self.rms
            self.p[i] = self.p[i] * (1 - self.lr * self.wd) - self.lr * s * o
