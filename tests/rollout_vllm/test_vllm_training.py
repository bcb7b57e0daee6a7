"""verl command lines with ``rollout.name=vllm`` train end to end on this CPU (tiny model, real GSM8K rows).

Each run starts a real vLLM engine (or a server process) and trains 2 steps.  The assertions are about what the
engine changes: rollout/actor log-prob agreement at every step (``training/rollout_probs_diff_*``), the actor's
weights reaching the engine after each update (``timing_s/update_weights`` and the log-prob agreement at step
2, which a missed sync breaks), TIS on the engine's log-probs, and resume restoring the engine's weights.
"""

from __future__ import annotations

import pytest

from hybridflow.config import parse_command_line
from hybridflow.launch.config import load_config
from vllm_helpers import tiny_command_line, verl_sections

SECTIONS = dict(verl_sections())
GRPO = "grpo_trainer/run_deepseek7b_llm.sh"  # verl's GSM8K GRPO launch script
PPO = "ppo_trainer/run_deepseek7b_llm.sh"  # verl's GSM8K PPO/GAE launch script


def config_for(section: str, model_dir, data_dir, out_dir, extra=(), steps=2):
    cl = parse_command_line(tiny_command_line(SECTIONS[section], model_dir, data_dir, out_dir, steps, extra))
    return load_config(cl.overrides, cl.config_path, cl.config_name)


def train(cfg, out_dir):
    from hybridflow.tracking import Tracking
    from hybridflow.trainer.main_ppo import train_ppo

    return train_ppo(cfg, logger=Tracking("vllm_it", "run", default_backend=["file"], output_dir=out_dir)).metrics


def assert_engine_agrees_with_actor(metrics):
    for step in metrics:
        assert step["training/rollout_probs_diff_mean"] <= 1e-4, step["training/rollout_probs_diff_mean"]
        assert step["training/rollout_probs_diff_max"] <= 1e-2
        assert step["timing_s/update_weights"] > 0  # the actor's weights moved into the engine every step


def test_gsm8k_grpo_colocated(tiny_bpe_model_dir, gsm8k_parquet, tmp_path):
    cfg = config_for(GRPO, tiny_bpe_model_dir, gsm8k_parquet, tmp_path)
    assert cfg.actor_rollout_ref.rollout.name == "vllm" and cfg.actor_rollout_ref.rollout.load_format == "dummy"
    metrics = train(cfg, tmp_path)
    assert len(metrics) == 2
    assert_engine_agrees_with_actor(metrics)
    print("GRPO colocated, rollout_probs_diff_mean per step:",
          [f"{m['training/rollout_probs_diff_mean']:.2e}" for m in metrics])


def test_gsm8k_grpo_with_a_standalone_server_replica(tiny_bpe_model_dir, gsm8k_parquet, tmp_path):
    cfg = config_for(GRPO, tiny_bpe_model_dir, gsm8k_parquet, tmp_path, ["actor_rollout_ref.hybrid_engine=false"])
    metrics = train(cfg, tmp_path)
    assert len(metrics) == 2
    assert_engine_agrees_with_actor(metrics)


def test_one_step_off_on_a_standalone_server_replica(tiny_bpe_model_dir, gsm8k_parquet, tmp_path):
    """Async training on vLLM servers: batch k+1 is generated while the actor trains on batch k, one update
    behind (none on the first step); the rollout's log-probs then differ from the recomputed pi_old."""
    cfg = config_for(GRPO, tiny_bpe_model_dir, gsm8k_parquet, tmp_path,
                     ["actor_rollout_ref.hybrid_engine=false", "async_training.mode=one_step_off",
                      "actor_rollout_ref.actor.optim.lr=1e-2"], steps=3)
    metrics = train(cfg, tmp_path)
    assert [m["training/staleness/max"] for m in metrics] == [0, 1, 1]
    diffs = [m["training/rollout_probs_diff_mean"] for m in metrics]
    assert diffs[0] <= 1e-4 < min(diffs[1:]), diffs  # on-policy first, then one update old
    assert all("timing_s/generate_async" in m for m in metrics)


@pytest.mark.parametrize("partial", [False, True], ids=["whole", "partial"])
def test_fully_async_on_a_server_replica(partial, tiny_bpe_model_dir, gsm8k_parquet, tmp_path):
    """Fully async on vLLM servers: trajectories stream from the server into the queue, the trainer syncs the
    weights after every step and the staleness bound holds; with partial rollouts the sync interrupts the
    trajectories in flight, which continue with the new weights (verl's fully-async DAPO scripts)."""
    cfg = config_for(GRPO, tiny_bpe_model_dir, gsm8k_parquet, tmp_path,
                     ["actor_rollout_ref.hybrid_engine=false", "async_training.mode=fully_async",
                      f"async_training.partial_rollout={partial}", "async_training.staleness_threshold=0.5",
                      "async_training.trigger_parameter_sync_step=1", "async_training.require_batches=1",
                      "actor_rollout_ref.rollout.calculate_log_probs=true", "data.train_batch_size=0",
                      "data.gen_batch_size=1", "rollout.total_rollout_steps=12", "actor_rollout_ref.rollout.free_cache_engine=false"], steps=3)
    metrics = train(cfg, tmp_path)
    steps = [m for m in metrics if "timing_s/step" in m]
    assert len(steps) >= 2 and all(m["training/staleness/max"] <= 1 for m in steps)
    assert all(m["timing_s/update_weights"] > 0 for m in steps)
    # (whether a sync catches a 16-token trajectory in flight is timing; test_vllm_server.py tests the continuation)
    print("partial spans per step:", [m.get("fully_async/partial/max_partial_span") for m in steps])


def test_gsm8k_ppo_gae_colocated(tiny_bpe_model_dir, gsm8k_parquet, tmp_path):
    cfg = config_for(PPO, tiny_bpe_model_dir, gsm8k_parquet, tmp_path)
    assert cfg.use_critic
    metrics = train(cfg, tmp_path)
    assert len(metrics) == 2 and all("critic/vf_loss" in m for m in metrics)
    assert_engine_agrees_with_actor(metrics)


def test_tis_rollout_correction_on_the_engine_log_probs(tiny_bpe_model_dir, gsm8k_parquet, tmp_path):
    cfg = config_for(GRPO, tiny_bpe_model_dir, gsm8k_parquet, tmp_path,
                     ["algorithm.rollout_correction.rollout_is=token",
                      "algorithm.rollout_correction.rollout_is_threshold=2.0"])
    metrics = train(cfg, tmp_path)
    weights = [k for k in metrics[-1] if k.startswith("rollout_corr/")]
    assert weights, sorted(metrics[-1])
    # the engine's log-probs equal the actor's (fp32), so the IS weights are 1 up to float noise
    mean_keys = [k for k in weights if k.endswith("rollout_is_mean")]
    assert mean_keys and all(abs(metrics[-1][k] - 1.0) < 1e-3 for k in mean_keys), {k: metrics[-1][k] for k in weights}


def test_resume_restores_the_engine_weights(tiny_bpe_model_dir, gsm8k_parquet, tmp_path):
    first = config_for(GRPO, tiny_bpe_model_dir, gsm8k_parquet, tmp_path,
                       ["trainer.save_freq=1", "trainer.resume_mode=auto"], steps=1)
    train(first, tmp_path / "a")
    again = config_for(GRPO, tiny_bpe_model_dir, gsm8k_parquet, tmp_path,
                       ["trainer.save_freq=1", "trainer.resume_mode=auto"], steps=2)
    metrics = train(again, tmp_path / "b")
    assert len(metrics) == 1  # step 2 only: step 1 came from the checkpoint
    # Had the engine kept the model.path weights (load_format=dummy: random ones) instead of the resumed actor's,
    # its log-probs would not match the actor's recomputation at step 2.
    assert metrics[0]["training/rollout_probs_diff_mean"] <= 1e-4


def test_a_server_replica_dying_mid_run_is_named_and_the_run_resumes(tiny_bpe_model_dir, gsm8k_parquet, tmp_path):
    import os
    import signal

    import psutil

    from hybridflow.rollout.vllm.server import VLLMServerError

    extra = ["actor_rollout_ref.hybrid_engine=false", "trainer.save_freq=1", "trainer.resume_mode=auto"]
    killed = []

    def kill_the_server_after_step_1():
        for child in psutil.Process().children(recursive=False):  # only processes this run started
            try:
                cmdline = " ".join(child.cmdline())
            except psutil.Error:  # an exited child (zombie) of an earlier test
                continue
            if "vllm.entrypoints.openai.api_server" in cmdline:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait(30)
                killed.append(child.pid)
        return False

    cfg = config_for(GRPO, tiny_bpe_model_dir, gsm8k_parquet, tmp_path, extra, steps=2)
    from hybridflow.tracking import Tracking
    from hybridflow.trainer.main_ppo import train_ppo

    with pytest.raises(Exception) as e:
        train_ppo(cfg, logger=Tracking("vllm_it", "run", default_backend=["file"], output_dir=tmp_path / "a"),
                  should_stop=kill_the_server_after_step_1)
    assert killed, repr(e.value)
    chain, err = [], e.value
    while err is not None:
        chain.append(err)
        err = err.__cause__ or err.__context__
    assert any(isinstance(x, VLLMServerError) or "replica 'vllm-server-0'" in str(x) for x in chain), chain
    assert (tmp_path / "ckpt" / "global_step_1").is_dir()  # the last checkpoint is intact
    metrics = train(config_for(GRPO, tiny_bpe_model_dir, gsm8k_parquet, tmp_path, extra, steps=2), tmp_path / "b")
    assert len(metrics) == 1 and metrics[0]["training/rollout_probs_diff_mean"] <= 1e-4  # resumed at step 2
