#!/usr/bin/env python3
"""Meet hybridflow the way a newcomer does: clone it into an empty folder and run the README's two commands.

    python3 scripts/fresh_clone_check.py                 # HEAD of this checkout: make quickstart, then make test
    python3 scripts/fresh_clone_check.py --skip-test     # the quickstart only (about 4 minutes)
    python3 scripts/fresh_clone_check.py --ref main --margin 0.10 --keep

It clones the repository (the committed REF of the checkout it is run from; uncommitted changes are not part of a
clone) into a new temporary folder, with no venv and none of this shell's PYTHONPATH/VIRTUAL_ENV, and runs there:

1. `make quickstart`: builds .venv from the lock, trains the tiny model; the check reads the held-out accuracy
   before and after RL from the printed line and from summary.json (they must agree) and requires
   after >= before + MARGIN;
2. `make test` (unless --skip-test): the whole suite; with --full also `make test-full` (the tests marked `full`:
   the live report in a headless browser).

Nothing is put beside the clone (no ../shared): the suite must pass from the repository alone. A test that errors
or fails because something outside the clone is missing (a path above the clone, the GSM8K copy in ../shared) fails
the check by name, even if the rest passed.

It ends with a summary: each step's wall time and exit status, the accuracies, the versions installed in the
clone's .venv, and a verdict (exit status 0 only when every step passed). The temporary folder is removed unless
--keep. Standard library only: it runs with the system Python, before any venv exists.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

SOURCE = Path(__file__).resolve().parent.parent
SHOWN_PACKAGES = ("torch", "transformers", "accelerate", "peft", "ray", "numpy", "tokenizers", "datasets", "trl")
QUICKSTART_LINE = re.compile(r"\[quickstart\] held-out accuracy \(greedy\): before RL ([\d.]+)%\s+->\s+after ([\d.]+)%")


def git(*args: str, cwd: Path = SOURCE) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def kill_group(pgid: int, proc: subprocess.Popen) -> None:
    """TERM, then KILL, a process group (make and everything it started: pytest, Ray workers, ...)."""
    for sig, grace in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass


def run_step(name: str, cmd: list[str], cwd: Path, env: dict, timeout: float, log: Path) -> dict:
    """Run one command, streaming its output here and into `log`; returns name, command, rc, seconds, output."""
    print(f"\n=== {name}: {' '.join(cmd)}  (in {cwd}, limit {timeout:.0f} s)", flush=True)
    start = time.monotonic()
    lines: list[str] = []
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1, start_new_session=True)

    def pump() -> None:
        with open(log, "w") as fh:
            assert proc.stdout is not None
            for line in proc.stdout:
                sys.stdout.write(line)
                sys.stdout.flush()
                fh.write(line)
                lines.append(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    timed_out = False
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_group(proc.pid, proc)
    except KeyboardInterrupt:
        kill_group(proc.pid, proc)
        raise
    reader.join(timeout=10)
    if reader.is_alive():  # processes the step started outlived it and hold its output open
        print(f"=== {name}: stopping processes it left running", flush=True)
        kill_group(proc.pid, proc)
        reader.join(timeout=10)
    seconds = time.monotonic() - start
    rc = 124 if timed_out else proc.returncode
    note = f" (stopped after the {timeout:.0f} s limit)" if timed_out else ""
    print(f"=== {name}: exit {rc} in {seconds:.0f} s{note}", flush=True)
    return {"name": name, "command": " ".join(cmd), "rc": rc, "seconds": seconds, "output": "".join(lines)}


def quickstart_numbers(output: str, clone: Path, margin: float) -> tuple[dict, list[str]]:
    """The before/after accuracies (fractions) from the printed line and summary.json; problems found."""
    problems: list[str] = []
    found = QUICKSTART_LINE.findall(output)
    printed = (float(found[-1][0]) / 100, float(found[-1][1]) / 100) if found else None
    if printed is None:
        problems.append("the quickstart printed no '[quickstart] held-out accuracy (greedy): before RL ..% -> after ..%' line")
    summary_path = clone / "outputs" / "quickstart" / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else None
    if summary is None:
        problems.append(f"{summary_path.relative_to(clone)} was not written")
    numbers = {}
    if summary is not None:
        numbers = {"before": summary["before"]["accuracy"], "after": summary["after"]["accuracy"],
                   "steps": summary.get("steps"), "seconds": summary.get("seconds")}
        if printed and any(abs(p - s) > 0.0005 for p, s in zip(printed, (numbers["before"], numbers["after"]))):
            problems.append(f"printed accuracies {printed} differ from summary.json's "
                            f"{(numbers['before'], numbers['after'])}")
    elif printed:
        numbers = {"before": printed[0], "after": printed[1]}
    if numbers and numbers["after"] < numbers["before"] + margin:
        problems.append(f"accuracy after RL {100 * numbers['after']:.1f}% is not at least before "
                        f"{100 * numbers['before']:.1f}% + {100 * margin:.1f} points")
    return numbers, problems


def installed_versions(clone: Path) -> dict[str, str]:
    python = clone / ".venv" / "bin" / "python"
    if not python.exists():
        return {}
    code = ("import importlib.metadata as m, json, sys\n"
            "out = {}\n"
            "for n in sys.argv[1:]:\n"
            "    try: out[n] = m.version(n)\n"
            "    except m.PackageNotFoundError: out[n] = 'not installed'\n"
            "print(json.dumps(out))")
    res = subprocess.run([str(python), "-c", code, *SHOWN_PACKAGES], capture_output=True, text=True)
    return json.loads(res.stdout) if res.returncode == 0 else {}


def pytest_tally(output: str) -> str:
    """The summary lines of every pytest run in ``output`` (`make test` runs a parallel part, then a serial one)."""
    tails = [ln.strip("= \n") for ln in output.splitlines() if re.search(r"\d+ (passed|failed|error)", ln)
             and re.search(r" in [\d.]+s", ln)]
    return " + ".join(tails) if tails else "no pytest summary line"


# pytest's short summary ("ERROR tests/x.py::t - ...", "FAILED ...") lines that blame a file outside the clone
OUTSIDE_CLONE = re.compile(r"\.\./shared|/shared/data|HYBRIDFLOW_SHARED|GSM8K data not found")


def outside_clone_errors(output: str) -> list[str]:
    """The failed or erroring tests whose message points outside the clone (e.g. at ../shared/data/gsm8k)."""
    return [ln.strip() for ln in output.splitlines()
            if ln.startswith(("ERROR ", "FAILED ")) and OUTSIDE_CLONE.search(ln)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", default="HEAD", help="commit, branch or tag of this checkout to clone (default HEAD)")
    ap.add_argument("--skip-test", action="store_true", help="run `make quickstart` only, not `make test`")
    ap.add_argument("--full", action="store_true", help="after `make test`, run `make test-full` (the full tier)")
    ap.add_argument("--margin", type=float, default=0.05,
                    help="required gain of held-out accuracy, as a fraction (default 0.05 = 5 points)")
    ap.add_argument("--quickstart-timeout", type=float, default=1800, help="seconds (default 1800; venv included)")
    ap.add_argument("--test-timeout", type=float, default=3600, help="seconds for `make test` (default 3600)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder (its path is printed)")
    args = ap.parse_args(argv)

    try:
        sha = git("rev-parse", "--verify", "--quiet", f"{args.ref}^{{commit}}")
    except subprocess.CalledProcessError:
        print(f"error: --ref {args.ref!r} is not a commit of {SOURCE}", file=sys.stderr)
        return 2
    described = git("log", "-1", "--format=%h %s", sha)
    if args.ref == "HEAD" and git("status", "--porcelain", "--untracked-files=no"):
        print("note: this checkout has uncommitted changes; the clone holds the committed HEAD only", flush=True)

    tmp = Path(tempfile.mkdtemp(prefix="hybridflow-fresh-"))
    clone = tmp / "hybridflow"
    # nothing beside the clone, and no pointer to data outside it: what a stranger's clone has
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME",
                                                           "HYBRIDFLOW_SHARED")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if not (Path(p) / "activate").exists())  # no venv's bin/ on PATH
    steps: list[dict] = []
    problems: list[str] = []
    numbers: dict = {}
    versions: dict = {}
    completed = False
    t0 = time.monotonic()
    try:
        start = time.monotonic()
        subprocess.run(["git", "clone", "--quiet", "--no-checkout", str(SOURCE), str(clone)], check=True)
        subprocess.run(["git", "-c", "advice.detachedHead=false", "checkout", "--quiet", sha], cwd=clone, check=True)
        leftovers = [p for p in (".venv", ".venv-vllm", "outputs") if (clone / p).exists()]
        assert not leftovers, f"the clone is not fresh: {leftovers}"
        beside = sorted(p.name for p in tmp.iterdir() if p != clone)
        assert not beside, f"the clone is not alone in {tmp}: {beside}"
        print(f"cloned {described} into {clone} in {time.monotonic() - start:.1f} s", flush=True)

        qs = run_step("make quickstart", ["make", "quickstart"], clone, env, args.quickstart_timeout,
                      tmp / "quickstart.log")
        steps.append(qs)
        if qs["rc"] != 0:
            problems.append(f"`make quickstart` exited {qs['rc']}")
        numbers, found = quickstart_numbers(qs["output"], clone, args.margin)
        problems += found
        versions = installed_versions(clone)
        targets = [] if args.skip_test else ["test"] + (["test-full"] if args.full else [])
        for target in targets:
            test = run_step(f"make {target}", ["make", target], clone, env, args.test_timeout, tmp / f"{target}.log")
            test["tally"] = pytest_tally(test["output"])
            steps.append(test)
            if test["rc"] != 0:
                problems.append(f"`make {target}` exited {test['rc']} ({test['tally']})")
            outside = outside_clone_errors(test["output"])
            if outside:
                problems.append(f"`make {target}`: {len(outside)} test(s) need files outside the clone: "
                                + "; ".join(outside[:5]))
        completed = True
    except KeyboardInterrupt:
        problems.append("interrupted (the running step's processes were stopped)")
    finally:
        if not completed and not problems:
            problems.append("the check itself stopped with an error (traceback below)")
        print("\n=== fresh-clone check: summary", flush=True)
        print(f"commit     {described}")
        for s in steps:
            extra = f"  [{s['tally']}]" if "tally" in s else ""
            print(f"{s['name']:<16} exit {s['rc']:<4} {s['seconds']:7.0f} s{extra}")
        if args.skip_test:
            print("make test        skipped (--skip-test)")
        if numbers:
            print(f"quickstart       held-out accuracy {100 * numbers['before']:.1f}% -> {100 * numbers['after']:.1f}% "
                  f"(required gain {100 * args.margin:.1f} points)")
        if versions:
            print("installed        " + ", ".join(f"{k} {v}" for k, v in versions.items()))
        print(f"total            {time.monotonic() - t0:.0f} s")
        print("FAILED: " + "; ".join(problems) if problems else "PASSED", flush=True)
        if args.keep:
            print(f"kept {tmp}", flush=True)
        else:
            print(f"removing {tmp}", flush=True)
            shutil.rmtree(tmp, ignore_errors=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
