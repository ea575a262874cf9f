"""Runs the Python package's tests (tests/python/test_*.py, unittest) and
prints TAP lines for tests/run.sh: "ok N - name", "not ok N - name" (with
the failure as # lines), "ok N - name # SKIP reason" for a test that cannot
run here (torch or mpi4py missing), which make test does not count as passed.

    python3 tests/python/run.py [test_module ...]

The package is imported from src/ (PYTHONPATH is set here), the library from
$MUON_BUILD (default build/).
"""
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, HERE)
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.join(ROOT, "src"), HERE,
                                                          os.environ.get("PYTHONPATH")]))


class TapResult(unittest.TestResult):
    def __init__(self):
        super().__init__()
        self.n = 0

    def _line(self, status, test, extra=""):
        self.n += 1
        print("%s %d - %s%s" % (status, self.n, test.id().replace("test_", "", 1), extra), flush=True)

    def addSuccess(self, test):
        super().addSuccess(test)
        self._line("ok", test)

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._line("ok", test, " # SKIP " + reason)

    def _failed(self, test, err):
        self._line("not ok", test)
        for line in self._exc_info_to_string(err, test).rstrip().splitlines():
            print("# " + line)

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._failed(test, err)

    def addError(self, test, err):
        super().addError(test, err)
        self._failed(test, err)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._line("ok", test, " # TODO expected failure")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._line("not ok", test, " # unexpected success")


def main(names):
    loader = unittest.TestLoader()
    if names:
        suite = unittest.TestSuite(loader.loadTestsFromName(n) for n in names)
    else:
        suite = loader.discover(HERE, pattern="test_*.py", top_level_dir=HERE)
    result = TapResult()
    suite.run(result)
    print("1..%d" % result.n)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
