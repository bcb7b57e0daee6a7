"""Which isolation modes this machine offers, which one ``isolation="auto"`` picks, and saying so.

Modes, strongest first (what each confines: docs/sandbox.md):

* ``namespace``: needs root (CAP_SYS_ADMIN). Kernel namespaces set up by root, then a random unprivileged uid.
* ``bwrap``: bubblewrap (``bwrap`` on PATH) with unprivileged user namespaces.
* ``userns``: hybridflow's own launcher in an unprivileged user namespace (no extra package).
* ``audit``: a Python audit hook and resource limits only; **never chosen by** ``auto``: it must be named,
  and it warns.

Every mode is checked by a real attempt (a tiny program run in it, once per process), so a kernel that
forbids user namespaces, a container without ``/proc`` access, or a broken ``bwrap`` rules that mode out
with the reason. ``auto`` takes the first mode that works (as root: ``namespace``, ``bwrap``, ``userns``;
otherwise ``bwrap``, ``userns``) and raises :class:`SandboxUnavailable` with every mode's reason and the
fixes when none does.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import threading

from hybridflow.sandbox.limits import SandboxConfig
from hybridflow.sandbox.runner import execute

OS_MODES = ("namespace", "bwrap", "userns")
DESCRIPTIONS = {
    "namespace": "root-made mount/PID/network/IPC/UTS namespaces, private read-only root, random unprivileged "
                 "uid, seccomp filter, rlimits, memory and process watchdog",
    "bwrap": "bubblewrap: user/mount/PID/network/IPC/UTS namespaces, private read-only root, no capabilities, "
             "seccomp filter, rlimits, memory and process watchdog",
    "userns": "unprivileged user namespace with mount/PID/network/IPC/UTS namespaces, private read-only root, "
              "seccomp filter, rlimits, memory and process watchdog",
    "audit": "NO OS ISOLATION: a Python audit hook and rlimits only (stops accidental escapes, not a "
             "determined program)",
}
_USERNS_SYSCTLS = ("sysctl kernel.unprivileged_userns_clone=1 / user.max_user_namespaces > 0; on Ubuntu 24.04+ "
                   "also kernel.apparmor_restrict_unprivileged_userns=0")
_USERNS_PROBE = ("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                 "raise SystemExit(0 if libc.unshare(0x10000000) == 0 else 1)")  # CLONE_NEWUSER


@functools.lru_cache(maxsize=1)
def user_namespaces_allowed() -> bool:
    """True when this user may create a user namespace (tried in a throwaway process)."""
    if not sys.platform.startswith("linux"):
        return False
    python = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    try:
        return subprocess.run([python, "-I", "-S", "-c", _USERNS_PROBE], timeout=20,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def fixes() -> str:
    """What would make an OS-level mode work here; never asks for what this machine already allows."""
    steps = []
    if shutil.which("bwrap") is None:
        steps.append("install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap)")
    if user_namespaces_allowed():
        steps.append("user namespaces are already allowed here, so a failing 'userns' mode is a hybridflow bug: "
                     "report its reason (above)")
    else:
        steps.append(f"allow unprivileged user namespaces ({_USERNS_SYSCTLS})")
    if os.geteuid() != 0:
        steps.append("run as root")
    steps.append("run the code on another machine with `hybridflow sandbox serve` (reward_model.sandbox_fusion.url)")
    steps.append("for trusted code only, ask for the weak mode by name with isolation='audit'")
    return "; or ".join(steps)


class SandboxUnavailable(RuntimeError):
    """No isolation mode that was asked for (or, for ``auto``, none of the OS-level ones) works here."""


_PROBE = "import os\nprint('ok', os.getpid())"


@functools.lru_cache(maxsize=None)
def probe(mode: str) -> tuple[bool, str]:
    """(works, reason) for ``mode`` on this machine, by running a tiny program in it (cached per process)."""
    if not sys.platform.startswith("linux"):
        return False, f"needs Linux (this is {sys.platform})"
    if mode == "namespace" and os.geteuid() != 0:
        return False, "needs root (CAP_SYS_ADMIN)"
    if mode == "bwrap" and shutil.which("bwrap") is None:
        return False, "bubblewrap is not installed (no 'bwrap' on PATH)"
    if mode == "audit":
        return True, ""
    result = execute(_PROBE, "", SandboxConfig(timeout_s=20.0, memory_mb=256, isolation=mode), mode)
    if result.status == "pass" and result.stdout.startswith("ok 2"):
        return True, ""
    detail = (result.stderr or result.stdout).strip().splitlines()
    return False, f"a test program ended with status {result.status!r}: " + " | ".join(detail[-3:])[:400]


def available_isolations() -> list[str]:
    """The modes that work here, strongest first (``audit`` always last)."""
    return [m for m in OS_MODES if probe(m)[0]] + ["audit"]


def _auto_order() -> tuple[str, ...]:
    return OS_MODES if os.geteuid() == 0 else ("bwrap", "userns")


@functools.lru_cache(maxsize=1)
def _auto_choice() -> str:
    reasons = []
    for mode in _auto_order():
        ok, why = probe(mode)
        if ok:
            return mode
        reasons.append(f"{mode}: {why}")
    raise SandboxUnavailable(
        "no OS-level sandbox works on this machine, so model-written code cannot run safely (tried "
        + "; ".join(reasons) + "). Fix: " + fixes())


_announced: set[str] = set()
_announce_lock = threading.Lock()


def announce(mode: str) -> None:
    """Say once per process which isolation runs model-written code (a warning for ``audit``)."""
    with _announce_lock:
        if mode in _announced:
            return
        _announced.add(mode)
    prefix = "hybridflow sandbox: WARNING:" if mode == "audit" else "hybridflow sandbox:"
    line = f"{prefix} isolation={mode} ({DESCRIPTIONS.get(mode, mode)})"
    if mode == "audit":
        line += "; use it for trusted code only (docs/sandbox.md)"
    print(line, file=sys.stderr, flush=True)


def resolve_isolation(config: SandboxConfig, quiet: bool = False) -> str:
    """The mode a run with ``config`` uses; raises :class:`SandboxUnavailable` with the reason and fixes."""
    if config.isolation == "auto":
        mode = _auto_choice()
    else:
        mode = config.isolation
        ok, why = probe(mode)
        if not ok:
            raise SandboxUnavailable(f"SandboxConfig.isolation={mode!r} does not work here: {why}. "
                                     f"Modes that work: {', '.join(available_isolations())}. Fix: {fixes()}")
    if not quiet:
        announce(mode)
    return mode


def namespaces_available() -> bool:
    """True when the root ``namespace`` mode works (kept for callers of the old API)."""
    return probe("namespace")[0]


__all__ = ["DESCRIPTIONS", "OS_MODES", "SandboxUnavailable", "announce", "available_isolations", "fixes",
           "namespaces_available", "probe", "resolve_isolation", "user_namespaces_allowed"]
