"""Keep a run's console for hybridflow's own lines: library progress bars and deprecation chatter off.

What is silenced is what a user cannot act on: the per-load "Loading weights" and per-save "Writing model
shards" progress bars of transformers / huggingface_hub (a run loads and saves models many times), and
``FutureWarning``s raised inside transformers, peft and accelerate about their own internals (e.g. peft
calling a transformers method that transformers has renamed).  Warnings that concern the user's inputs
(transformers' ``logging`` messages about missing weights, a tokenizer without a chat template, ...) are
untouched.  Set ``HYBRIDFLOW_VERBOSE_LIBRARIES=1`` to see everything.

Called once per process: by the command-line entry points and by every worker process
(:class:`hybridflow.controller.worker.Worker`), so Ray workers are as quiet as the driver.
"""

from __future__ import annotations

import os
import sys
import warnings

__all__ = ["QUIET_ENV", "quiet_libraries"]

# read by huggingface_hub and by transformers' progress bars when they are first imported
QUIET_ENV = {"HF_HUB_DISABLE_PROGRESS_BARS": "1"}
_LIBRARY_MODULES = r"(transformers|peft|accelerate)(\.|$)"


def quiet_libraries() -> None:
    if os.environ.get("HYBRIDFLOW_VERBOSE_LIBRARIES", "") not in ("", "0"):
        return
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    if "transformers" in sys.modules:  # imported before us: its progress-bar switch was already read
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    warnings.filterwarnings("ignore", category=FutureWarning, module=_LIBRARY_MODULES)
