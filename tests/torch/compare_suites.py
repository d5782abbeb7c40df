#!/usr/bin/env python3
"""Compares two runs of dist_suite.py (--json): the counts of each, and every
test that passed on the first backend but not on the second, with the
second's outcome and reason.

    compare_suites.py gloo.json ddp.json
"""

import json
import sys


def main():
    first, second = (json.load(open(path)) for path in sys.argv[1:3])
    for run in (first, second):
        c = run["counts"]
        print(f"{run['backend']:>5}: run {sum(c.values())}, passed {c['PASS']}, "
              f"failed {c['FAIL']}, skipped {c['SKIP']} (world size {run['world_size']})")
    lost = []
    for name, outcome in sorted(first["tests"].items()):
        other = second["tests"].get(name, {"outcome": "NOT RUN", "why": []})
        if outcome["outcome"] == "PASS" and other["outcome"] != "PASS":
            lost.append((name, other))
    print(f"passed on {first['backend']}, not on {second['backend']}: {len(lost)}")
    for name, other in lost:
        print(f"  {name}: {other['outcome']} {' '.join(other['why'])}"[:240])
    return 0


if __name__ == "__main__":
    sys.exit(main())
