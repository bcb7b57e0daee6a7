"""utils/rng_state.py: capture -> draw -> restore -> draw gives the same draws, for every generator; the trainer's
and the engine's checkpoints use this one implementation."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from hybridflow.utils.rng_state import capture_rng_state, restore_rng_state

DRAWS = {
    "python": lambda: [random.random() for _ in range(4)],
    "numpy": lambda: np.random.rand(4).tolist(),
    "torch": lambda: torch.rand(4).tolist(),
}
if torch.cuda.is_available():
    DRAWS["cuda"] = lambda: torch.rand(4, device="cuda").tolist()


@pytest.mark.parametrize("stream", sorted(DRAWS))
def test_restore_replays_the_draws_of_each_generator(stream):
    draw = DRAWS[stream]
    draw()  # the accelerator's runtime is started before the capture, as in a worker that computes on it
    state = capture_rng_state()
    first = draw()
    assert draw() != first  # the stream moves on: an equal draw below is the restore's doing
    restore_rng_state(state)
    assert draw() == first


def test_one_restore_replays_every_generator_together():
    state = capture_rng_state()
    first = [draw() for draw in DRAWS.values()]
    restore_rng_state(state)
    assert [draw() for draw in DRAWS.values()] == first


def test_a_device_this_process_lacks_is_left_alone():
    """A GPU run's checkpoint resumed on a CPU machine: the host streams come back, the absent device is skipped."""
    state = capture_rng_state()
    first = DRAWS["torch"]()
    foreign = "cuda" if not torch.cuda.is_available() else "xpu"
    restore_rng_state({**state, foreign: [torch.zeros(16, dtype=torch.uint8)]})
    assert DRAWS["torch"]() == first


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_single_cuda_state_restores_the_current_device():
    """Engine checkpoints written before the merge hold the current device's state as one tensor."""
    torch.rand(1, device="cuda")
    saved = torch.cuda.get_rng_state()
    first = DRAWS["cuda"]()
    restore_rng_state({**capture_rng_state(), "cuda": saved})
    assert DRAWS["cuda"]() == first


def test_the_checkpoints_share_the_implementation():
    from hybridflow.engine import engine_checkpoint
    from hybridflow.trainer import run_checkpoint

    assert run_checkpoint.capture_rng_state is engine_checkpoint.capture_rng_state is capture_rng_state
    assert run_checkpoint.restore_rng_state is engine_checkpoint.restore_rng_state is restore_rng_state
