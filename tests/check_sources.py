#!/usr/bin/env python3
"""Two checks a successor relies on.

1. Every comment that cites a file of the repository (tests/..., docs/...,
   worker/..., launcher/..., common/..., examples/..., bench/..., scripts/...,
   python/...) cites one that exists.
2. Every source file of libddp, the launcher and common has a test of the
   same name (foo.cc: a foo_test.cc somewhere under tests/), except those
   listed in tests/untested_sources.txt; a listed source that has one now
   must leave the list.
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOTS = ("tests", "docs", "worker", "launcher", "common", "examples", "bench", "scripts", "python")
CITED = re.compile(r"(?<![\w./-])((?:%s)/[\w./-]+\.(?:cc|h|cu|md|sh|py|txt|toml|cmake))" %
                   "|".join(ROOTS))
ALLOWED = "tests/untested_sources.txt"


def comments(path):
    """(line number, comment text) of each comment line of a source file."""
    c_like = path.endswith((".cc", ".h", ".cu"))
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            if c_like:
                at = line.find("//")
            else:
                stripped = line.lstrip()
                at = -1 if stripped.startswith("#!") else line.find("#")
            if at >= 0:
                yield number, line[at:]


def sources(top, endings):
    for base, dirs, files in os.walk(os.path.join(ROOT, top)):
        dirs[:] = [d for d in dirs if d not in ("build", "__pycache__")]
        for name in files:
            if name.endswith(endings) or name == "CMakeLists.txt":
                yield os.path.relpath(os.path.join(base, name), ROOT)


def main():
    problems = []
    for top in ("worker", "launcher", "common", "tests", "examples", "bench", "scripts", "python"):
        for path in sources(top, (".cc", ".h", ".cu", ".sh", ".py")):
            for number, text in comments(os.path.join(ROOT, path)):
                for cited in CITED.findall(text):
                    cited = cited.rstrip(".")
                    if not os.path.exists(os.path.join(ROOT, cited)):
                        problems.append("%s:%d: cites %s, which does not exist" % (path, number, cited))
    tests = set()
    for path in sources("tests", (".cc", ".py")):
        tests.add(os.path.splitext(os.path.basename(path))[0])
    missing = []
    for top in ("worker/src", "launcher", "common/src"):
        for path in sorted(sources(top, (".cc",))):
            if path.endswith(".cc") and os.path.splitext(os.path.basename(path))[0] + "_test" not in tests:
                missing.append(path)
    with open(os.path.join(ROOT, ALLOWED)) as f:
        listed = [l.strip() for l in f if l.strip() and not l.startswith("#")]
    for path in missing:
        if path not in listed:
            problems.append("%s has no test named %s_test.cc (write one, or list it in %s)" %
                            (path, os.path.splitext(os.path.basename(path))[0], ALLOWED))
    for path in listed:
        if not os.path.exists(os.path.join(ROOT, path)):
            problems.append("%s lists %s, which does not exist" % (ALLOWED, path))
        elif path not in missing:
            problems.append("%s lists %s, which has a test now: take it off the list" % (ALLOWED, path))
    for p in problems:
        print(p)
    if problems:
        return 1
    print("sources: every cited file exists; %d sources without a same-named test, all listed in %s"
          % (len(missing), ALLOWED))
    return 0


if __name__ == "__main__":
    sys.exit(main())
