#!/usr/bin/env python3
"""torch's own backend-agnostic distributed test suite on a backend of ours.

The torch wheel ships the suite (torch.testing._internal.distributed.
distributed_test: the tests torch runs for gloo, nccl, mpi, ucc and plugins)
but not its runner; this is the runner. Each test spawns WORLD_SIZE
processes that meet through a file store, as torch's own runner does.

    dist_suite.py --backend ddp [--world-size 3] [-k PATTERN ...] [--json FILE]
    dist_suite.py --backend gloo ...        the same tests on torch's Gloo
    dist_suite.py --backend ddp --tests test_barrier,test_gather   exactly these

For "ddp", the backend is added to every feature set of the suite that gloo
belongs to (DistTestCases), so the suite selects for it what it selects for
gloo; tests the suite gates on the name "gloo" itself skip, and count as
skipped. Prints one line per test ("PASS", "FAIL", "SKIP" and the reason)
and the counts; exits 1 when any test failed.
Needs expecttest (scripts/requirements-build.txt).
"""

import argparse
import json
import os
import sys
import tempfile
import time
import unittest


def configure(backend, world_size):
    os.environ["BACKEND"] = backend
    os.environ["WORLD_SIZE"] = str(world_size)
    os.environ.setdefault("TEMP_DIR", tempfile.mkdtemp(prefix="dist-suite-"))


# Spawned ranks import this module again: what they need happens at import.
if os.environ.get("BACKEND"):
    if os.environ["BACKEND"] == "ddp":
        import ddprun.torch  # noqa: F401
        from torch.testing._internal import common_distributed as cd

        for features in list(cd.DistTestCases.backend_feature.values()) + list(
                cd.DistTestCases.skip_collective.values()):
            if "gloo" in features:
                features.add("ddp")
        cd.DistTestCases.backend_feature["plugin"].add("ddp")
    from torch.testing._internal.distributed.distributed_test import (
        DistributedTest, TestDistBackend)

    class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            self._spawn_processes()


class Tally(unittest.TextTestResult):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.outcomes = {}
        self.started = {}

    def startTest(self, test):
        self.started[test.id()] = time.monotonic()
        super().startTest(test)

    def _note(self, test, outcome, why=""):
        name = test.id().rsplit(".", 1)[-1]
        took = time.monotonic() - self.started.get(test.id(), time.monotonic())
        self.outcomes[name] = {"outcome": outcome, "why": why.strip().splitlines()[-1:] if why else [],
                               "seconds": round(took, 1)}
        print(f"{outcome} {name} ({took:.1f} s) {' '.join(self.outcomes[name]['why'])}"[:300],
              flush=True)

    def addSuccess(self, test):
        super().addSuccess(test)
        self._note(test, "PASS")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._note(test, "FAIL", self._exc_info_to_string(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        self._note(test, "FAIL", self._exc_info_to_string(err, test))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._note(test, "SKIP", reason)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._note(test, "PASS")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._note(test, "FAIL", "unexpected success")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", required=True, choices=["ddp", "gloo"])
    p.add_argument("--world-size", type=int, default=3)
    p.add_argument("-k", action="append", default=[], help="run tests whose name contains this")
    p.add_argument("--tests", help="run exactly these tests (names, comma-separated)")
    p.add_argument("--list", action="store_true", help="list the tests and exit")
    p.add_argument("--json", help="write each test's outcome here")
    a = p.parse_args()
    configure(a.backend, a.world_size)
    module = sys.modules[__name__]
    if not hasattr(module, "TestDistBackendWithSpawn"):  # imported before BACKEND was set
        import importlib
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        module = importlib.import_module(os.path.splitext(os.path.basename(__file__))[0])
    loader = unittest.TestLoader()
    if a.k:
        loader.testNamePatterns = [f"*{k}*" for k in a.k]
    if a.tests:
        suite = unittest.TestSuite(module.TestDistBackendWithSpawn(name)
                                   for name in a.tests.split(","))
    else:
        suite = loader.loadTestsFromTestCase(module.TestDistBackendWithSpawn)
    if a.list:
        for test in suite:
            print(test.id().rsplit(".", 1)[-1])
        return 0
    runner = unittest.TextTestRunner(resultclass=Tally, verbosity=0, stream=open(os.devnull, "w"))
    result = runner.run(suite)
    counts = {k: sum(o["outcome"] == k for o in result.outcomes.values())
              for k in ("PASS", "FAIL", "SKIP")}
    print(f"SUITE {a.backend} world_size={a.world_size}: run {len(result.outcomes)} "
          f"passed {counts['PASS']} failed {counts['FAIL']} skipped {counts['SKIP']}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"backend": a.backend, "world_size": a.world_size, "counts": counts,
                       "tests": result.outcomes}, f, indent=1)
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
