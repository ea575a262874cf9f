"""The parameters an optimizer registers: torch tensors or NumPy arrays.

A contiguous float32 or float64 CPU tensor is the engine's buffer itself
(zero copy): the engine updates its memory in place and reads its .grad
where it is. Any other parameter (bfloat16 or float16, another device, a
strided tensor) gets a float32 master copy in the engine: each step copies
the gradient in, and writes the stepped master back, rounded to the
parameter's dtype (as torch's copy_ rounds: to nearest even).
"""
import sys

import numpy as np

from ._lib import ffi, lib
from .errors import error_for

_torch = sys.modules.get("torch")


def is_torch(x):
    return _torch is not None and isinstance(x, _torch.Tensor)


def _shape(t):
    return tuple(int(d) for d in t.shape)


def _fail(code, name, what):
    raise error_for(code, "parameter '%s': %s" % (name, what))


class Param:
    """One registered parameter. value: the user's tensor; direct: the
    engine holds value's memory; master / grad_buf: the float32 copies the
    engine holds otherwise; grad: a NumPy parameter's gradient (torch
    parameters' is value.grad); sent: the grad pointer the engine has (0:
    none)."""

    __slots__ = ("name", "cname", "value", "torch", "direct", "shape", "dtype", "edtype", "master", "grad_buf", "grad",
                 "sent", "data_ptr", "bump", "_empty")

    def __init__(self, name, value, grad=None):
        if not isinstance(name, str) or not name:
            raise error_for(lib.MU_EINVAL, "parameter names must be non-empty strings, got %r" % (name,))
        try:
            encoded = name.encode("utf-8")
        except UnicodeEncodeError as e:
            raise error_for(lib.MU_EINVAL, "parameter name %r is not valid UTF-8 (%s): checkpoints store names as "
                            "UTF-8 text" % (name, e.reason)) from None
        if b"\0" in encoded:
            raise error_for(lib.MU_EINVAL, "parameter name %r holds a NUL character (a C string ends there)" % (name,))
        self.name, self.value, self.torch = name, value, is_torch(value)
        self.cname = ffi.new("char[]", encoded)
        self.sent, self.bump, self.master, self.grad_buf, self.grad = 0, None, None, None, None
        self._empty = np.zeros(1, np.float32)  # (a non-NULL address for buffers of no element)
        if self.torch:
            if grad is not None:
                _fail(lib.MU_EINVAL, name, "a torch parameter's gradient is its .grad: give (name, tensor) pairs")
            if value.is_sparse:
                _fail(lib.MU_EINVAL, name, "sparse tensors are not supported")
            self.dtype = value.dtype
            self.direct = (value.device.type == "cpu" and value.dtype in (_torch.float32, _torch.float64)
                           and value.is_contiguous())
            if self.direct:
                self.bump = value.detach().view(-1)[:0]  # an in-place op on it counts as one on value
        else:
            if not isinstance(value, np.ndarray):
                _fail(lib.MU_EINVAL, name, "expected a torch tensor or a NumPy array, got %s" % type(value).__name__)
            if not np.issubdtype(value.dtype, np.floating):
                _fail(lib.MU_EDTYPE, name, "dtype %s is not a floating-point type" % value.dtype)
            self.dtype = value.dtype
            self.direct = (value.dtype in (np.float32, np.float64) and value.flags.c_contiguous
                           and value.flags.writeable)
            self.grad = grad
        self.shape = _shape(value)
        if self.direct:
            self.edtype = lib.MU_F64 if self.dtype in (np.float64, getattr(_torch, "float64", None)) else lib.MU_F32
            self.data_ptr = self._address(value)
        else:
            self.edtype = lib.MU_F32
            self.master = self._to_float32(value)
            self.grad_buf = np.zeros(self.shape, np.float32)
            self.data_ptr = self._address(self.master)
        if not self.torch and grad is not None:
            self.check_grad(grad)

    def _address(self, t):
        p = t.data_ptr() if is_torch(t) else t.ctypes.data
        return p or self._empty.ctypes.data

    def _to_float32(self, t):
        if is_torch(t):
            return t.detach().to("cpu", _torch.float32).contiguous().numpy().copy()
        return np.ascontiguousarray(t, dtype=np.float32).copy()

    def current_grad(self):
        return self.value.grad if self.torch else self.grad

    def check_grad(self, g):
        """Raise (naming the parameter) unless g can be this parameter's gradient."""
        if self.torch:
            if not is_torch(g):
                _fail(lib.MU_EINVAL, self.name, "grad must be a tensor, got %s" % type(g).__name__)
            if g.is_sparse:
                _fail(lib.MU_EINVAL, self.name, "grad is sparse; only dense gradients are supported")
            if g.device != self.value.device:
                _fail(lib.MU_EINVAL, self.name, "grad is on %s but the parameter on %s" % (g.device, self.value.device))
        elif not isinstance(g, np.ndarray):
            _fail(lib.MU_EINVAL, self.name, "grad must be a NumPy array or None, got %s" % type(g).__name__)
        if _shape(g) != self.shape:
            _fail(lib.MU_ESHAPE, self.name, "grad has shape %s but the parameter has shape %s" % (_shape(g), self.shape))
        if g.dtype != self.dtype:
            _fail(lib.MU_EDTYPE, self.name, "grad is %s but the parameter is %s" % (g.dtype, self.dtype))
        if self.direct and not (g.is_contiguous() if self.torch else g.flags.c_contiguous):
            _fail(lib.MU_EINVAL, self.name, "grad is not contiguous (strides %s); the engine reads it in place: "
                  "give a contiguous gradient" % (tuple(g.stride()) if self.torch else g.strides,))

    def check_value(self):
        """Raise unless a direct parameter's memory is still where it was
        registered (torch: p.data was not replaced)."""
        if self.direct and self._address(self.value) != self.data_ptr:
            _fail(lib.MU_ESTATE, self.name, "its memory moved since it was registered (p.data was replaced?); the "
                  "engine updates the buffer it was given: make a new optimizer (load_state_dict carries the state)")

    def grad_pointer(self, g):
        """The address the engine reads g at (0 for None): g itself (direct),
        or grad_buf after copying g into it."""
        if g is None:
            return 0
        if self.direct:
            return self._address(g)
        if self.torch:
            _torch.from_numpy(self.grad_buf).copy_(g)
        else:
            np.copyto(self.grad_buf, g, casting="unsafe")
        return self.grad_buf.ctypes.data or self._empty.ctypes.data

    def after_step(self):
        """After a step that used this parameter's grad: write a master back
        (rounded to the parameter's dtype); tell autograd a direct tensor
        changed in place."""
        if self.direct:
            if self.bump is not None:
                self.bump.zero_()
        elif self.torch:
            with _torch.no_grad():
                self.value.copy_(_torch.from_numpy(self.master))
        else:
            np.copyto(self.value, self.master, casting="unsafe")

    def pointer(self, address):
        return ffi.cast("void *", address) if address else ffi.NULL
