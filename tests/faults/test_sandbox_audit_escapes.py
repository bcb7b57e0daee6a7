"""The escapes an independent probe found in the ``audit`` sandbox mode (issue 34), each tried for real.

The hook checked paths lexically and never saw a ``dir_fd``: ``..`` after a symbolically linked directory read a
file outside (``/etc/shadow`` as root), a directory handle on the Python installation took a relative write, a
handle on the working directory with a deeper current directory wrote outside it, ``fchmod`` changed a file of the
installation through a read-only descriptor, and root could ``mknod`` a device node. The program runs on a
private copy of the interpreter (a ``pyvenv.cfg`` beside it), so its "Python installation" is a folder this test
owns and may plant links in.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hybridflow.sandbox import SandboxConfig, run_python


@pytest.fixture(scope="module")
def installation(tmp_path_factory) -> Path:
    """A Python installation this test owns: the real interpreter copied under ``prefix/bin`` + ``pyvenv.cfg``."""
    prefix = tmp_path_factory.mktemp("fake_prefix")
    real = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    (prefix / "bin").mkdir()
    shutil.copy2(real, prefix / "bin" / "python3")
    (prefix / "pyvenv.cfg").write_text(f"home = {os.path.dirname(real)}\ninclude-system-site-packages = false\n")
    probe = subprocess.run([str(prefix / "bin" / "python3"), "-I", "-c", "import sys; print(sys.prefix)"],
                           capture_output=True, text=True)
    if probe.returncode != 0 or probe.stdout.strip() != str(prefix):
        pytest.skip(f"a copy of {real} does not run from another folder: {probe.stderr[-300:]}")
    (prefix / "lib").mkdir()
    (prefix / "lib" / "stdlib_file.py").write_text("x = 1\n")
    (prefix / "lib" / "stdlib_file.py").chmod(0o644)
    return prefix


def audit(installation: Path) -> SandboxConfig:
    return SandboxConfig(isolation="audit", timeout_s=10.0, python_executable=str(installation / "bin" / "python3"))


def attempt(name: str, body: str) -> str:
    """A program fragment that prints ``ESCAPED <name>`` when ``body`` runs, else ``refused <name> <error>``."""
    inner = textwrap.indent(textwrap.dedent(body).strip("\n"), "    ")
    return (f"\ntry:\n{inner}\n    print('ESCAPED {name}', flush=True)\nexcept Exception as e:\n"
            f"    print('refused {name}', type(e).__name__, str(e)[:160], flush=True)\n")


def test_dotdot_through_a_linked_directory_reads_nothing_outside(installation, tmp_path):
    secret_dir = tmp_path / "outside"
    (secret_dir / "sub").mkdir(parents=True)
    (secret_dir / "secret.txt").write_text("LINK-SECRET-7")
    (secret_dir / "secret.txt").chmod(0o644)
    link = installation / "lib" / "linked"
    link.unlink(missing_ok=True)
    link.symlink_to(secret_dir / "sub", target_is_directory=True)
    lexical_inside = f"{link}/../secret.txt"  # spelled inside the installation, really outside it
    code = "import os\n" + attempt("secret", f"print(open({lexical_inside!r}).read())")
    code += attempt("link-dir-listing", f"print(os.listdir({str(link)!r}))")
    if os.geteuid() == 0:  # the probe's read of /etc/shadow as root, through a link to /etc/ssl
        (installation / "lib" / "etc_link").unlink(missing_ok=True)
        (installation / "lib" / "etc_link").symlink_to("/etc/ssl", target_is_directory=True)
        code += attempt("shadow", f"print(open({str(installation / 'lib' / 'etc_link')!r} + '/../shadow').read())")
    result = run_python(code, config=audit(installation))
    assert result.status == "pass", result.stderr
    assert "ESCAPED" not in result.stdout and "LINK-SECRET-7" not in result.stdout, result.stdout
    assert f"access to {secret_dir}/secret.txt outside the working directory" in result.stdout, result.stdout


def test_directory_handles_do_not_carry_writes_outside(installation):
    target = installation / "lib" / "planted.py"
    code = "import os\n" + attempt("install-handle", f"""
        fd = os.open({str(installation / 'lib')!r}, os.O_RDONLY)
        os.close(os.open("planted.py", os.O_WRONLY | os.O_CREAT, dir_fd=fd))""")
    code += attempt("deeper-cwd", """
        top = os.open(".", os.O_RDONLY)
        os.makedirs("a/b")
        os.chdir("a/b")
        os.close(os.open("../escaped.txt", os.O_WRONLY | os.O_CREAT, dir_fd=top))""")
    code += attempt("remove-through-fd", """
        os.chdir(os.path.dirname(os.path.dirname(os.getcwd())))
        top = os.open(".", os.O_RDONLY)
        os.remove("../main.py", dir_fd=top)""")
    code += attempt("fchmod-readonly-fd", f"""
        fd = os.open({str(installation / 'lib' / 'stdlib_file.py')!r}, os.O_RDONLY)
        os.chmod(fd, 0o777)""")
    code += attempt("rename-out", """
        open("mine.txt", "w").write("x")
        top = os.open(".", os.O_RDONLY)
        os.rename("mine.txt", "../moved.txt", dst_dir_fd=top)""")
    code += attempt("inside-is-fine", """
        top = os.open(".", os.O_RDONLY)
        os.mkdir("ok", dir_fd=top)
        os.close(os.open("ok/f.txt", os.O_WRONLY | os.O_CREAT))
        print(sorted(os.listdir(top)), flush=True)
        raise RuntimeError("not an escape: done")""")
    result = run_python(code, config=audit(installation))
    assert result.status == "pass", result.stderr
    lines = result.stdout.splitlines()
    assert not any(line.startswith("ESCAPED") for line in lines), result.stdout
    assert not target.exists()
    assert (installation / "lib" / "stdlib_file.py").stat().st_mode & 0o777 == 0o644
    assert "refused install-handle PermissionError sandbox: a directory handle outside" in result.stdout
    assert "refused deeper-cwd PermissionError sandbox: relative paths that climb above their start" in result.stdout
    for name in ("remove-through-fd", "fchmod-readonly-fd", "rename-out"):
        assert f"refused {name} PermissionError sandbox: writing " in result.stdout, (name, result.stdout)
    assert "refused inside-is-fine RuntimeError not an escape: done" in result.stdout  # work-dir handles work
    assert "'ok'" in result.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can create device nodes")
def test_a_device_node_made_by_root_cannot_be_opened(installation):
    code = "import os, stat\n" + attempt("mknod", """
        os.mknod("dev", stat.S_IFCHR | 0o600, os.makedev(1, 3))
        open("dev", "rb").read(1)""")
    code += attempt("dev-null", "open('/dev/null', 'rb').read(1)")
    result = run_python(code, config=audit(installation))
    assert result.status == "pass", result.stderr
    assert "refused mknod PermissionError sandbox: device " in result.stdout and "ESCAPED dev-null" in result.stdout


def test_pathlib_and_ordinary_file_work_still_pass(installation):
    result = run_python(textwrap.dedent("""
        import json, os, pathlib, shutil, tempfile
        p = pathlib.Path("data") / "x.json"
        p.parent.mkdir()
        p.write_text(json.dumps({"a": 1}))
        with tempfile.TemporaryDirectory(dir=".") as d:
            shutil.copy(p, pathlib.Path(d) / "y.json")
        shutil.rmtree("data")
        import decimal, fractions  # the import system still reads the standard library
        print(sorted(os.listdir(".")), decimal.Decimal(1) + 1 == fractions.Fraction(4, 2))
    """), config=audit(installation))
    assert result.status == "pass", result.stderr
    assert result.stdout.strip() == "['main.py'] True", result.stdout


def test_the_hooks_helpers_cannot_be_patched_from_a_frame_walk(installation):
    """The hook now calls named helpers: rewriting their code or the bootstrap's tables must change nothing."""
    target = installation / "lib" / "patched_escape.txt"
    code = textwrap.dedent("""
        import sys
        frame = sys._getframe()
        while frame.f_back is not None:
            frame = frame.f_back
        scope = frame.f_globals
        for name, value in list(scope.items()):
            if name.startswith("__"):
                continue
            if hasattr(value, "__code__"):
                try:
                    value.__code__ = (lambda *a, **k: None).__code__
                    print("patched", name)
                except Exception as e:
                    print("refused patch", name, type(e).__name__)
            elif isinstance(value, dict):
                value.clear()
            elif isinstance(value, tuple):
                scope[name] = ("/",)
    """) + attempt("write", f"open({str(target)!r}, 'w').write('x')")
    result = run_python(code, config=audit(installation))
    assert result.status == "pass", result.stderr
    assert "refused patch _real_path PermissionError" in result.stdout and "refused patch _check_open" in result.stdout
    assert "refused write PermissionError" in result.stdout and not target.exists(), result.stdout
