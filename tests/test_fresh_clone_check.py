"""scripts/fresh_clone_check.py: a clone alone in its folder, and tests that reach outside it named as failures."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("fresh_clone_check", ROOT / "scripts" / "fresh_clone_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_errors_that_point_outside_the_clone_are_picked_out_of_real_pytest_output(tmp_path):
    """A real pytest run (in a subprocess) whose fixture fails the way the suite failed before the sample existed."""
    (tmp_path / "test_x.py").write_text(
        "import pytest\n"
        "@pytest.fixture\n"
        "def data():\n"
        "    pytest.fail(\"GSM8K data not found in ['/c/../shared/data/gsm8k']\")\n"
        "def test_needs_data(data):\n    pass\n"
        "def test_fails_for_another_reason():\n    assert 1 == 2\n"
        "def test_ok():\n    pass\n")
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", str(tmp_path)],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120)
    found = _script().outside_clone_errors(out.stdout)
    assert len(found) == 1 and found[0].startswith("ERROR ") and "test_needs_data" in found[0], out.stdout[-2000:]

