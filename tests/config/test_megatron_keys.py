"""What each of verl's Megatron keys does here (config/checks/megatron.py): the strategy's three spellings, the sizes
read into the role's mesh, context parallelism as Ulysses, offload into fsdp_config, Megatron's schedule keys, and
every refusal naming the key and the reason."""

from __future__ import annotations

import warnings

import pytest

from hybridflow.config import ConfigError
from hybridflow.launch.config import load_config

A = "actor_rollout_ref"
BASE = ["trainer.n_gpus_per_node=4", f"{A}.actor.ppo_micro_batch_size_per_gpu=2", "critic.ppo_micro_batch_size_per_gpu=2",
        f"{A}.rollout.log_prob_micro_batch_size_per_gpu=2", f"{A}.ref.log_prob_micro_batch_size_per_gpu=2"]


def _load(overrides, name=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_config(BASE + overrides, None, name)


def _errors(overrides, name=None) -> str:
    with pytest.raises(ConfigError) as e:
        _load(overrides, name)
    return str(e.value)


@pytest.mark.parametrize("overrides,name", [
    ([f"{A}.actor.megatron.tensor_model_parallel_size=2"], "ppo_megatron_trainer.yaml"),
    ([f"{A}.actor.strategy=megatron", f"{A}.actor.megatron.tensor_model_parallel_size=2"], None),
    (["model_engine=megatron", f"{A}.actor.megatron.tensor_model_parallel_size=2"], None),
])
def test_three_spellings_put_every_role_on_the_megatron_strategy(overrides, name):
    cfg = _load(overrides, name)
    assert {cfg.actor_rollout_ref.actor.strategy, cfg.actor_rollout_ref.ref.strategy, cfg.critic.strategy} == {"megatron"}
    # the reference follows the actor's sizes (as verl's megatron_ref.yaml)
    assert cfg.actor_rollout_ref.ref.megatron.tensor_model_parallel_size == 2


def test_context_parallel_runs_as_ulysses_and_offload_reaches_fsdp_config():
    cfg = _load(["model_engine=megatron", f"{A}.actor.megatron.context_parallel_size=2",
                 f"{A}.actor.megatron.param_offload=true", f"{A}.actor.megatron.optimizer_offload=true"])
    actor = cfg.actor_rollout_ref.actor
    assert actor.ulysses_sequence_parallel_size == 2 and cfg.actor_rollout_ref.ref.ulysses_sequence_parallel_size == 2
    assert actor.fsdp_config.param_offload and actor.fsdp_config.optimizer_offload
    assert cfg.actor_rollout_ref.ref.fsdp_config.param_offload  # follows the actor's megatron.param_offload


def test_megatron_schedule_keys_act():
    cfg = _load([f"{A}.actor.optim.lr=1e-5", f"{A}.actor.optim.lr_decay_style=cosine", f"{A}.actor.optim.min_lr=1e-6"])
    optim = cfg.actor_rollout_ref.actor.optim
    assert optim.lr_scheduler_type == "cosine" and optim.min_lr_ratio == pytest.approx(0.1)


def test_the_batch_is_split_over_data_parallel_groups_of_tp_ranks():
    # 4 devices, tp 2: dp = 2, so 3 prompts x n=2 = 6 trajectories split in 2 (accepted), 5 x 1 = 5 is not
    msg = _errors(["model_engine=megatron", f"{A}.actor.megatron.tensor_model_parallel_size=2",
                   f"{A}.rollout.n=1", "data.train_batch_size=5", f"{A}.actor.ppo_mini_batch_size=5"])
    assert "cannot be split over 2 data-parallel groups" in msg


@pytest.mark.parametrize("overrides,wanted", [
    ([f"{A}.actor.megatron.pipeline_model_parallel_size=3"], "pipeline_model_parallel_size=3 x actor_rollout_ref.actor"),
    ([f"{A}.actor.megatron.pipeline_model_parallel_size=2", f"{A}.actor.megatron.pipeline_schedule=zb"],
     "pipeline_schedule='zb': choose one of 1f1b, gpipe"),
    ([f"{A}.actor.megatron.pipeline_model_parallel_size=2", f"{A}.model.override_config.output_router_logits=true"],
     "the router auxiliary loss of pipeline stages is not built"),
    ([f"{A}.actor.megatron.virtual_pipeline_model_parallel_size=2"], "it needs actor_rollout_ref.actor.megatron."
                                                                      "pipeline_model_parallel_size > 1"),
    ([f"{A}.actor.megatron.expert_tensor_parallel_size=2"], "expert_tensor_parallel_size=2: experts are split over"),
    ([f"{A}.actor.megatron.use_distributed_optimizer=false"], "use_distributed_optimizer=false: a replicated "
                                                              "optimizer is not offered"),
    ([f"{A}.actor.megatron.tensor_model_parallel_size=3"], "tensor_model_parallel_size=3 must divide the 4 ranks"),
    ([f"{A}.actor.megatron.tensor_model_parallel_size=2", f"{A}.actor.megatron.expert_model_parallel_size=8"],
     "expert_model_parallel_size=8 must divide the data-parallel size dp = world / (sp x tp) = 4 / (1 x 2) = 2 "
     "(expert groups inside the data-parallel ranks), or divide actor_rollout_ref.actor.megatron.tensor_model_parallel"
     "_size=2 (expert groups inside the tensor-parallel groups), or be a multiple k x 2 of"),
    ([f"{A}.actor.megatron.context_parallel_size=2", f"{A}.actor.ulysses_sequence_parallel_size=4"],
     "context_parallel_size=2 and actor_rollout_ref.actor.ulysses_sequence_parallel_size=4 both split the sequence"),
    # (use_dist_checkpointing acts: tests/config/test_verl09_surface.py, tests/engine/test_dist_checkpoint.py)
    ([f"{A}.actor.optim.lr_decay_style=WSD"], "lr_decay_style=WSD: only constant and cosine"),
])
def test_refusals_name_the_key_and_the_reason(overrides, wanted):
    msg = _errors(["model_engine=megatron", *overrides])
    assert wanted in msg
    # the reference inherits the actor's sizes: a problem is said once, for the actor
    assert "actor_rollout_ref.ref.megatron" not in msg


def test_megatron_keys_on_another_strategy_are_inert_and_foreign_engines_are_refused():
    """verl's FSDP workers ignore a role's megatron node: accepted and said (tests/config/test_verl09_surface.py);
    engines with no counterpart here are refused."""
    with pytest.warns(Warning, match="the megatron node is read only with actor_rollout_ref.actor.strategy=megatron"):
        load_config(BASE + [f"{A}.actor.megatron.tensor_model_parallel_size=2"])
    assert "model_engine=torchtitan: verl's torchtitan training engine is not available" in \
        _errors(["model_engine=torchtitan"])
    assert "reward_model.strategy=megatron" in _errors(["reward_model.strategy=megatron"])


def test_run_stage_checks_the_split_against_the_model(nano_model_dir):
    from hybridflow.engine.parallel.checks import check_parallel_model

    for overrides, wanted in (([f"{A}.actor.megatron.tensor_model_parallel_size=4"], "must divide the 2 key/value heads"),
                              ([f"{A}.actor.megatron.expert_model_parallel_size=2"], "the model has none"),
                              ([f"{A}.actor.megatron.tensor_model_parallel_size=2"], None)):
        cfg = _load([f"{A}.model.path={nano_model_dir}", "model_engine=megatron", *overrides])
        errors: list[str] = []
        check_parallel_model(cfg, errors)
        assert (wanted is None and not errors) or (wanted and wanted in errors[0]), errors


def test_lora_trains_on_a_tensor_parallel_actor():
    cfg = _load(["model_engine=megatron", f"{A}.actor.megatron.tensor_model_parallel_size=2", f"{A}.model.lora_rank=8"])
    assert cfg.actor_rollout_ref.actor.megatron.tensor_model_parallel_size == 2
    assert cfg.actor_rollout_ref.model.lora_rank == 8
