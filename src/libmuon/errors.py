"""Exceptions: one class per MU_E* status code, all under MuonError.

The classes are made from the library's own table (mu_errname,
mu_strerror: the MU_ERRORS table of muon.h), named as the codes are without
their MU_ prefix: libmuon.EINVAL, libmuon.EIO, ... Each also derives from the
Python exception that means the same (EINVAL from ValueError, EIO from
OSError, ...), so `except ValueError` catches a bad option too. An exception
carries the engine's message (str(e)), .code (the negative status) and .name.
"""
from ._lib import lib, text


class MuonError(Exception):
    """A failed muon call: str(e) is the engine's message, e.code the MU_E*
    status (negative), e.name its name ("EINVAL")."""

    code = None
    name = None

    def __init__(self, message, code=None):
        Exception.__init__(self, message)
        if code is not None:
            self.code = code
            self.name = text(lib.mu_errname(code))

    def __str__(self):
        return str(self.args[0]) if self.args else ""


# The Python exception each code also is (by name; any other: RuntimeError).
_ALSO = {"EINVAL": ValueError, "ENOMEM": MemoryError, "EIO": OSError, "EFORMAT": ValueError, "EDTYPE": TypeError,
         "ESHAPE": ValueError, "ENONFINITE": FloatingPointError}

BY_CODE = {}


def _make_classes():
    code = -1
    while True:
        name = text(lib.mu_errname(code))
        if name == "UNKNOWN":
            break
        cls = type(name, (MuonError, _ALSO.get(name, RuntimeError)),
                   {"code": code, "name": name, "__doc__": "MU_%s (%d): %s" % (name, code, text(lib.mu_strerror(code))),
                    "__module__": "libmuon"})
        BY_CODE[code] = cls
        globals()[name] = cls
        code -= 1


_make_classes()
__all__ = ["MuonError", "error_for", "check"] + [c.name for c in BY_CODE.values()]


def error_for(code, message):
    """The exception of status code (a MuonError subclass) with message."""
    cls = BY_CODE.get(code)
    return cls(message) if cls else MuonError(message, code)


# The fixes a message names, as this package spells them: the C call the
# library's message gives -> the Python call.
PY_FIXES = (("mu_engine_load_ex(eng, path, MU_LOAD_NO_CHECKSUM)", "load(path, checksum=False)"),)


def check(rc, eng=None):
    """Raise the exception of status rc (the message of eng's last failure,
    or of this thread's) unless rc is MU_OK."""
    if rc != 0:
        msg = text(lib.mu_engine_error(eng)) if eng is not None else text(lib.mu_last_error())
        for c_fix, py_fix in PY_FIXES:
            msg = msg.replace(c_fix, py_fix)
        raise error_for(rc, msg or text(lib.mu_strerror(rc)))
