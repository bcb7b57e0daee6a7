#!/usr/bin/env python3
"""What a test tier did: where its time went (JUnit reports summed per module, slowest first), and what failed.

    python3 scripts/tier_report.py DIR PART [PART ...]      # reads DIR/PART.xml, DIR/PART.rc, DIR/PART.log
    python3 scripts/tier_report.py --summary DIR             # every part DIR holds: the last lines of a CI run

``make test`` / ``make test-full`` / ``make test-vllm`` run each pytest part through the Makefile's PART, which keeps
its JUnit report, its exit status and its output in outputs/junit/; this script reads them back. A failing part is
named with its failing tests; a pytest that died (a signal, or no JUnit report written) is named with the last lines
it printed, where Python's faulthandler puts the crashing thread's traceback. ``.ci/run`` ends with ``--summary`` so
the end of CI's output says which part failed and why even when the parts' own output scrolled away.
Standard library only.
"""
from __future__ import annotations

import collections
import signal
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

LOG_TAIL_LINES = 60


def read_part(directory: Path, part: str) -> dict:
    """One pytest part: exit status (None when unknown), per-module seconds and counts, failed test ids."""
    seconds: collections.Counter = collections.Counter()
    counts: collections.Counter = collections.Counter()
    failed: list[str] = []
    xml = directory / f"{part}.xml"
    has_report = xml.is_file()
    if has_report:
        for case in ET.parse(xml).getroot().iter("testcase"):
            module = (case.get("classname") or "?").replace(".", "/") + ".py"
            seconds[module] += float(case.get("time") or 0.0)
            counts[module] += 1
            if case.find("failure") is not None or case.find("error") is not None:
                failed.append(f"{module}::{case.get('name')}")
    rc_file = directory / f"{part}.rc"
    rc = int(rc_file.read_text().strip() or -1) if rc_file.is_file() else None
    return {"name": part, "rc": rc, "seconds": seconds, "counts": counts, "failed": failed,
            "has_report": has_report, "log": directory / f"{part}.log"}


def verdict(part: dict) -> str:
    rc = part["rc"]
    if rc is None:
        return "did not run (no exit status recorded)"
    if rc in (0, 5):
        return "passed" if rc == 0 else "no test selected"
    if rc > 128:
        try:
            name = signal.Signals(rc - 128).name
        except ValueError:
            name = f"signal {rc - 128}"
        return f"FAILED: pytest died of {name} (exit {rc})"
    if not part["has_report"]:
        return f"FAILED: exit {rc}, no JUnit report written (pytest stopped before its session ended)"
    return f"FAILED: exit {rc}, {len(part['failed'])} failing test(s)"


def explain_failure(part: dict, out) -> None:
    for test in part["failed"]:
        print(f"    FAILED {test}", file=out)
    died = part["rc"] is not None and (part["rc"] > 128 or not part["has_report"])
    if (died or not part["failed"]) and part["log"].is_file():
        lines = part["log"].read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        print(f"    -- last {len(lines)} lines of {part['log']} --", file=out)
        for line in lines:
            print(f"    | {line}", file=out)


def report(directory: Path, parts: list[str], out=sys.stdout) -> int:
    """Prints the time table of ``parts`` together and each failing part's cause; 1 if any part failed."""
    read = [read_part(directory, p) for p in parts]
    seconds: collections.Counter = collections.Counter()
    counts: collections.Counter = collections.Counter()
    for part in read:
        seconds.update(part["seconds"])
        counts.update(part["counts"])
    title = "+".join(parts)
    print(f"\n== {title}: {sum(counts.values())} tests, {sum(seconds.values()):.0f} s of test time "
          "(summed over workers) ==", file=out)
    for module, secs in seconds.most_common(20):
        print(f"{secs:8.1f} s {counts[module]:5d} tests  {module}", file=out)
    failed = False
    for part in read:
        line = verdict(part)
        print(f"  {part['name']}: {line}", file=out)
        if line.startswith("FAILED"):
            failed = True
            explain_failure(part, out)
    return 1 if failed else 0


def summary(directory: Path, out=sys.stdout) -> int:
    """Every part in ``directory`` (in the order the tiers run), one line each, with the causes of failures."""
    order = {"fast-parallel": 0, "fast-serial": 1, "full-parallel": 2, "full-serial": 3, "vllm": 4}
    parts = sorted({p.stem for p in directory.glob("*.rc")}, key=lambda n: (order.get(n, 9), n))
    print("\n== test parts of this run ==", file=out)
    failed = False
    for name in parts:
        part = read_part(directory, name)
        line = verdict(part)
        print(f"  {name}: {line}", file=out)
        if line.startswith("FAILED"):
            failed = True
            explain_failure(part, out)
    if not parts:
        print(f"  none recorded in {directory}", file=out)
    return 1 if failed else 0


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "--summary":
        return summary(Path(argv[1]))
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    return report(Path(argv[0]), argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
