"""``hybridflow generate``: the trainer's validation path as a stand-alone evaluation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import small_overrides

DENSE_REWARD = f"custom_reward_function.path={Path(__file__).with_name('reward_fns.py')}"


@pytest.mark.slow
def test_generate_scores_and_dumps(nano_model_dir, addition_data, tmp_path, capsys):
    from hybridflow.cli import main

    args = small_overrides(nano_model_dir, addition_data, tmp_path, extra=[
        DENSE_REWARD, "reward_model.num_workers=0", "actor_rollout_ref.rollout.val_kwargs.n=2",
        "actor_rollout_ref.rollout.val_kwargs.do_sample=true", "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
        f"trainer.validation_data_dir={tmp_path / 'gen'}"])
    assert main(["generate", *args]) == 0
    rows = [json.loads(line) for line in (tmp_path / "gen" / "0.jsonl").read_text().splitlines()]
    assert len(rows) == 16 * 2 and {"input", "output", "score", "acc"} <= rows[0].keys()
    out = capsys.readouterr().out
    assert "val-core/synthetic/addition/acc/mean@2" in out
