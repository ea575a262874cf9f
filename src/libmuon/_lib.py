"""Loading libmuon: its declarations from muon.h, the OpenBLAS core, the library.

The declarations are the installed header run through the C preprocessor at
build time (muon_cdef.h: `make` writes build/gen/muon_cdef.h, `make install`
puts a copy in this package), given to cffi in ABI mode: nothing of the C API
is written here by hand.

OpenBLAS picks its kernels when it is loaded, and Debian's picks a generic
core on some recent CPUs. Before libmuon (and OpenBLAS with it) is loaded,
the CPU probe libmuon-cpu.so sets OPENBLAS_CORETYPE (mu_blas_preset_core);
when another module loaded OpenBLAS first (`import torch` or numpy), the
probe re-selects its kernels (mu_blas_switch_core), which is safe only while
no other thread runs BLAS: with other Python threads running, the import
fails with a message saying what to do. A value of OPENBLAS_CORETYPE set
before Python started is always left as it is.
"""
import os
import threading

import cffi

HERE = os.path.dirname(os.path.abspath(__file__))
CDEF_NAME = "muon_cdef.h"


def _library_candidates():
    """(path of libmuon.so, why it is tried) in search order."""
    env = os.environ.get("MUON_LIB")
    if env:
        return [(env, "MUON_LIB")]
    found = []
    try:
        from . import _paths  # written by `make install`
        found.append((os.path.join(_paths.LIBDIR, "libmuon.so"), "the install prefix"))
    except ImportError:
        pass
    build = os.environ.get("MUON_BUILD", "build")
    found.append((os.path.join(HERE, "..", "..", build, "libmuon.so"), "the source tree"))
    return found


def _find_library():
    tried = []
    for path, why in _library_candidates():
        if os.path.exists(path):
            return os.path.realpath(path)
        tried.append("%s (%s)" % (os.path.normpath(path), why))
    raise ImportError("libmuon: cannot find libmuon.so: run `make` in the muon source tree, or `make install`, or "
                      "set MUON_LIB to the path of libmuon.so; tried " + ", ".join(tried))


def _find_cdef(libpath):
    for path in (os.path.join(HERE, CDEF_NAME), os.path.join(os.path.dirname(libpath), "gen", CDEF_NAME)):
        if os.path.exists(path):
            return path
    raise ImportError("libmuon: cannot find %s (the preprocessed muon.h) in %s or beside %s: run `make` (it "
                      "writes build/gen/%s) or `make install`" % (CDEF_NAME, HERE, libpath, CDEF_NAME))


LIBRARY = _find_library()
CDEF = _find_cdef(LIBRARY)
ffi = cffi.FFI()
with open(CDEF) as _f:
    ffi.cdef(_f.read())

# What OPENBLAS_CORETYPE was when Python started (a choice this package keeps).
USER_CORE = os.environ.get("OPENBLAS_CORETYPE") or None
_probe_path = os.path.join(os.path.dirname(LIBRARY), "libmuon-cpu.so")
probe = ffi.dlopen(_probe_path) if os.path.exists(_probe_path) else None
if probe is not None:
    probe.mu_blas_preset_core()  # (refused when too late: handled after the load)
lib = ffi.dlopen(LIBRARY)


def text(p):
    """A C string as str ("" for NULL)."""
    return ffi.string(p).decode("utf-8", "replace") if p != ffi.NULL else ""


def blas_info():
    """The OpenBLAS this process runs: core, config, threads, bf16 path, and
    expected (the core muon picks for this CPU, "" for none)."""
    info = ffi.new("mu_blas_info *")
    lib.mu_blas_get_info(info)
    return {"core": text(info.core), "config": text(info.config), "threads": info.threads,
            "bf16": text(info.bf16), "expected": text(lib.mu_blas_cpu_core())}


def _fix_core():
    want = text(lib.mu_blas_cpu_core())
    running = blas_info()["core"]
    if USER_CORE or not want or running.lower() == want.lower():
        return
    fix = ("import libmuon before the modules that load OpenBLAS (torch, numpy), or export OPENBLAS_CORETYPE=%s "
           "(or another core) before Python starts" % want)
    if probe is None:
        raise ImportError("libmuon: OpenBLAS runs the %s core, and %s is missing to switch it to %s: %s"
                          % (running, _probe_path, want, fix))
    others = [t.name for t in threading.enumerate() if t is not threading.current_thread()]
    if others:
        from .errors import error_for
        raise error_for(lib.MU_ESTATE, "libmuon: OpenBLAS was loaded before libmuon with the %s core; switching it "
                        "to %s is not safe while other Python threads run (%s): %s"
                        % (running, want, ", ".join(others), fix))
    if probe.mu_blas_switch_core() != lib.MU_OK:
        from .errors import error_for
        raise error_for(lib.MU_ESTATE, "libmuon: " + text(probe.mu_last_error()))


_fix_core()


def config_path(name):
    """The path of a shipped config (configs/<name>.lua: "muon", "keller",
    "adamw", ...): the install prefix's share/muon/configs, else the source
    tree's configs/."""
    for d in (os.path.join(os.path.dirname(LIBRARY), "..", "share", "muon", "configs"),
              os.path.join(HERE, "..", "..", "configs")):
        path = os.path.normpath(os.path.join(d, name + ".lua"))
        if os.path.exists(path):
            return path
    from .errors import error_for
    raise error_for(lib.MU_EIO, "no shipped config '%s' (configs/%s.lua) beside %s or in the source tree"
                    % (name, name, LIBRARY))
