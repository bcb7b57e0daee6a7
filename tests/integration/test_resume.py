"""Exact resume: stop after step k, resume, and steps k+1.. match an uninterrupted run (also across epochs)."""

from __future__ import annotations


from pathlib import Path

import pytest

from hybridflow.trainer import run_checkpoint as ckpt

from .conftest import run, small_overrides

DENSE_REWARD = f"custom_reward_function.path={Path(__file__).with_name('reward_fns.py')}"
VOLATILE = ("timing_s/", "timing_per_token_ms/", "perf/")


def _stable(metrics):
    return [{k: v for k, v in m.items() if not k.startswith(VOLATILE)} for m in metrics if "timing_s/step" in m]


def _stop_after(k):
    calls = {"n": 0}

    def should_stop():
        calls["n"] += 1
        return calls["n"] >= k

    return should_stop


@pytest.fixture(scope="module")
def tiny_epoch_data(tmp_path_factory):
    """16 prompts = 2 steps of 8 per epoch, so step 2 ends epoch 0."""
    from hybridflow.data.synthetic import write_synthetic

    d = tmp_path_factory.mktemp("epoch_data")
    write_synthetic("addition", str(d), train_size=16, test_size=8, seed=3)
    return d


ADAPTIVE_KL = ["algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive", "algorithm.kl_ctrl.kl_coef=0.05",
               "algorithm.kl_ctrl.target_kl=0.001", "algorithm.kl_ctrl.horizon=10"]


@pytest.mark.slow
@pytest.mark.parametrize("data_name,stop_at,kl", [("addition_data", 2, ["actor_rollout_ref.actor.use_kl_loss=true"]),
                                                   ("tiny_epoch_data", 2, ["actor_rollout_ref.actor.use_kl_loss=true"]),
                                                   ("addition_data", 3, ADAPTIVE_KL)])
def test_resumed_run_matches_uninterrupted(request, nano_model_dir, data_name, stop_at, kl, tmp_path):
    data = request.getfixturevalue(data_name)
    extra = [DENSE_REWARD, "reward_model.num_workers=0", "algorithm.adv_estimator=grpo", *kl,
             "trainer.save_freq=1", "trainer.max_actor_ckpt_to_keep=2"]
    full_dir, part_dir = tmp_path / "full", tmp_path / "part"
    full = run(small_overrides(nano_model_dir, data, full_dir, steps=4, extra=extra), full_dir)
    first = run(small_overrides(nano_model_dir, data, part_dir, steps=4, extra=extra), part_dir,
                should_stop=_stop_after(stop_at))
    assert [m["step"] for m in _stable(first.metrics)] == list(range(1, stop_at + 1))
    assert ckpt.completed_steps(part_dir / "ckpt") == [stop_at - 1, stop_at]
    resumed = run(small_overrides(nano_model_dir, data, part_dir, steps=4, extra=extra), part_dir)
    expected, got = _stable(full.metrics)[stop_at:], _stable(resumed.metrics)
    assert [m["step"] for m in got] == [m["step"] for m in expected] == list(range(stop_at + 1, 5))
    for e, g in zip(expected, got):
        assert e.keys() == g.keys()
        for key in e:
            assert g[key] == pytest.approx(e[key], rel=1e-5, abs=1e-6), key
    assert ckpt.completed_steps(part_dir / "ckpt") == [3, 4]  # keep-last-2 rotation
    if kl is ADAPTIVE_KL:  # the adaptive controller's beta moved and was restored, not reset
        coeffs = [m["actor/reward_kl_penalty_coeff"] for m in _stable(full.metrics)]
        assert len(set(coeffs)) == len(coeffs)
    if data_name == "tiny_epoch_data":
        assert [m["training/epoch"] for m in got] == [1.0, 1.0]
