"""libmuon: the muon engine from Python, shaped like torch.optim.

    import torch, libmuon
    opt = libmuon.Optimizer(model.named_parameters(), config=libmuon.config_path("muon"))
    for x, y in batches:
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()

The package loads libmuon.so through its public C API (declarations taken
from muon.h), sets OpenBLAS's core for this CPU whatever the import order
(libmuon._lib), and works with NumPy arrays alone when torch is missing.

libmuon.Optimizer (and Muon, AdamW, Lion: keyword options of one group of
that kind), libmuon.lua (Lua source for hooks, schedules and configs),
libmuon.MuonError and one subclass per MU_E* code (libmuon.EINVAL, ...),
libmuon.config_path(name) (a shipped config: "muon", "keller", ...),
libmuon.blas_info(), libmuon.__version__.
"""
from . import _lib  # first: the OpenBLAS core, before torch loads OpenBLAS

try:
    import torch  # noqa: F401 (loaded with the core set; the optimizer's torch face)
except ImportError:
    pass

from . import errors  # noqa: E402
from ._lua import lua  # noqa: E402
from .errors import MuonError  # noqa: E402
from .optimizer import AdamW, Lion, Muon, Optimizer  # noqa: E402

__version__ = _lib.text(_lib.lib.mu_version())
blas_info = _lib.blas_info
config_path = _lib.config_path
globals().update({c.name: c for c in errors.BY_CODE.values()})  # libmuon.EINVAL, ...
__all__ = ["Optimizer", "Muon", "AdamW", "Lion", "lua", "MuonError", "blas_info", "config_path"]
__all__ += [c.name for c in errors.BY_CODE.values()]
