"""A run's console carries hybridflow's lines: no library progress bars, no library FutureWarnings."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = r"""
import warnings, sys
from hybridflow.utils.quiet import quiet_libraries
quiet_libraries()
from hybridflow.utils.tiny_model import make_tiny_checkpoint
from hybridflow.engine.model_loader import load_causal_lm
path = make_tiny_checkpoint(sys.argv[1], size="nano")
model = load_causal_lm(str(path))
import transformers.modeling_utils as mu
warnings.warn_explicit("internal rename", FutureWarning, mu.__file__, 1, module="transformers.modeling_utils")
warnings.warn("a user's own deprecation", FutureWarning)
print("done")
"""


def _run(tmp_path, env_extra):
    import os

    env = {**os.environ, **env_extra}
    env.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "m")], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout + out.stderr


def test_progress_bars_and_library_future_warnings_are_silenced(tmp_path):
    console = _run(tmp_path, {})
    assert "Loading weights" not in console and "Writing model shards" not in console
    assert "internal rename" not in console
    assert "a user's own deprecation" in console  # the user's warnings stay
    assert "done" in console


def test_verbose_switch_brings_them_back(tmp_path):
    console = _run(tmp_path, {"HYBRIDFLOW_VERBOSE_LIBRARIES": "1"})
    assert "Loading weights" in console and "internal rename" in console
