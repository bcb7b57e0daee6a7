#!/usr/bin/env python3
"""Where a test tier's time goes: sum JUnit reports per test module, slowest first, with the tier's total.

    python3 scripts/tier_report.py NAME report.xml [report.xml ...]

``make test`` / ``make test-full`` write the reports (outputs/junit/) and call this, so CI's output records the
measurement the tier split (tests/tiers.py) is based on. Standard library only.
"""
from __future__ import annotations

import collections
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def module_times(paths: list[Path]) -> tuple[collections.Counter, collections.Counter]:
    seconds: collections.Counter = collections.Counter()
    counts: collections.Counter = collections.Counter()
    for path in paths:
        if not path.is_file():
            continue
        for case in ET.parse(path).getroot().iter("testcase"):
            module = (case.get("classname") or "?").replace(".", "/") + ".py"
            seconds[module] += float(case.get("time") or 0.0)
            counts[module] += 1
    return seconds, counts


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    name, paths = argv[0], [Path(p) for p in argv[1:]]
    seconds, counts = module_times(paths)
    total = sum(seconds.values())
    print(f"\n== tier {name}: {sum(counts.values())} tests, {total:.0f} s of test time (summed over workers) ==")
    for module, secs in seconds.most_common(20):
        print(f"{secs:8.1f} s {counts[module]:5d} tests  {module}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
