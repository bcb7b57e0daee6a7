"""The PPO step's control flow with fake worker groups: no model, no process, no engine.

The fakes answer each worker call the way the real roles do (the batch keys of docs/architecture.md) and record
the calls, so the order of the stages, what each one adds to the batch, which stages a configuration skips and
the golden values of the controller-side arithmetic are checked in milliseconds. The end-to-end runs
(tests/integration/) keep checking that the real workers honour the same contract.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from hybridflow.launch.config import load_config
from hybridflow.trainer import run_checkpoint as ckpt
from hybridflow.trainer.controller import RLController
from hybridflow.trainer.stages import WorkerGroups
from hybridflow.trainer.step_failures import StepFailedError
from fake_groups import (
    TOKENIZER,
    FakeActor,
    FakeCritic,
    FakeRollout,
    R,
    Recorder,
    config_overrides,
    prompts,
    reward_first_token_zero,
)

A = "actor_rollout_ref"


def make_trainer(tmp_path, extra=(), n=2, b=2, steps=1, moves=False, log_probs=False, critic=False, mini=1):
    """``mini`` < ``b``: two updates per step, so pi_old needs its own pass (``mini=b``: it comes from the update)."""
    if not any(e.startswith("algorithm.adv_estimator=") for e in extra):
        extra = ["algorithm.adv_estimator=grpo", *extra]
    cfg = load_config([*config_overrides(tmp_path, n=n, b=b, steps=steps, mini=mini), *extra])
    rec = Recorder()
    actor = FakeActor(rec)
    groups = WorkerGroups(actor_rollout=actor, ref=actor, critic=FakeCritic(rec) if critic else None,
                          rollout=FakeRollout(rec, n, moves=moves, log_probs=log_probs))
    loader = [prompts(b) for _ in range(steps + 2)]
    trainer = RLController(cfg, TOKENIZER, groups, loader, None, reward_first_token_zero, reward_first_token_zero)
    return trainer, rec


def test_grpo_step_runs_the_stages_in_order_with_golden_advantages(tmp_path):
    trainer, rec = make_trainer(tmp_path, moves=True)
    history = trainer.fit()
    assert rec.calls == ["generate", "compute_log_prob", "update_actor", "update_weights"]
    trained = rec.seen["update_actor"]
    # the prompt batch was repeated interleaved: rows 0,1 are prompt 0's two samples (one uid)
    assert list(trained.non_tensor_batch["uid"][:2]) == [trained.non_tensor_batch["uid"][0]] * 2
    assert trained.non_tensor_batch["uid"][0] != trained.non_tensor_batch["uid"][2]
    # GRPO: each group scores (1, 0); (s - mean) / (std + eps) with the unbiased std 0.7071 -> +-0.70710
    adv = trained.batch["advantages"]
    assert adv[:, 0].tolist() == pytest.approx([0.70710, -0.70710] * 2, abs=1e-4)
    assert torch.equal(adv[:, 0], adv[:, 1])  # an outcome advantage is the same on every token
    assert torch.equal(trained.batch["old_log_probs"], torch.full((4, R), -0.4))
    m = history.metrics[-1]
    assert m["actor/pg_loss"] == pytest.approx(0.375) and m["actor/entropy"] == pytest.approx(1.5)
    assert m["timing_s/update_weights"] == 0.25 and "timing_s/ref" not in m and "timing_s/values" not in m
    assert m["critic/score/mean"] == pytest.approx(0.5) and m["reward_extra/acc/mean"] == pytest.approx(0.5)


def test_a_single_on_policy_update_takes_pi_old_from_its_own_pass(tmp_path):
    trainer, rec = make_trainer(tmp_path, mini=2)
    m = trainer.fit().metrics[-1]
    assert rec.calls == ["generate", "update_actor", "update_weights"] and "timing_s/old_log_prob" not in m
    assert rec.seen["update_actor"].meta_info["old_log_probs_from_update"] is True


def test_a_colocated_engine_that_moves_nothing_logs_no_weight_sync_time(tmp_path):
    trainer, rec = make_trainer(tmp_path, moves=False)
    m = trainer.fit().metrics[-1]
    assert "update_weights" in rec.calls and "timing_s/update_weights" not in m


def test_kl_loss_adds_the_reference_pass_and_kl_in_reward_subtracts_the_penalty(tmp_path):
    trainer, rec = make_trainer(tmp_path, extra=[f"{A}.actor.use_kl_loss=true"])
    trainer.fit()
    assert rec.calls[:3] == ["generate", "compute_log_prob", "compute_ref_log_prob"]
    assert "ref_log_prob" in rec.seen["update_actor"].batch

    trainer, rec = make_trainer(tmp_path, extra=["algorithm.use_kl_in_reward=true", "algorithm.kl_penalty=kl",
                                                 "algorithm.kl_ctrl.kl_coef=0.5", "algorithm.adv_estimator=reinforce_plus_plus"])
    trainer.fit()
    batch = rec.seen["update_actor"]
    # token_level_rewards = scores - beta * (old - ref) = scores - 0.5 * (-0.4 + 0.6)
    expected = batch.batch["token_level_scores"] - 0.1
    assert torch.allclose(batch.batch["token_level_rewards"], expected, atol=1e-6)


def test_gae_runs_the_critic_and_the_warmup_step_trains_it_alone(tmp_path):
    trainer, rec = make_trainer(tmp_path, critic=True, steps=2, moves=True,
                                extra=["algorithm.adv_estimator=gae", "trainer.critic_warmup=1"])
    history = trainer.fit()
    step1 = rec.calls[:rec.calls.index("generate", 1)]
    assert step1 == ["generate", "compute_log_prob", "compute_values", "update_critic"]
    assert rec.calls[len(step1):] == ["generate", "compute_log_prob", "compute_values", "update_critic",
                                      "update_actor", "update_weights"]
    assert "actor/pg_loss" not in history.metrics[0] and history.metrics[1]["actor/pg_loss"] == pytest.approx(0.375)
    # gamma = lam = 1, values 0: the return of every token is the final score
    batch = rec.seen["update_actor"]
    assert torch.equal(batch.batch["returns"][:, 0], batch.batch["token_level_scores"][:, -1])


def test_rollout_log_probs_replace_the_old_log_prob_pass_when_the_step_is_on_policy(tmp_path):
    # (the drift detector, off here, recomputes a few rows for its own check: tests/trainer/test_drift.py)
    trainer, rec = make_trainer(tmp_path, log_probs=True, mini=2, extra=[f"{A}.rollout.calculate_log_probs=true",
                                                                       "trainer.drift.enable=false"])
    assert trainer.plan.reuse_rollout_log_probs
    m = trainer.fit().metrics[-1]
    assert "compute_log_prob" not in rec.calls and "timing_s/old_log_prob" not in m
    assert torch.equal(rec.seen["update_actor"].batch["old_log_probs"], torch.full((4, R), -0.5))


def test_remax_generates_a_greedy_baseline_per_prompt(tmp_path):
    trainer, rec = make_trainer(tmp_path, extra=["algorithm.adv_estimator=remax", f"{A}.rollout.val_kwargs.do_sample=false"])
    m = trainer.fit().metrics[-1]
    assert rec.calls[:2] == ["generate", "gen_max"] and "timing_s/gen_max" in m
    # the greedy answer starts with token 0 (score 1): baseline 1 for every row; advantages = score - 1
    batch = rec.seen["update_actor"]
    assert batch.batch["reward_baselines"].tolist() == [1.0] * 4
    assert batch.batch["advantages"][:, 0].tolist() == pytest.approx([0.0, -1.0, 0.0, -1.0])


def test_a_rollout_that_returns_a_wrong_row_count_stops_the_step(tmp_path):
    trainer, rec = make_trainer(tmp_path)
    trainer.groups.rollout.rows_per_prompt = 2
    trainer.groups.rollout.n = 2
    gen = trainer.groups.rollout.generate_sequences

    def one_row_short(p):
        out = gen(p)
        return out[: len(out) - 1]

    trainer.groups.rollout.generate_sequences = one_row_short
    with pytest.raises(RuntimeError, match="not a multiple"):
        trainer.fit()


def test_dapo_filtering_generates_again_until_enough_groups_have_signal(tmp_path):
    trainer, rec = make_trainer(tmp_path, extra=["algorithm.filter_groups.enable=true",
                                                 "algorithm.filter_groups.metric=acc",
                                                 "algorithm.filter_groups.max_num_gen_batches=3"])
    # the first generation gives every sample token 0 (all groups score 1,1: no variance); then the normal one
    gen = trainer.groups.rollout.generate_sequences
    state = {"calls": 0}

    def flat_then_normal(p):
        state["calls"] += 1
        out = gen(p)
        if state["calls"] == 1:
            out.batch["responses"][:, 0] = 0
        return out

    trainer.groups.rollout.generate_sequences = flat_then_normal
    m = trainer.fit().metrics[-1]
    assert rec.calls.count("generate") == 2
    assert len(rec.seen["update_actor"]) == 4 and set(rec.seen["update_actor"].batch["advantages"][:, 0].sign().tolist()) == {1.0, -1.0}
    assert m["train/num_gen_batches"] == 2


def test_too_many_failed_rewards_stop_the_run_with_the_counts(tmp_path):
    trainer, rec = make_trainer(tmp_path, extra=["trainer.tolerated_failure_fraction=0.25"])

    def failing_reward(batch, return_dict=False):
        out = reward_first_token_zero(batch)
        out["reward_errors"] = ["ValueError: bad"] * len(batch)
        return out

    trainer.reward_fn = failing_reward
    with pytest.raises(StepFailedError, match="reward"):
        trainer.fit()
    assert "update_actor" not in rec.calls


def test_a_run_saving_into_a_folder_another_run_holds_is_refused_before_training(tmp_path):
    """Issue 34: two runs writing one checkpoint folder both succeeded, interleaving global_step_*."""
    trainer, rec = make_trainer(tmp_path, extra=["trainer.save_freq=1"])
    folder = tmp_path / "ckpt"
    other = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom hybridflow.trainer import run_checkpoint "
                              "as c\nc.lock_checkpoint_dir(sys.argv[1])\nprint('held', flush=True)\ntime.sleep(300)",
                              str(folder)], stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "held"
        with pytest.raises(ckpt.CheckpointError, match=rf"checkpoint folder {folder} is in use: another run "
                                                        rf"\(pid {other.pid} on host"):
            trainer.fit()
        assert rec.calls == [] and sorted(p.name for p in folder.iterdir()) == [ckpt.RUN_LOCK_FILE]
    finally:
        other.kill()
        other.wait()
    trainer, rec = make_trainer(tmp_path, extra=["trainer.save_freq=1"])
    trainer.fit()  # the holder is gone: its lock is stale and taken over
    assert "save_checkpoint" in rec.calls and ckpt.completed_steps(folder) == [1]
    assert not (folder / ckpt.RUN_LOCK_FILE).exists()  # released at the end of the run
