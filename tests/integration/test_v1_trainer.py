"""verl 0.9's V1 trainer end to end (local backend): ``trainer.use_v1=true`` with ``trainer.v1.trainer_mode`` sync,
colocate_async and separate_async -- the replay buffer's rules acting, the staleness bound, resume."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch

from .conftest import run, small_overrides

HERE = Path(__file__).parent
REWARD = [f"custom_reward_function.path={HERE / 'reward_fns.py'}", "reward_model.num_workers=0"]
GRPO = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.calculate_log_probs=true",
        "actor_rollout_ref.rollout.agent.num_workers=2", "data.max_response_length=8", *REWARD]
LOOPS = [f"actor_rollout_ref.rollout.agent.agent_loop_config_path={HERE / 'async_loops' / 'v1_loops.yaml'}"]
V1 = ["trainer.use_v1=true"]
COLOCATE = V1 + ["trainer.v1.trainer_mode=colocate_async"]
SEPARATE = V1 + ["trainer.v1.trainer_mode=separate_async", "actor_rollout_ref.hybrid_engine=false",
                 "actor_rollout_ref.rollout.free_cache_engine=false"]
VOLATILE = ("timing_s/", "timing_per_token_ms/", "perf/", "memory/")


def _runs(tmp_path, name, model, data, steps, extra, should_stop=None):
    out = tmp_path / name
    return run(small_overrides(model, data, out, backend="local", steps=steps, extra=extra), out,
               should_stop=should_stop)


def _steps(history):
    return [m for m in history.metrics if "timing_s/step" in m]


def _actor_state(out_dir: Path, step: int) -> dict[str, torch.Tensor]:
    files = list((out_dir / "ckpt" / f"global_step_{step}" / "actor").glob("model_world_size_1_rank_0.pt"))
    assert files, f"no actor checkpoint under {out_dir}"
    return torch.load(files[0], weights_only=False)


@pytest.mark.slow
def test_v1_sync_is_the_synchronous_trainer_bit_for_bit(nano_model_dir, addition_data, tmp_path):
    """use_v1=true with trainer_mode=sync trains exactly what use_v1=false trains: same metrics, same weights."""
    common = GRPO + ["custom_reward_function.name=compute_score_spread", "trainer.save_freq=3"]
    today = _runs(tmp_path, "today", nano_model_dir, addition_data, 3, common)
    v1 = _runs(tmp_path, "v1", nano_model_dir, addition_data, 3, common + V1)
    a = [{k: v for k, v in m.items() if not k.startswith(VOLATILE)} for m in _steps(today)]
    b = [{k: v for k, v in m.items() if not k.startswith(VOLATILE)} for m in _steps(v1)]
    assert len(a) == 3 and a == b  # exact equality, not a tolerance
    assert all(m["actor/grad_norm"] > 0 for m in a)
    sa, sb = _actor_state(tmp_path / "today", 3), _actor_state(tmp_path / "v1", 3)
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.slow
def test_v1_sync_evicts_and_refills_failed_and_filtered_groups(nano_model_dir, addition_data, tmp_path):
    """sync_refill_failed_groups: a group whose loop raised is replaced by a fresh prompt; DAPO filtering evicts
    groups whose samples all score the same.  Without the key, failed groups are trained as before."""
    common = GRPO + LOOPS + ["actor_rollout_ref.rollout.agent.default_agent_loop=flaky",
                             "custom_reward_function.name=compute_score_half_constant"]
    kept = _runs(tmp_path, "kept", nano_model_dir, addition_data, 2, common + V1)
    assert any(t["failed"] for t in kept.trained) is False  # nothing refilled: the plain step, no buffer history
    assert all(m["agent/error_count"] > 0 for m in _steps(kept))  # ... and it trained on the failed groups
    refilled = _runs(tmp_path, "refilled", nano_model_dir, addition_data, 3, common + V1 + [
        "trainer.v1.sampler.sync_refill_failed_groups=true", "algorithm.filter_groups.enable=true",
        "algorithm.filter_groups.metric=seq_reward"])
    steps = _steps(refilled)
    assert len(refilled.trained) == 3 * 8 and not any(t["failed"] for t in refilled.trained)
    assert sum(m.get("training/rollout_failure/evicted_samples", 0) for m in steps) > 0
    assert sum(m.get("training/filter_groups/evicted_samples", 0) for m in steps) > 0
    assert all(m["train/num_gen_batches"] >= 2 for m in steps)
    reasons = Counter(e["reason"] for e in refilled.evicted)
    assert reasons["failed"] > 0 and reasons["filtered"] > 0
    trained = {t["ordinal"] for t in refilled.trained}
    assert not trained & {e["ordinal"] for e in refilled.evicted}  # an evicted group is never trained


SLOW_TRAINER = ["custom_reward_function.name=compute_score_slow_trainer"]
SLOW_TAIL = LOOPS + ["actor_rollout_ref.rollout.agent.default_agent_loop=slow_turns"]
STALENESS_CASES = {  # mode, strategy, warm-up batches, threshold, extra
    "colocate_drop": (COLOCATE, "drop", 2, 2, SLOW_TRAINER),
    "colocate_wait": (COLOCATE, "wait", 1, 2, SLOW_TRAINER + SLOW_TAIL),
    "separate_drop": (SEPARATE, "drop", 2, 2, SLOW_TRAINER + ["trainer.v1.separate_async.parameter_sync_step=2"]),
    "separate_wait": (SEPARATE, "wait", 1, 2, SLOW_TRAINER + SLOW_TAIL + ["trainer.v1.separate_async.parameter_sync_step=2"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(STALENESS_CASES))
def test_v1_async_staleness_never_exceeds_the_threshold(case, nano_model_dir, addition_data, tmp_path):
    """A trainer slower than the rollout (20 ms a sample to score) lets finished groups queue up: with ``drop``
    those past the threshold are evicted and refilled, with ``wait`` nothing is evicted and sampling waits for
    slow groups at the threshold.  Either way no group is trained more than ``threshold`` steps after it was
    submitted, and every trajectory's version stamps are logged."""
    mode, strategy, warmup, threshold, extra = STALENESS_CASES[case]
    name = mode[1].split("=")[1]
    history = _runs(tmp_path, case, nano_model_dir, addition_data, 6, GRPO + mode + extra + [
        f"trainer.v1.{name}.num_warmup_batches={warmup}", f"trainer.v1.sampler.max_off_policy_strategy={strategy}",
        f"trainer.v1.sampler.max_off_policy_threshold={threshold}"])
    ages = [t["step"] - t["submit_step"] + 1 for t in history.trained]
    assert len(ages) == 6 * 8 and max(ages) <= threshold
    steps = _steps(history)
    assert max(m["training/off_policy/sample_age/max"] for m in steps) <= threshold
    for t in history.trained:
        assert t["version_start"] <= t["version_end"] <= t["step"] - 1
    stale = [e for e in history.evicted if e["reason"] == "stale"]
    if strategy == "drop":
        assert stale and sum(m.get("training/off_policy/evicted_samples", 0) for m in steps) == len(stale)
        assert all(e["step"] - 2 >= 0 for e in stale)
    else:
        assert not stale and max(ages) == threshold  # waited for, trained at the threshold, not dropped
    trained = Counter(t["ordinal"] for t in history.trained)
    assert max(trained.values()) == 1 and not set(trained) & {e["ordinal"] for e in history.evicted}
    assert all("training/off_policy/trajectory_staleness_worst/max" in m for m in steps)


@pytest.mark.slow
def test_v1_colocate_continues_interrupted_trajectories_on_the_new_weights(nano_model_dir, addition_data, tmp_path):
    """Generation is interrupted for every update and resumed after it: slow trajectories straddle updates
    (their versions span two or more), and the run trains every step's batch."""
    history = _runs(tmp_path, "colocate", nano_model_dir, addition_data, 5, GRPO + COLOCATE + SLOW_TAIL + [
        "custom_reward_function.name=compute_score_spread", "trainer.test_freq=2", "trainer.val_before_train=true"])
    steps = _steps(history)
    assert len(steps) == 5 and all(m["actor/grad_norm"] > 0 for m in steps)
    assert max(m["training/off_policy/trajectory_spans/max"] for m in steps) >= 2
    assert any(t["version_end"] > t["version_start"] for t in history.trained)
    assert [m["step"] for m in history.metrics if "val/num_samples" in m] == [0, 2, 4, 5]


@pytest.mark.slow
def test_v1_separate_async_shares_one_pi_old_per_weight_version(nano_model_dir, addition_data, tmp_path):
    """separate_async trains two mini-batches per weight version; pi_old of the second is computed with the
    version's weights (decoupled PPO), which sampled it, not with the weights the first mini-batch moved."""
    history = _runs(tmp_path, "separate", nano_model_dir, addition_data, 3, GRPO + SEPARATE + [
        "custom_reward_function.name=compute_score_spread", "trainer.v1.separate_async.parameter_sync_step=2",
        "trainer.v1.separate_async.num_warmup_batches=0", "actor_rollout_ref.actor.optim.lr=5e-2"])
    steps = _steps(history)
    assert len(steps) == 3
    for m in steps:  # the rollout's log-probs and the recomputed pi_old: the same weights, so a rounding apart
        assert m["training/rollout_probs_diff_max"] < 1e-3, m["training/rollout_probs_diff_max"]
        assert m["training/off_policy/trajectory_staleness_worst/max"] == 0


@pytest.mark.slow
def test_v1_resume_loses_and_duplicates_nothing(nano_model_dir, addition_data, tmp_path):
    """Stopped after step 3 (groups in flight and queued abandoned, some evicted) and resumed to step 6: no prompt
    is trained twice or trained after it was evicted, and every prompt of the stream up to the last one touched
    was trained or evicted exactly once."""
    extra = GRPO + COLOCATE + SLOW_TRAINER + ["trainer.save_freq=1", "trainer.v1.colocate_async.num_warmup_batches=2",
                                              "trainer.v1.sampler.max_off_policy_threshold=2"]
    done: list[int] = []
    first = _runs(tmp_path, "resumed", nano_model_dir, addition_data, 6, extra,
                  should_stop=lambda: done.append(1) or len(done) >= 3)
    second = _runs(tmp_path, "resumed", nano_model_dir, addition_data, 6, extra)
    assert [m["step"] for m in _steps(second)] == [4, 5, 6]
    trained = [t["ordinal"] for t in first.trained + second.trained]
    evicted = [e["ordinal"] for e in first.evicted + second.evicted]
    assert len(trained) == 6 * 8 and Counter(trained).most_common(1)[0][1] == 1
    assert not set(trained) & set(evicted) and Counter(evicted).most_common(1)[0][1] == 1 if evicted else True
    assert first.abandoned and set(first.abandoned) <= set(trained) | set(evicted) | set(second.abandoned)
    touched = set(trained) | set(evicted)
    below = [o for o in range(max(touched)) if o not in set(second.abandoned)]
    assert set(below) <= touched  # nothing lost
