"""Compare two lock files (pip requirements with exact pins): what `make lock` changed, what `make test-latest` resolved.

    python scripts/lock_diff.py OLD NEW          # packages added, removed, changed (or "no change")
    python scripts/lock_diff.py --all OLD NEW    # also every direct dependency of pyproject.toml, side by side

Standard library only: it runs with the system Python before any venv exists.
"""
from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;#]+)")
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path: Path) -> dict[str, str]:
    """name -> version of every `name==version` line; {} when the file does not exist."""
    if not path.is_file():
        return {}
    pins = {}
    for line in path.read_text().splitlines():
        m = _PIN.match(line)
        if m:
            pins[normalize(m.group(1))] = m.group(2)
    return pins


def direct_dependencies() -> list[str]:
    """Names of pyproject.toml's dependencies and its [test] extra, in file order."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"]) + list(project.get("optional-dependencies", {}).get("test", []))
    return [normalize(_NAME.match(s).group(1)) for s in specs]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--all", action="store_true", help="also list pyproject's direct dependencies side by side")
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    args = ap.parse_args(argv)
    old, new = read_pins(args.old), read_pins(args.new)
    if not new:
        print(f"{args.new}: no pinned packages found", file=sys.stderr)
        return 1
    label = args.new.as_posix()
    if args.all:
        names = direct_dependencies()
        width = max(len(n) for n in names)
        print(f"{label}: direct dependencies ({args.old.as_posix()} -> {label})")
        for n in names:
            o, v = old.get(n, "-"), new.get(n, "-")
            print(f"  {n:<{width}}  {o:>14} -> {v:<14}{'' if o == v else '  (differs)'}")
    changed = sorted(n for n in old.keys() & new.keys() if old[n] != new[n])
    added, removed = sorted(new.keys() - old.keys()), sorted(old.keys() - new.keys())
    if not old:
        print(f"{label}: {len(new)} packages (no previous lock to compare)")
        return 0
    if not (changed or added or removed):
        print(f"{label}: {len(new)} packages, no change")
        return 0
    print(f"{label}: {len(new)} packages; {len(changed)} changed, {len(added)} added, {len(removed)} removed")
    for n in changed:
        print(f"  {n} {old[n]} -> {new[n]}")
    for n in added:
        print(f"  + {n}=={new[n]}")
    for n in removed:
        print(f"  - {n}=={old[n]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
