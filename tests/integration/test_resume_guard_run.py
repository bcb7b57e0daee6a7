"""A resumed real run (local backend, the nano model) that would train nothing exits with the reason: the first run
trains every batch of its one epoch and checkpoints; asked for more steps on the same data, the resumed run finds
its loader at the end and stops with RunDidNothingError -- through the CLI, exit code 2 and one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridflow.trainer.resume_guard import RunDidNothingError

from .conftest import run, small_overrides

HERE = Path(__file__).parent
COMMON = ["algorithm.adv_estimator=grpo", f"custom_reward_function.path={HERE / 'reward_fns.py'}",
          "reward_model.num_workers=0", "trainer.save_freq=1", "trainer.total_epochs=1", "data.train_batch_size=32"]


def test_a_resumed_real_run_that_trains_nothing_exits_with_the_reason(nano_model_dir, addition_data, tmp_path):
    out = tmp_path / "run"
    first = run(small_overrides(nano_model_dir, addition_data, out, steps=2, extra=COMMON), out)
    assert [m["training/global_step"] for m in first.metrics if "timing_s/step" in m] == [1.0, 2.0]  # 64 rows / 32
    with pytest.raises(RunDidNothingError, match=r"data ran out at step 2 of trainer.total_training_steps=4: the "
                                                 r"resumed run trained no step"):
        run(small_overrides(nano_model_dir, addition_data, out, steps=4, extra=COMMON), out)

    from hybridflow.trainer.main_ppo import main

    code = main(small_overrides(nano_model_dir, addition_data, out, steps=4, extra=COMMON))
    assert code == 2
