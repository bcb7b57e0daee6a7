"""verl's Megatron keys end to end: one GRPO step on Ray with 2 CPU workers on a tensor-parallel (TP=2) and an
expert-parallel (EP=2, a tiny Qwen3-MoE) actor equals the same step on the local backend (one process, unsharded):
the step's metrics, and every parameter of the saved actor within 1e-5.

Sampling is greedy, so both runs score the same responses and the comparison is about the training path: the
megatron node read into the worker's mesh, the vocabulary-parallel log-probs, the all-to-all experts, FSDP2 over
what is left, the checkpoint pieces put back together by ``hybridflow merge``, and -- because a split actor cannot
generate with its own module -- the hf rollout engine's own copy refilled bucket by bucket after the update
(``update_weights/*`` metrics).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from .conftest import run, small_overrides

A = "actor_rollout_ref"
DENSE_REWARD = f"custom_reward_function.path={Path(__file__).with_name('reward_fns.py')}"
COMPARED = ("critic/score/", "critic/advantages/", "response_length/", "actor/pg_loss", "actor/entropy",
            "actor/grad_norm", "actor/kl_loss")
COMMON = [DENSE_REWARD, "custom_reward_function.name=compute_score_spread", "reward_model.num_workers=0",
          "algorithm.adv_estimator=grpo", f"{A}.rollout.n=1", f"{A}.rollout.do_sample=false",
          "trainer.balance_batch=false", f"{A}.actor.ppo_mini_batch_size=8", f"{A}.actor.ppo_micro_batch_size_per_gpu=4",
          f"{A}.actor.use_kl_loss=true", f"{A}.actor.kl_loss_coef=0.1", "trainer.save_freq=1"]
BUCKETS = f"{A}.rollout.checkpoint_engine.update_weights_bucket_megabytes=1"  # acts for a split actor only
LAYOUTS = {
    "tp2": ("nano_model_dir", [f"{A}.actor.strategy=megatron", f"{A}.actor.megatron.tensor_model_parallel_size=2"]),
    # verl 0.9's selector and its spelling of the layout, on a MoE model
    "ep2": ("moe_model_dir", ["model_engine=megatron", f"{A}.actor.megatron.expert_model_parallel_size=2"]),
    # the decoder in two pipeline stages (actor and reference): the update's micro-batches run 1F1B, the
    # log-probs come from the last stage, the rollout copy and the merged checkpoint gather both stages
    "pp2": ("nano_model_dir", [f"{A}.actor.strategy=megatron", f"{A}.actor.megatron.pipeline_model_parallel_size=2"]),
}



@pytest.fixture(scope="module")
def moe_model_dir(tmp_path_factory):
    from hybridflow.utils.tiny_model import make_tiny_checkpoint

    return str(make_tiny_checkpoint(tmp_path_factory.mktemp("moe_model"), size="nano", family="qwen3-moe"))


def _steps(history):
    return [m for m in history.metrics if "timing_s/step" in m]


def _actor_params(out: Path) -> dict[str, torch.Tensor]:
    from hybridflow.cli.merge import load_full_state_dict

    return load_full_state_dict(out / "ckpt" / "global_step_1" / "actor")


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_one_grpo_step_on_a_megatron_layout_equals_the_unsharded_step(layout, ray_cluster, request, addition_data,
                                                                     tmp_path):
    model_fixture, keys = LAYOUTS[layout]
    model = request.getfixturevalue(model_fixture)
    local = run(small_overrides(model, addition_data, tmp_path / "local", backend="local", steps=1, extra=COMMON),
                tmp_path / "local")
    remote = run(small_overrides(model, addition_data, tmp_path / "ray", backend="ray", steps=1,
                                 extra=[*COMMON, *keys, BUCKETS]), tmp_path / "ray")
    (a,), (b,) = _steps(local), _steps(remote)
    keys_compared = [k for k in a if k.startswith(COMPARED)]
    assert keys_compared and a["actor/grad_norm"] > 0
    for key in keys_compared:
        assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-5), key
    # the rollout engine's copy was refilled from the split actor in buckets of at most ~1 MiB (+ one tensor)
    assert "timing_s/update_weights" in b and "update_weights/bytes" in b and "timing_s/update_weights" not in a
    assert b["update_weights/buckets"] >= 1 and b["update_weights/bytes"] > 0
    want, got = _actor_params(tmp_path / "local"), _actor_params(tmp_path / "ray")
    assert set(want) == set(got)
    from hybridflow.engine.model_loader import load_causal_lm

    start = load_causal_lm(model).state_dict()
    step = max(float((want[k] - start[k]).abs().max()) for k in want)
    diff = max(float((want[k] - got[k]).abs().max()) for k in want)
    print(f"\n{layout}: step moved the parameters by up to {step:.3g}; max |param diff| to the unsharded step {diff:.3g}")
    assert step > 1e-4 and diff <= 1e-5
