"""rollout.exact_log_probs end to end (local backend, CPU fp32): by default (null: exact where it can be) the rollout's
log-probs equal the actor's recomputation bit for bit (training/rollout_probs_diff_max == 0.0), so the old_log_prob
pass is skipped even with several mini-batches; with exact_log_probs=false the same run recomputes pi_old and measures
the mismatch."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridflow.config.errors import ConfigError
from hybridflow.launch.config import check_for_run, load_config
from hybridflow.trainer.drift_levels import MEASURED_LEVELS

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
        # the drift detector judges it by the exact levels (any gap warns) and the healthy default never trips them
        assert m["drift/warn_level"] == MEASURED_LEVELS[("hf", "fp32", True)][0] and m["drift/tripped"] == 0.0
    for m in today:  # the actor recomputes pi_old (torch's kernels: equal to ~1e-7, bit for bit only by chance)
        assert "timing_s/old_log_prob" in m
        assert 0.0 <= m["training/rollout_probs_diff_max"] < 1e-3


STANDALONE = ["actor_rollout_ref.hybrid_engine=false", "rollout.nnodes=1", "rollout.n_gpus_per_node=1"]


def _resolved(tmp_path, model, data, extra):
    cfg = load_config(small_overrides(model, data, tmp_path / "out", backend="local", extra=COMMON + extra))
    check_for_run(cfg)
    return cfg.actor_rollout_ref.rollout.exact_log_probs


def test_the_default_is_exact_for_the_colocated_engine_only(nano_model_dir, addition_data, tmp_path):
    assert _resolved(tmp_path, nano_model_dir, addition_data, []) is True
    # standalone replicas (their own copy of the model): not bit for bit -- the default turns it off,
    # and the drift detector keeps the non-exact levels
    assert _resolved(tmp_path, nano_model_dir, addition_data, STANDALONE) is False
    with pytest.raises(ConfigError, match="exact_log_probs=true.*standalone rollout replicas"):
        _resolved(tmp_path, nano_model_dir, addition_data, STANDALONE + ["actor_rollout_ref.rollout.exact_log_probs=true"])
