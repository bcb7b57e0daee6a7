"""rollout.exact_log_probs end to end (local backend, CPU fp32): by default (null: exact where it can be) the rollout's
log-probs equal the actor's recomputation bit for bit (training/rollout_probs_diff_max == 0.0), so the old_log_prob
pass is skipped even with several mini-batches; with exact_log_probs=false the same run recomputes pi_old and measures
the mismatch."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import run, small_overrides

HERE = Path(__file__).parent
COMMON = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.calculate_log_probs=true",
          f"custom_reward_function.path={HERE / 'reward_fns.py'}", "reward_model.num_workers=0"]


def _steps(tmp_path, name, model, data, extra):
    out = tmp_path / name
    history = run(small_overrides(model, data, out, backend="local", steps=2, extra=COMMON + extra), out)
    return [m for m in history.metrics if "timing_s/step" in m]


@pytest.mark.slow
def test_exact_log_probs_make_the_rollout_pi_old(nano_model_dir, addition_data, tmp_path):
    exact = _steps(tmp_path, "exact", nano_model_dir, addition_data, [])  # the default
    today = _steps(tmp_path, "today", nano_model_dir, addition_data, ["actor_rollout_ref.rollout.exact_log_probs=false"])
    assert len(exact) == len(today) == 2
    for m in exact:  # two mini-batches per step, yet no old_log_prob pass: the rollout's log-probs are pi_old
        assert "timing_s/old_log_prob" not in m
        assert m["training/rollout_probs_diff_max"] == 0.0
        assert m["actor/grad_norm"] > 0
    for m in today:  # the actor recomputes pi_old (torch's kernels: equal to ~1e-7, bit for bit only by chance)
        assert "timing_s/old_log_prob" in m
        assert 0.0 <= m["training/rollout_probs_diff_max"] < 1e-3
