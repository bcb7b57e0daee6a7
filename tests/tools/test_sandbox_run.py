"""Ordinary sandbox behaviour: statuses, stdin/stdout, private working dirs, parallel calls, config errors.
(Escape attempts live in tests/faults/test_sandbox.py.)"""

from __future__ import annotations

import os
import tempfile
from concurrent.futures import ThreadPoolExecutor

import pytest

from hybridflow.sandbox.runner import _CappedBuffer
from hybridflow.sandbox import (
    SandboxConfig,
    SandboxResult,

    namespaces_available,
    resolve_isolation,
    run_python,
)

FAST = SandboxConfig(timeout_s=5.0)


def test_pass_with_stdin_and_stdout():
    result = run_python("import sys\nprint(sum(int(x) for x in sys.stdin.read().split()))", stdin="1 2 3\n4",
                        config=FAST)
    assert isinstance(result, SandboxResult)
    assert (result.status, result.returncode, result.stdout) == ("pass", 0, "10\n")
    assert result.isolation == resolve_isolation(FAST)
    assert 0 < result.wall_s < 5


@pytest.mark.parametrize("code, needle", [
    ("raise ValueError('boom')", "ValueError: boom"),
    ("def f(:\n  pass", "SyntaxError"),
    ("import sys; print('partial'); sys.exit(3)", ""),
])
def test_failing_programs_are_fail_with_their_errors(code, needle):
    result = run_python(code, config=FAST)
    assert result.status == "fail"
    assert result.returncode != 0
    assert needle in result.stderr


def test_exit_zero_is_pass_and_large_stdin_is_fed():
    data = "x" * 300_000  # larger than a pipe buffer: the host must write while reading
    result = run_python("import sys\ndata = sys.stdin.read()\nprint(len(data))\nsys.exit(0)", stdin=data, config=FAST)
    assert (result.status, result.stdout.strip()) == ("pass", "300000")


def test_unstartable_interpreter_is_error_not_fail():
    bad = SandboxConfig(timeout_s=5.0, python_executable="/nonexistent/python3")
    result = run_python("print(1)", config=bad)
    assert result.status == "error"
    assert "setup failed" in result.stderr and "/nonexistent/python3" in result.stderr


def test_each_run_has_a_private_dir_that_is_removed(monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    code = ("import os\nprint(sorted(os.listdir('.')))\n"
            "open('state.txt', 'a').write('x')\nprint(open('state.txt').read())")
    first, second = run_python(code, config=FAST), run_python(code, config=FAST)
    assert first.stdout == second.stdout  # nothing carried over between runs
    assert first.stdout.splitlines()[1] == "x"
    assert os.listdir(tmp_path) == []


def test_parallel_calls_are_independent():
    code = "import sys, time\nn = int(sys.stdin.read())\nopen('me.txt', 'w').write(str(n))\ntime.sleep(0.2)\n" \
           "print(n * n, open('me.txt').read())"
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda i: run_python(code, stdin=str(i), config=FAST), range(8)))
    assert [r.status for r in results] == ["pass"] * 8
    assert [r.stdout.split() for r in results] == [[str(i * i), str(i)] for i in range(8)]


def test_arguments_override_config():
    result = run_python("while True: pass", timeout_s=0.5, config=FAST)
    assert result.status == "timeout" and result.wall_s < 2.5


@pytest.mark.parametrize("field, value", [("timeout_s", 0), ("memory_mb", 8), ("max_output_bytes", 1),
                                          ("isolation", "docker"), ("max_processes", 0)])
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=f"SandboxConfig.{field}"):
        SandboxConfig(**{field: value})


def test_code_must_be_text():
    with pytest.raises(TypeError, match="must be a str"):
        run_python(b"print(1)")  # type: ignore[arg-type]


def test_capped_buffer_keeps_head_and_tail():
    buf = _CappedBuffer(8, keep_tail=True)
    for chunk in (b"abcd", b"efgh", b"ijkl"):
        buf.feed(chunk)
    assert buf.truncated and buf.total == 12
    assert buf.text() == "abcd\n...[truncated 4 bytes]...\nijkl"
    head_only = _CappedBuffer(5, keep_tail=False)
    head_only.feed(b"0123456789")
    assert head_only.text().startswith("01234\n...[truncated 5 bytes]")


@pytest.mark.parametrize("isolation", ["namespace", "audit"] if namespaces_available() else ["audit"])
def test_stdlib_imports_work_in_every_mode(isolation):
    # Regression: the audit hook once refused listing stdlib package dirs, which broke `import json`.
    code = ("import json, re, collections, itertools, functools, heapq, bisect, math, fractions, decimal, random\n"
            "import datetime, string, typing, dataclasses, statistics, os\n"
            "print(json.dumps(sorted(os.listdir('.'))), statistics.mean([1, 2, 3]))")
    result = run_python(code, config=SandboxConfig(isolation=isolation, timeout_s=10.0, memory_mb=64))
    assert (result.status, result.stdout) == ("pass", '["main.py"] 2\n'), result.stderr


def test_seccomp_filter_builds_for_both_architectures():
    from hybridflow.sandbox.seccomp import DENIED, build_filter

    for machine in ("x86_64", "aarch64"):
        prog = build_filter(machine)
        assert prog is not None and len(prog) % 8 == 0
        assert len(prog) // 8 > len(DENIED)  # one test per denied call, plus the arch / clone / ioctl checks
    assert build_filter("sparc") is None  # unknown: the sandbox runs without a filter and its docs say so
