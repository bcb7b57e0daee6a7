"""The ``userns`` sandbox mode as an ordinary user (issue 34: it failed for every non-root user).

An unprivileged user namespace maps one id, the user's own; the launcher used to chown the supervisor's files to
root, an id absent from the namespace (``OSError: [Errno 22]``), and the error's fix text then asked for user
namespaces that were already allowed. Run as root, the test creates a system user and runs the sandbox as that
user through ``runuser``; run as another user, it runs the sandbox directly.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hybridflow.sandbox import modes

REPO = Path(__file__).resolve().parents[2]
USER = "hfsandboxtest"
PROGRAM = r"""
import os
for path in ("/etc/x", "/x", "/.hf/x", "/tmp/x", "x"):
    try:
        open(path, "w").write("1")
        print("wrote", path)
    except OSError as e:
        print("refused", path)
print("uid", os.getuid(), "pid", os.getpid())
"""
DRIVER = f"""
import json, sys
sys.path.insert(0, {str(REPO)!r})
from hybridflow.sandbox import SandboxConfig, modes, run_python
ok, why = modes.probe("userns")
result = run_python({PROGRAM!r}, config=SandboxConfig(isolation="userns", timeout_s=10.0)) if ok else None
print(json.dumps({{"probe": [ok, why], "euid": __import__("os").geteuid(),
                  "status": result and result.status, "stdout": result and result.stdout,
                  "stderr": result and result.stderr}}))
"""


def _python_for(user: str | None) -> str | None:
    """An interpreter ``user`` can run (the venv's base one may live in root's home)."""
    for python in (os.path.realpath(getattr(sys, "_base_executable", sys.executable)), "/usr/local/bin/python3",
                   "/usr/bin/python3"):
        argv = [python, "-I", "-S", "-c", "import json"]
        if user is not None:
            argv = ["runuser", "-u", user, "--"] + argv
        if subprocess.run(argv, capture_output=True, cwd="/").returncode == 0:
            return python
    return None


@pytest.fixture(scope="module")
def as_user():
    """(argv prefix, python) running as an unprivileged user; creates (and removes) a system user as root."""
    if os.geteuid() != 0:
        yield [], sys.executable
        return
    if shutil.which("runuser") is None or shutil.which("useradd") is None:
        pytest.skip("running as root without runuser/useradd: cannot run the sandbox as an ordinary user")
    created = subprocess.run(["id", USER], capture_output=True).returncode != 0
    if created:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", USER],
                       check=True, capture_output=True)
    try:
        python = _python_for(USER)
        if python is None:
            pytest.skip(f"no Python interpreter is executable by the user {USER}")
        if subprocess.run(["runuser", "-u", USER, "--", python, "-I", "-S", "-c",
                           f"import os; os.listdir({str(REPO / 'hybridflow' / 'sandbox')!r})"],
                          capture_output=True, cwd="/").returncode != 0:
            pytest.skip(f"the checkout {REPO} is not readable by the user {USER}")
        yield ["runuser", "-u", USER, "--"], python
    finally:
        if created:
            subprocess.run(["userdel", USER], capture_output=True)


def test_userns_mode_works_for_an_unprivileged_user(as_user):
    prefix, python = as_user
    if not modes.user_namespaces_allowed():
        pytest.skip("this kernel does not allow unprivileged user namespaces")
    done = subprocess.run(prefix + [python, "-I", "-c", DRIVER], capture_output=True, text=True, timeout=120,
                          cwd="/")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["euid"] != 0
    assert report["probe"] == [True, ""], report["probe"]
    assert report["status"] == "pass", report
    lines = report["stdout"].splitlines()
    assert lines[:5] == ["refused /etc/x", "refused /x", "refused /.hf/x", "wrote /tmp/x", "wrote x"], lines
    assert lines[5] == "uid 1000 pid 2"


def test_fix_text_does_not_ask_for_what_is_allowed(monkeypatch):
    monkeypatch.setattr(modes, "probe", lambda mode: (mode == "audit", "" if mode == "audit" else "broken here"))
    monkeypatch.setattr(modes, "user_namespaces_allowed", lambda: True)
    modes._auto_choice.cache_clear()
    try:
        with pytest.raises(modes.SandboxUnavailable) as err:
            modes.resolve_isolation(modes.SandboxConfig(), quiet=True)
        with pytest.raises(modes.SandboxUnavailable) as named:
            modes.resolve_isolation(modes.SandboxConfig(isolation="userns"), quiet=True)
    finally:
        modes._auto_choice.cache_clear()
    for text in (str(err.value), str(named.value)):
        assert "user namespaces are already allowed here" in text, text
        assert "allow unprivileged user namespaces" not in text, text
    monkeypatch.setattr(modes, "user_namespaces_allowed", lambda: False)
    assert "allow unprivileged user namespaces (sysctl" in modes.fixes()
