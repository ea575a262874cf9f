"""The package declares nothing of the C API by hand: its declarations are
muon.h run through the preprocessor (build/gen/muon_cdef.h, compared with a
fresh run here), and every function and constant it uses is declared there,
in the installed header's public section."""
import glob
import os
import re
import shutil
import subprocess
import unittest

import helpers

from libmuon import _lib

SRC = os.path.join(helpers.ROOT, "src", "libmuon")
HEADER = os.path.join(helpers.ROOT, "src", "muon.h")


def package_text():
    return {os.path.basename(p): open(p).read() for p in sorted(glob.glob(os.path.join(SRC, "*.py")))}


def declared_functions(text):
    return set(re.findall(r"MU_API\s+[^;(]*?\b(mu_\w+)\s*\(", text))


class Declarations(unittest.TestCase):
    @unittest.skipUnless(shutil.which(os.environ.get("CC", "cc")), "no C compiler to preprocess muon.h")
    def test_the_cdef_is_the_preprocessed_header(self):
        fresh = subprocess.run([os.environ.get("CC", "cc"), "-E", "-P", "-DMU_FFI_CDEF", HEADER],
                               stdout=subprocess.PIPE, check=True).stdout.decode()
        fresh = "".join(line + "\n" for line in fresh.splitlines() if line.strip())
        with open(_lib.CDEF) as f:
            self.assertEqual(f.read(), fresh, "%s is stale: run make" % _lib.CDEF)

    def test_every_call_the_package_uses_is_declared_in_muon_h(self):
        header = open(HEADER).read()
        public = declared_functions(header)
        used, consts = set(), set()
        for name, text in package_text().items():
            used |= set(re.findall(r"\b(?:lib|probe)\.(mu_\w+)", text))
            consts |= set(re.findall(r"\blib\.(MU_\w+)", text))
        self.assertGreater(len(used), 15)
        self.assertEqual(sorted(used - public), [], "calls the package uses that muon.h does not declare")
        cdef = open(_lib.CDEF).read()  # the preprocessed header: the status codes' table expanded
        for c in consts:
            self.assertIsInstance(getattr(_lib.lib, c), int, c)
            self.assertRegex(cdef, r"\b%s\b" % c)
        for f in used:  # and cffi resolved each one from the declarations
            self.assertTrue(callable(getattr(_lib.lib, f)), f)

    def test_no_declaration_is_written_by_hand(self):
        for name, text in package_text().items():
            self.assertNotIn("import ctypes", text, name)
            self.assertNotRegex(text, r"\b(?:int|void|double|char)\s*\*?\s*mu_\w+\s*\(", name)
            if name != "_lib.py":
                self.assertNotIn(".cdef(", text, name)
        self.assertIn("ffi.cdef(_f.read())", package_text()["_lib.py"])

    def test_only_the_embedding_api(self):
        used = set()
        for text in package_text().values():
            used |= set(re.findall(r"\b(?:lib|probe)\.(mu_\w+)", text))
        self.assertEqual(sorted(used - EMBEDDING_API), [], "calls outside the installed header's embedding API")
        self.assertLessEqual(len(EMBEDDING_API), 40)


# The installed header's embedding API (what stays public when the Lua
# layer's calls move to a private header), with the package's additions:
# mu_blas_switch_core, mu_engine_open_source, mu_engine_set_grads,
# mu_engine_query, mu_engine_save_ex.
EMBEDDING_API = set("""
mu_strerror mu_errname mu_last_error mu_version
mu_blas_cpu_core mu_blas_fix_core mu_blas_preset_core mu_blas_switch_core mu_blas_get_info mu_blas_set_threads
mu_engine_open mu_engine_open_ex mu_engine_open_source mu_engine_close mu_engine_add_param
mu_engine_add_param_sharded mu_engine_set_comm mu_engine_set_grads mu_engine_step mu_engine_reduce_grads
mu_engine_zero_grad mu_engine_clip_grad_norm mu_engine_set mu_engine_get mu_engine_set_lr mu_engine_set_signal
mu_engine_save mu_engine_save_ex mu_engine_load mu_engine_load_ex mu_engine_query mu_engine_error mu_engine_error_copy
mu_script_run mu_script_run_module
""".split())

if __name__ == "__main__":
    unittest.main()
