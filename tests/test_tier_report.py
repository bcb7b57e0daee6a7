"""scripts/tier_report.py: a failing part is named with its failing tests, a pytest that died with its last lines."""
from __future__ import annotations

import importlib.util
import io
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _tier_report():
    spec = importlib.util.spec_from_file_location("tier_report", ROOT / "scripts" / "tier_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.a.test_x" name="test_ok" time="2.5"/>
<testcase classname="tests.a.test_x" name="test_bad" time="1.0"><failure message="boom">boom</failure></testcase>
<testcase classname="tests.b.test_y" name="test_err" time="0.5"><error message="fixture">fixture</error></testcase>
</testsuite></testsuites>"""


def test_failing_tests_are_named_and_times_summed(tmp_path):
    (tmp_path / "full-parallel.xml").write_text(JUNIT)
    (tmp_path / "full-parallel.rc").write_text("1\n")
    (tmp_path / "full-parallel.log").write_text("noise\n")
    out = io.StringIO()
    assert _tier_report().report(tmp_path, ["full-parallel"], out) == 1
    text = out.getvalue()
    assert "3 tests, 4 s of test time" in text
    assert "3.5 s     2 tests  tests/a/test_x.py" in text
    assert "FAILED tests/a/test_x.py::test_bad" in text and "FAILED tests/b/test_y.py::test_err" in text
    assert "exit 1, 2 failing test(s)" in text
    assert "noise" not in text  # failing tests named: the log is not repeated


def test_a_pytest_killed_by_a_signal_is_named_with_its_last_lines(tmp_path):
    (tmp_path / "full-serial.xml").write_text(JUNIT.replace('<failure message="boom">boom</failure>', "")
                                              .replace('<error message="fixture">fixture</error>', ""))
    (tmp_path / "full-serial.rc").write_text("134\n")
    (tmp_path / "full-serial.log").write_text("\n".join(f"line {i}" for i in range(100))
                                              + "\nFatal Python error: Aborted\n")
    (tmp_path / "fast-parallel.rc").write_text("0\n")
    (tmp_path / "fast-parallel.xml").write_text(JUNIT)
    out = io.StringIO()
    assert _tier_report().summary(tmp_path, out) == 1
    text = out.getvalue()
    assert "fast-parallel: passed" in text
    assert "full-serial: FAILED: pytest died of SIGABRT (exit 134)" in text
    assert "| Fatal Python error: Aborted" in text and "| line 99" in text and "| line 10\n" not in text


def test_all_parts_passing_is_quiet_and_returns_zero(tmp_path):
    (tmp_path / "vllm.rc").write_text("0\n")
    (tmp_path / "fast-serial.rc").write_text("5\n")
    out = io.StringIO()
    assert _tier_report().summary(tmp_path, out) == 0
    assert "vllm: passed" in out.getvalue() and "fast-serial: no test selected" in out.getvalue()


def test_a_part_without_a_junit_report_shows_its_log(tmp_path):
    (tmp_path / "fast-parallel.rc").write_text("2\n")
    (tmp_path / "fast-parallel.log").write_text("ERROR collecting tests/x.py\nImportError: nope\n")
    out = io.StringIO()
    assert _tier_report().summary(tmp_path, out) == 1
    assert "no JUnit report written" in out.getvalue() and "| ImportError: nope" in out.getvalue()
