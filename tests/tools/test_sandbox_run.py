"""Ordinary sandbox behaviour: statuses, stdin/stdout, private working dirs, parallel calls, config errors.
(Escape attempts live in tests/faults/test_sandbox.py.)"""

from __future__ import annotations

import json
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor

import pytest

from hybridflow.sandbox.runner import _CappedBuffer
from hybridflow.sandbox import (
    SandboxConfig,
    SandboxResult,
    available_isolations,

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


@pytest.mark.parametrize("mode", available_isolations())
def test_every_mode_runs_the_program_under_the_same_resource_limits(mode, tmp_path):
    """One definition (supervisor.rlimits) for the OS modes' supervisor and the audit launcher (issue 34: the block
    was written twice)."""
    import resource

    from hybridflow.sandbox.runner import build_spec
    from hybridflow.sandbox.supervisor import rlimits

    config = SandboxConfig(isolation=mode, timeout_s=7.0, memory_mb=300, disk_mb=9, max_open_files=77)
    names = ("RLIMIT_CPU", "RLIMIT_AS", "RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_CORE")
    result = run_python("import resource\n" + "".join(f"print(list(resource.getrlimit(resource.{n})))\n"
                                                      for n in names), config=config)
    assert result.status == "pass", result.stderr
    expected = rlimits(build_spec(config, mode, str(tmp_path)))
    assert [list(expected[getattr(resource, n)]) for n in names] == \
        [json.loads(line) for line in result.stdout.splitlines()]
    mib = 1024 * 1024
    assert expected[resource.RLIMIT_CPU] == (7, 8) and expected[resource.RLIMIT_AS] == (300 * mib, 300 * mib)
    assert expected[resource.RLIMIT_FSIZE] == (9 * mib, 9 * mib) and expected[resource.RLIMIT_NOFILE] == (77, 77)


def _run_bpf(program: bytes, nr: int, arch: int, args: tuple[int, ...] = (0, 0)) -> int:
    """A classic-BPF interpreter for the instructions the filter uses; returns the verdict for one system call."""
    import struct

    ins = [struct.unpack("=HBBI", program[i:i + 8]) for i in range(0, len(program), 8)]
    data = struct.pack("=iIQ6Q", nr, arch, 0, *(list(args) + [0] * (6 - len(args))))
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = ins[pc]
        pc += 1
        if code == 0x20:
            acc = struct.unpack_from("=I", data, k)[0]
        elif code == 0x54:
            acc &= k
        elif code in (0x15, 0x35):
            pc += jt if (acc == k if code == 0x15 else acc >= k) else jf
        elif code == 0x06:
            return k
        else:
            raise AssertionError(f"unexpected instruction {code:#x}")


def test_seccomp_filter_verdicts():
    from hybridflow.sandbox.seccomp import build_filter

    prog, x86 = build_filter("x86_64"), 0xC000003E
    allow, eperm, enosys, kill = 0x7FFF0000, 0x00050001, 0x00050026, 0x80000000
    assert _run_bpf(prog, 0, x86) == allow  # read
    assert _run_bpf(prog, 101, x86) == eperm  # ptrace
    assert _run_bpf(prog, 323, x86) == eperm  # userfaultfd
    assert _run_bpf(prog, 435, x86) == enosys  # clone3: its flags cannot be read
    assert _run_bpf(prog, 56, x86, (0x01200011,)) == allow  # clone as fork does
    assert _run_bpf(prog, 56, x86, (0x10000000,)) == eperm  # clone(CLONE_NEWUSER)
    assert _run_bpf(prog, 16, x86, (1, 0x5412)) == eperm  # ioctl(TIOCSTI)
    assert _run_bpf(prog, 16, x86, (1, 0x5401)) == allow  # ioctl(TCGETS)
    assert _run_bpf(prog, 0x40000000, x86) == eperm  # an x32 system call
    assert _run_bpf(prog, 0, 0xC00000B7) == kill  # another architecture's ABI
    arm = build_filter("aarch64")
    assert _run_bpf(arm, 117, 0xC00000B7) == eperm and _run_bpf(arm, 63, 0xC00000B7) == allow  # ptrace, read
