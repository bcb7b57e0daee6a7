"""verl-named batch metrics on a hand-built 2-sequence batch; every expected number is worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hybridflow.protocol import DataProto
from hybridflow.tracking.metrics import (
    compute_data_metrics,
    compute_memory_metrics,
    compute_rollout_probs_diff_metrics,
    compute_throughput_metrics,
    compute_timing_metrics,
    reduce_metrics,
)


def make_batch(extra_rows: bool = False) -> DataProto:
    """B=2, max prompt 3, max response 4.

    row 0: prompt len 2 (left-padded), response len 4 (= max, clipped), one tool token masked out of the loss
    row 1: prompt len 3 (= max, clipped), response len 2
    """
    prompt_mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    resp_attn = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    tensors = {
        "prompts": torch.tensor([[0, 5, 6], [7, 8, 9]]),
        "responses": torch.tensor([[1, 2, 3, 4], [5, 6, 0, 0]]),
        "attention_mask": torch.cat([prompt_mask, resp_attn], dim=1),
        "response_mask": torch.tensor([[1, 0, 1, 1], [1, 1, 0, 0]]),
        "token_level_scores": torch.tensor([[0.0, 0, 0, 1.0], [0, 0.5, 0, 0]]),
        "token_level_rewards": torch.tensor([[0.0, 0, 0, 0.8], [0, 0.3, 0, 0]]),
        "advantages": torch.tensor([[1.0, 2, 3, 4], [-1, -2, -3, -4]]),
        "returns": torch.tensor([[2.0, 9, 2, 2], [0, 0, 9, 9]]),
        "values": torch.tensor([[1.0, 7, 1, 1], [0, 0, 7, 7]]),
    }
    non_tensors = {"__num_turns__": np.array([2, 4], dtype=object)}
    if extra_rows:  # an aborted rollout: empty response, its score must not count
        tensors = {
            k: torch.cat([v, torch.full_like(v[:1], 0)]) if k not in ("prompts",) else torch.cat([v, v[1:]])
            for k, v in tensors.items()
        }
        tensors["attention_mask"][2, :3] = 1
        tensors["token_level_scores"][2, 0] = -100.0
        non_tensors = {"__num_turns__": np.array([2, 4, 1], dtype=object)}
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)


def test_data_metrics_golden_values():
    m = compute_data_metrics(make_batch(), use_critic=True)
    # score = Σ token_level_scores per sequence = [1.0, 0.5]
    assert m["critic/score/mean"] == pytest.approx(0.75)
    assert (m["critic/score/max"], m["critic/score/min"]) == pytest.approx((1.0, 0.5))
    # rewards = [0.8, 0.3]
    assert m["critic/rewards/mean"] == pytest.approx(0.55)
    assert (m["critic/rewards/max"], m["critic/rewards/min"]) == pytest.approx((0.8, 0.3))
    # masked advantages: [1, 3, 4] and [-1, -2] -> mean 5/5
    adv = (m["critic/advantages/mean"], m["critic/advantages/max"], m["critic/advantages/min"])
    assert adv == pytest.approx((1.0, 4.0, -2.0))
    # masked returns [2, 2, 2, 0, 0]; masked values [1, 1, 1, 0, 0]
    ret = (m["critic/returns/mean"], m["critic/returns/max"], m["critic/returns/min"])
    assert ret == pytest.approx((1.2, 2.0, 0.0))
    assert (m["critic/values/mean"], m["critic/values/max"], m["critic/values/min"]) == pytest.approx((0.6, 1.0, 0.0))
    # Var(returns - values) = Var([1,1,1,0,0]) = 1.2/4 = 0.3 ; Var(returns) = 4.8/4 = 1.2 (unbiased)
    assert m["critic/vf_explained_var"] == pytest.approx(1 - 0.3 / (1.2 + 1e-5), abs=1e-6)
    # lengths from attention_mask: responses [4, 2] (max 4), prompts [2, 3] (max 3)
    resp = (m["response_length/mean"], m["response_length/max"], m["response_length/min"])
    assert resp == pytest.approx((3.0, 4.0, 2.0))
    assert m["response_length/clip_ratio"] == pytest.approx(0.5)
    assert (m["prompt_length/mean"], m["prompt_length/max"], m["prompt_length/min"]) == pytest.approx((2.5, 3.0, 2.0))
    assert m["prompt_length/clip_ratio"] == pytest.approx(0.5)
    assert m["response/aborted_ratio"] == 0.0
    assert (m["num_turns/mean"], m["num_turns/max"], m["num_turns/min"]) == pytest.approx((3.0, 4.0, 2.0))


def test_data_metrics_without_critic_has_no_value_metrics():
    m = compute_data_metrics(make_batch(), use_critic=False)
    assert not any(k.startswith("critic/values") for k in m)
    assert "critic/vf_explained_var" not in m
    assert "critic/score/mean" in m


def test_aborted_rollout_excluded_from_score():
    m = compute_data_metrics(make_batch(extra_rows=True), use_critic=False)
    assert m["response/aborted_ratio"] == pytest.approx(1 / 3)
    assert m["critic/score/min"] == pytest.approx(0.5)  # the aborted row's -100 is ignored
    assert m["response_length/mean"] == pytest.approx(2.0)  # (4 + 2 + 0) / 3
    assert m["response_length_non_aborted/mean"] == pytest.approx(3.0)


def test_data_metrics_missing_key_names_it():
    batch = make_batch()
    batch.batch.pop("advantages")
    with pytest.raises(KeyError, match="advantages"):
        compute_data_metrics(batch, use_critic=False)


def test_timing_metrics_per_token():
    timing = {"gen": 1.2, "update_actor": 2.2, "reward": 0.1, "step": 5.0}
    m = compute_timing_metrics(make_batch(), timing)
    assert m["timing_s/gen"] == 1.2 and m["timing_s/step"] == 5.0 and m["timing_s/reward"] == 0.1
    # gen / response tokens (4 + 2); update_actor / all tokens (6 + 5)
    assert m["timing_per_token_ms/gen"] == pytest.approx(1200 / 6)
    assert m["timing_per_token_ms/update_actor"] == pytest.approx(2200 / 11)
    assert "timing_per_token_ms/reward" not in m and "timing_per_token_ms/step" not in m


def test_throughput_formula():
    batch = make_batch()
    m = compute_throughput_metrics(batch, {"step": 5.0}, n_devices=2)
    # 11 attention-mask tokens / (5 s x 2 devices)
    assert m["perf/total_num_tokens"] == 11
    assert m["perf/time_per_step"] == 5.0
    assert m["perf/throughput"] == pytest.approx(1.1)
    batch.meta_info["global_token_num"] = [10, 20]
    assert compute_throughput_metrics(batch, {"step": 5.0}, n_devices=2)["perf/throughput"] == pytest.approx(3.0)
    with pytest.raises(KeyError, match="step"):
        compute_throughput_metrics(batch, {"gen": 1.0}, n_devices=1)
    with pytest.raises(ValueError, match="n_devices"):
        compute_throughput_metrics(batch, {"step": 1.0}, n_devices=0)


def test_memory_metrics_cpu():
    m = compute_memory_metrics("cpu")
    assert 0.01 < m["perf/cpu_memory_used_gb"] < 64
    assert "perf/max_memory_allocated_gb" not in m


def test_rollout_probs_diff():
    batch = make_batch()
    lp = torch.log(torch.tensor([[0.5, 0.9, 0.2, 0.4], [0.1, 0.3, 0.9, 0.9]]))
    batch.batch["rollout_log_probs"] = lp
    batch.batch["old_log_probs"] = torch.log(torch.tensor([[0.6, 0.1, 0.2, 0.1], [0.1, 0.5, 0.1, 0.1]]))
    m = compute_rollout_probs_diff_metrics(batch)
    # masked |diffs|: row0 [0.1, 0.0, 0.3], row1 [0.0, 0.2]
    assert m["training/rollout_probs_diff_valid"] == 1.0
    assert m["training/rollout_probs_diff_max"] == pytest.approx(0.3, abs=1e-6)
    assert m["training/rollout_probs_diff_mean"] == pytest.approx(0.12, abs=1e-6)
    assert -1.0 <= m["training/rollout_actor_probs_pearson_corr"] <= 1.0


def test_reduce_metrics():
    out = reduce_metrics(
        {"actor/pg_loss": [1.0, 2.0, 3.0], "critic/score/max": [1, 5], "x/min": [3, 1], "actor/grad_norm_max": [2, 7],
         "actor/lr": 0.5, "t": [torch.tensor(1.0), torch.tensor(3.0)]}
    )
    assert out == {
        "actor/pg_loss": 2.0, "critic/score/max": 5.0, "x/min": 1.0,
        "actor/grad_norm_max": 7.0, "actor/lr": 0.5, "t": 2.0,
    }
    with pytest.raises(ValueError, match="empty"):
        reduce_metrics({"a": []})
    assert math.isnan(reduce_metrics({"a": [float("nan"), 1.0]})["a"])


def test_mfu_metrics_from_update_timing():
    from hybridflow.tracking.metrics import FlopsCounter, compute_mfu_metrics

    config = {"hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
              "num_key_value_heads": 1, "vocab_size": 10}
    counter = FlopsCounter(config, device_name="NVIDIA H100")
    m = compute_mfu_metrics(make_batch(), {"update_actor": 2.0, "gen": 1.0}, {"actor": counter, "critic": counter},
                            n_devices=1, ppo_epochs=2)
    # sequences of 6 and 5 tokens, N = 1312 (see test_flops): (6*1312*11 + 6*(36+25)*2*2*4) / 2 s, x2 epochs
    assert m == {"perf/mfu/actor": pytest.approx((86592 + 5856) / 2.0 * 2 / 989e12)}


def test_clip_ratio_counts_only_responses_cut_without_eos():
    batch = make_batch()  # row 0 fills the 4 slots and ends with token 4; row 1 is short
    assert compute_data_metrics(batch, use_critic=False, eos_token_ids=[9])["response_length/clip_ratio"] == 0.5
    # the same full-length row ending with EOS finished on its own: not clipped
    m = compute_data_metrics(batch, use_critic=False, eos_token_ids=[4])
    assert m["response_length/clip_ratio"] == 0.0 and m["response_length_non_aborted/clip_ratio"] == 0.0
    assert compute_data_metrics(batch, use_critic=False, eos_token_ids=[None])["response_length/clip_ratio"] == 0.5


def test_zero_variance_group_fraction():
    from hybridflow.trainer.dynamic_sampling import GroupFilterAccumulator, zero_variance_fraction

    scores = torch.tensor([[1.0], [1.0], [0.0], [1.0], [0.0], [0.0]])  # groups: all-1, mixed, all-0
    batch = DataProto.from_dict({"token_level_scores": scores, "token_level_rewards": scores},
                                {"uid": np.array(["a", "a", "b", "b", "c", "c"], dtype=object)})
    assert zero_variance_fraction(batch, "seq_reward") == pytest.approx(2 / 3)
    acc = GroupFilterAccumulator(target_prompts=1, n=2, metric="seq_reward", max_num_gen_batches=0)
    acc.add(batch)
    assert acc.metrics()["train/zero_variance_group_fraction"] == pytest.approx(2 / 3)
