"""Split-placement and async-training keys: verl's command lines load, every key acts in its mode or is refused."""

from __future__ import annotations

import pytest

from hybridflow.config import ConfigError
from hybridflow.launch.config import load_config

BASE = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=32", "data.train_batch_size=32"]
SPLIT = ["actor_rollout_ref.hybrid_engine=false", "rollout.nnodes=1", "rollout.n_gpus_per_node=2"]
FULLY = SPLIT + ["async_training.mode=fully_async", "actor_rollout_ref.rollout.calculate_log_probs=true",
                 "actor_rollout_ref.rollout.free_cache_engine=false"]

# From verl's experimental/one_step_off_policy/shell/grpo_0.6b_gsm8k_fsdp2_2_6.sh (paths and model left out).
VERL_ONE_STEP_OFF = [
    "algorithm.adv_estimator=grpo", "data.train_batch_size=1152", "data.max_prompt_length=512",
    "data.max_response_length=1024", "data.filter_overlong_prompts=True", "data.truncation=error",
    "actor_rollout_ref.actor.strategy=fsdp2", "critic.strategy=fsdp2", "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.hybrid_engine=False", "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.actor.ppo_mini_batch_size=192", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
    "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.001",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl", "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32", "actor_rollout_ref.rollout.name=hf",
    "actor_rollout_ref.rollout.n=5", "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32",
    "algorithm.use_kl_in_reward=False", "trainer.critic_warmup=0", "trainer.val_before_train=True",
    "trainer.save_freq=-1", "trainer.test_freq=5", "trainer.total_epochs=2", "trainer.nnodes=1",
    "trainer.n_gpus_per_node=6", "rollout.nnodes=1", "rollout.n_gpus_per_node=2",
]

# From verl's experimental/fully_async_policy/shell/dapo_7b_math_fsdp2_4_4.sh (the async part).
VERL_FULLY_ASYNC = [
    "data.train_batch_size=0", "data.gen_batch_size=1", "data.return_raw_chat=True",
    "actor_rollout_ref.rollout.n=16", "algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.strategy=fsdp2",
    "actor_rollout_ref.hybrid_engine=False", "actor_rollout_ref.actor.ppo_mini_batch_size=32",
    "actor_rollout_ref.actor.use_dynamic_bsz=True", "actor_rollout_ref.rollout.calculate_log_probs=True",
    "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.mode=async", "trainer.val_before_train=False",
    "trainer.save_freq=-1", "trainer.resume_mode=auto", "trainer.nnodes=1", "trainer.n_gpus_per_node=4",
    "rollout.nnodes=1", "rollout.n_gpus_per_node=4", "rollout.total_rollout_steps=51200", "rollout.total_epochs=10",
    "rollout.test_freq=10", "async_training.staleness_threshold=0.1", "async_training.trigger_parameter_sync_step=4",
    "async_training.require_batches=4", "async_training.partial_rollout=True",
    "async_training.use_rollout_log_probs=True",
]


def _errors(overrides, config_name=None) -> str:
    with pytest.raises(ConfigError) as err:
        load_config(overrides, config_name=config_name)
    return str(err.value)


def test_verls_one_step_off_command_line_loads():
    cfg = load_config(VERL_ONE_STEP_OFF, config_name="one_step_off_ppo_trainer")
    assert cfg.async_training.mode == "one_step_off" and cfg.split_placement
    assert (cfg.rollout.nnodes, cfg.rollout.n_gpus_per_node) == (1, 2)
    assert cfg.algorithm.rollout_correction.bypass_mode and cfg.actor_rollout_ref.rollout.calculate_log_probs


def test_verls_fully_async_command_line_loads_and_sizes_the_step():
    cfg = load_config(VERL_FULLY_ASYNC, config_name="fully_async_ppo_trainer")
    assert cfg.async_training.mode == "fully_async"
    assert cfg.data.train_batch_size == 4 * 32  # require_batches x ppo_mini_batch_size (verl writes 0)
    assert cfg.rollout.total_rollout_steps == 51200 and cfg.rollout.test_freq == 10


def test_verls_fully_async_command_line_with_partial_rollouts_on_vllm_servers_loads():
    """verl's fully-async DAPO scripts: partial rollouts on vLLM servers (abort + continue, rollout/vllm/server.py)."""
    cfg = load_config([o for o in VERL_FULLY_ASYNC if "rollout.name=" not in o] +
                      ["actor_rollout_ref.rollout.name=vllm"], config_name="fully_async_ppo_trainer")
    assert cfg.actor_rollout_ref.rollout.name == "vllm" and cfg.async_training.partial_rollout


def test_the_main_entry_reaches_the_same_modes():
    cfg = load_config(BASE + FULLY)
    assert cfg.async_training.mode == "fully_async" and cfg.data.train_batch_size == 32
    cfg = load_config(BASE + SPLIT + ["async_training.mode=one_step_off"])
    assert cfg.async_training.mode == "one_step_off"


@pytest.mark.parametrize("extra, needle", [
    (["async_training.mode=fully_sync"], "async_training.mode='fully_sync' is not a training mode"),
    (["async_training.mode=one_step_off"], "set actor_rollout_ref.hybrid_engine=false"),
    (["async_training.staleness_threshold=0.5"], "async_training.staleness_threshold=0.5 acts in fully async"),
    (["async_training.checkpoint_engine.device_buffer_size_M=64"], "acts in fully async training only"),
    (["rollout.n_gpus_per_node=2"], "rollout.n_gpus_per_node=2 acts only when the rollout has its own pool"),
    (["actor_rollout_ref.rollout.checkpoint_engine.backend=nccl"], "acts only when the rollout has its own pool"),
    (["actor_rollout_ref.rollout.checkpoint_engine.backend=nixl"], "backend='nixl' is not available"),
    (["rollout.total_rollout_steps=64"], "counts the prompts of a fully async run"),
    (["rollout.test_freq=3"], "rollout.test_freq=3 acts in fully async training only"),
    (SPLIT + ["actor_rollout_ref.model.lora_rank=8"], "lora_rank>0 with actor_rollout_ref.hybrid_engine=false"),
    (SPLIT + ["actor_rollout_ref.rollout.name=sglang"], "standalone rollout replicas"),
    (SPLIT + ["actor_rollout_ref.rollout.name=vllm",
              "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=64"],
     "shared-memory safetensors copy"),
])
def test_keys_that_cannot_act_are_refused(extra, needle):
    assert needle in _errors(BASE + extra)


@pytest.mark.parametrize("extra, needle", [
    (["data.train_batch_size=48"], "a fully async trainer step takes"),
    (["data.gen_batch_size=7"], "streams one prompt at a time"),
    (["actor_rollout_ref.rollout.calculate_log_probs=false"], "set actor_rollout_ref.rollout.calculate_log_probs"),
    (["async_training.compute_prox_log_prob=true"], "use async_training.trigger_parameter_sync_step=1"),
    (["async_training.use_trainer_do_validate=true"], "validation runs on the rollout replicas"),
    (["actor_rollout_ref.rollout.free_cache_engine=true"], "free_cache_engine=true"),
    (["algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=acc"], "DAPO dynamic sampling"),
    (["async_training.staleness_threshold=-1"], "must be >= 0"),
    (["async_training.trigger_parameter_sync_step=0"], "must be >= 1"),
    (["rollout.total_rollout_steps=8"], "fewer prompts than one trainer step"),
    (["trainer.test_freq=5", "rollout.test_freq=2"], "set rollout.test_freq instead"),
    (["actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=64"], "device_buffer_size_M"),
])
def test_fully_async_refusals(extra, needle):
    assert needle in _errors(BASE + FULLY + extra)


def test_compute_prox_log_prob_acts_with_one_sync_step():
    cfg = load_config(BASE + FULLY + ["async_training.compute_prox_log_prob=true",
                                      "async_training.trigger_parameter_sync_step=1"])
    assert cfg.async_training.compute_prox_log_prob


def test_where_pi_old_comes_from_in_each_mode():
    from hybridflow.trainer.stages import StepPlan

    logprobs = ["actor_rollout_ref.rollout.calculate_log_probs=true"]
    sync = StepPlan.from_config(load_config(BASE + logprobs))
    assert sync.reuse_rollout_log_probs  # exactly on-policy: the rollout's log-probs are pi_old
    one_step = StepPlan.from_config(load_config(BASE + SPLIT + logprobs + ["async_training.mode=one_step_off"]))
    assert not one_step.reuse_rollout_log_probs  # one update old: pi_old is recomputed
    corrected = StepPlan.from_config(load_config(BASE + SPLIT + logprobs + [
        "async_training.mode=one_step_off", "algorithm.rollout_correction.rollout_is=token"]))
    assert not corrected.reuse_rollout_log_probs and not corrected.old_log_prob_in_update
    bypass = StepPlan.from_config(load_config(BASE + SPLIT + logprobs + [
        "async_training.mode=one_step_off", "algorithm.rollout_correction.bypass_mode=true"]))
    assert bypass.reuse_rollout_log_probs
    fully = StepPlan.from_config(load_config(BASE + FULLY))
    assert fully.reuse_rollout_log_probs  # verl's use_rollout_log_probs=true
    recompute = StepPlan.from_config(load_config(BASE + FULLY + ["async_training.use_rollout_log_probs=false"]))
    assert not recompute.reuse_rollout_log_probs
