"""verl 0.9 keys that the example scripts use and that act here: each one's config-time acceptance and its refusals
(the formulas are tested in tests/algorithms/, the runs in tests/integration/test_algorithms_local.py)."""

from __future__ import annotations

import warnings

import pytest

from hybridflow.config import ConfigError
from hybridflow.launch.config import load_config

A = "actor_rollout_ref"
BASE = [f"{A}.actor.ppo_micro_batch_size_per_gpu=4", "critic.ppo_micro_batch_size_per_gpu=4", f"{A}.rollout.n=4"]
RC = "algorithm.rollout_correction"


def load(*overrides):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_config([*BASE, *overrides])


def test_gdpo_keys_load_and_are_checked():
    cfg = load("algorithm.adv_estimator=gdpo", '+algorithm.gdpo_reward_keys=["accuracy_reward", "format_reward"]',
               "reward.reward_manager.name=gdpo", "algorithm.gdpo_reward_weights=[1.0,0.5]")
    assert cfg.algorithm.gdpo_reward_keys == ["accuracy_reward", "format_reward"]
    assert cfg.reward_model.reward_manager == "gdpo"
    with pytest.raises(ConfigError, match=r"adv_estimator=gdpo normalises each reward component apart: set "
                                          r"algorithm.gdpo_reward_keys"):
        load("algorithm.adv_estimator=gdpo")
    with pytest.raises(ConfigError, match=r"gdpo_reward_weights has 1 entries for the 2"):
        load("algorithm.adv_estimator=gdpo", "algorithm.gdpo_reward_keys=[a,b]", "algorithm.gdpo_reward_weights=[1]")
    with pytest.raises(ConfigError, match=r"read by algorithm.adv_estimator=gdpo only \(this run uses grpo\)"):
        load("algorithm.adv_estimator=grpo", "algorithm.gdpo_reward_keys=[a]")


@pytest.mark.parametrize("overrides", [
    [f"{RC}.rollout_is=token", f"{RC}.rollout_is_threshold=0.5_4.0"],
    [f"{RC}.rollout_rs=token_k1", f"{RC}.rollout_rs_threshold=0.6_1.6"],
    [f"{RC}.rollout_rs='token_k1,seq_max_k2'", f"{RC}.rollout_rs_threshold='0.6_1.6,2.5'"],
    [f"{RC}.rollout_rs=seq_mean_k3", f"{RC}.rollout_rs_threshold=0.01"],
])
def test_verl09_rollout_correction_thresholds_load(overrides):
    cfg = load(f"{A}.rollout.calculate_log_probs=true", *overrides)
    assert cfg.algorithm.rollout_correction is not None


@pytest.mark.parametrize("overrides,message", [
    ([f"{RC}.rollout_rs='token_k1,seq_max_k2'", f"{RC}.rollout_rs_threshold='0.6_1.6,2.5,1'"],
     r"rollout_rs_threshold='0.6_1.6,2.5,1' gives 3 thresholds for the 2 criteria"),
    ([f"{RC}.rollout_rs=seq_max_k2", f"{RC}.rollout_rs_threshold=0.5_2.0"], r"seq_max_k2 takes one upper bound"),
    ([f"{RC}.rollout_is=token", f"{RC}.rollout_is_threshold=4.0_0.5"], r"rollout_is_threshold='4.0_0.5': the lower"),
    ([f"{RC}.rollout_rs=token_k4", f"{RC}.rollout_rs_threshold=2"], r"unknown criterion 'token_k4'"),
    ([f"{RC}.rollout_rs_threshold=0.6_1.6"], r"rollout_rs_threshold='0.6_1.6' bounds the rejection criteria .* null"),
])
def test_bad_rollout_correction_thresholds_are_refused_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load(f"{A}.rollout.calculate_log_probs=true", *overrides)


def test_dppo_loss_modes_load():
    for mode in ("dppo_tv", "dppo_kl"):
        assert load(f"{A}.actor.policy_loss.loss_mode={mode}").actor_rollout_ref.actor.policy_loss.loss_mode == mode


# ------------------------------------------------------------------------------ verl's other engines on FSDP2
def load_with_notes(*overrides):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = load_config([*BASE, "trainer.n_gpus_per_node=8", *overrides])
    return cfg, "\n".join(str(w.message) for w in caught)


def test_veomni_node_lays_out_fsdp2():
    cfg, notes = load_with_notes(
        "model_engine=veomni", f"{A}.actor.veomni.param_offload=True", f"{A}.actor.veomni.optimizer_offload=True",
        f"{A}.actor.veomni.fsdp_size=4", f"{A}.actor.veomni.ulysses_parallel_size=2",
        f"{A}.actor.veomni.enable_full_shard=False", f"{A}.actor.veomni.enable_fsdp_offload=True",
        f"{A}.actor.veomni.moe_implementation=fused_triton")
    actor, ref = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.ref
    assert actor.strategy == "fsdp2" and ref.strategy == "fsdp2"
    f = actor.fsdp_config
    assert (f.param_offload, f.optimizer_offload, f.fsdp_size, f.reshard_after_forward, f.offload_policy) == \
        (True, True, 4, False, True)
    assert actor.ulysses_sequence_parallel_size == 2
    # the reference follows the actor's VeOmni layout (verl's veomni_ref.yaml interpolations)
    assert ref.ulysses_sequence_parallel_size == 2 and ref.fsdp_config.param_offload and ref.fsdp_config.fsdp_size == 4
    assert "strategy=veomni: trained with FSDP2" in notes
    assert "moe_implementation='fused_triton'" in notes  # a kernel choice: inert, said


def test_veomni_expert_parallelism_runs_on_the_nd_engine():
    cfg, notes = load_with_notes("model_engine=veomni", f"{A}.actor.veomni.expert_parallel_size=4")
    actor = cfg.actor_rollout_ref.actor
    assert actor.strategy == "megatron" and actor.megatron.expert_model_parallel_size == 4
    assert "expert_parallel_size=4: actor_rollout_ref.actor trains on the N-D engine" in notes


def test_fsdp_turbo_lays_out_fsdp2():
    cfg, notes = load_with_notes(
        f"{A}.actor.strategy=fsdp_turbo", f"{A}.ref.strategy=fsdp_turbo",
        f"{A}.actor.fsdp_config.turbo_config.distributed.fully_shard_parallel_size=4",
        f"{A}.actor.fsdp_config.turbo_config.distributed.expert_parallel_size=2",
        f"+{A}.actor.fsdp_config.turbo_config.memory.recompute=True",
        f"+{A}.actor.fsdp_config.turbo_config.memory.recompute_plan=['model.layers.{{*}}']")
    actor = cfg.actor_rollout_ref.actor
    assert actor.strategy == "megatron" and actor.megatron.expert_model_parallel_size == 2
    assert actor.fsdp_config.fsdp_size == 4 and cfg.actor_rollout_ref.model.enable_gradient_checkpointing
    assert cfg.actor_rollout_ref.ref.strategy == "fsdp2"
    assert "strategy=fsdp_turbo: trained with FSDP2" in notes
    with pytest.raises(ConfigError, match=r"turbo_config.distributed.tensor_parallel_size=2: reserved"):
        load(f"{A}.actor.strategy=fsdp_turbo", f"{A}.actor.fsdp_config.turbo_config.distributed.tensor_parallel_size=2")


def test_megatron_lite_engine_node_lays_out_the_megatron_node():
    cfg, notes = load_with_notes(
        "actor@actor_rollout_ref.actor=mlite_actor", f"{A}.actor.engine.tp=2", f"{A}.actor.engine.pp=2",
        f"{A}.actor.engine.vpp=1", f"{A}.actor.engine.ep=2", f"{A}.actor.engine.cp=1", f"{A}.actor.engine.etp=1",
        f"{A}.actor.engine.param_offload=True", f"{A}.actor.engine.impl_cfg.use_thd=True",
        f"+{A}.actor.engine.impl_cfg.recompute=[full]", f"+{A}.actor.engine.impl_cfg.optimizer=fsdp2",
        f"{A}.model.use_remove_padding=false")
    actor = cfg.actor_rollout_ref.actor
    m = actor.megatron
    assert actor.strategy == "megatron" and actor.model_engine == "mlite"
    assert (m.tensor_model_parallel_size, m.pipeline_model_parallel_size, m.virtual_pipeline_model_parallel_size,
            m.expert_model_parallel_size) == (2, 2, None, 2)
    assert actor.fsdp_config.param_offload and actor.use_remove_padding
    assert cfg.actor_rollout_ref.model.enable_gradient_checkpointing
    with pytest.raises(ConfigError, match=r"impl_cfg.recompute=\['selective'\]: only full recompute"):
        load("actor@actor_rollout_ref.actor=mlite_actor", f"+{A}.actor.engine.impl_cfg.recompute=[selective]")
    with pytest.raises(ConfigError, match=r"actor@actor_rollout_ref.actor=torchtitan_actor: choose dp_actor"):
        load("actor@actor_rollout_ref.actor=torchtitan_actor")


def test_role_model_engine_sets_that_roles_strategy():
    cfg = load(f"{A}.actor.model_engine=megatron", f"{A}.actor.megatron.tensor_model_parallel_size=2",
               "trainer.n_gpus_per_node=2")
    assert cfg.actor_rollout_ref.actor.strategy == "megatron"
    with pytest.raises(ConfigError, match=r"model_engine=dp and actor_rollout_ref.actor.strategy=megatron name "
                                          r"different engines"):
        load(f"{A}.actor.model_engine=dp", f"{A}.actor.strategy=megatron")


def test_a_megatron_node_on_an_fsdp_role_is_inert_and_said():
    """verl's FSDP workers never read a role's megatron node; a script setting it on an fsdp role runs, and the dry
    run says the keys do nothing."""
    cfg, notes = load_with_notes(f"critic.megatron.tensor_model_parallel_size=2", "critic.strategy=fsdp",
                                 "algorithm.adv_estimator=gae")
    assert cfg.critic.strategy == "fsdp"
    assert "critic.megatron.tensor_model_parallel_size has no effect" in notes and "verl ignores it too" in notes
    _, notes = load_with_notes(f"{A}.actor.veomni.ulysses_parallel_size=2")
    assert "actor_rollout_ref.actor.veomni (ulysses_parallel_size) has no effect" in notes


def test_rollout_moe_split_keys():
    """vLLM's expert parallelism acts when expert_parallel_size = tp x dp; TensorRT-LLM's moe_tensor_parallel_size is
    inert (noted with every inert key) and another expert_parallel_size is said to have no effect."""
    from types import SimpleNamespace

    from hybridflow.rollout.moe_layout import moe_split_note
    from hybridflow.rollout.vllm.config import vllm_engine_kwargs

    cfg, notes = load_with_notes(f"+{A}.rollout.moe_tensor_parallel_size=2")
    assert cfg.actor_rollout_ref.rollout.moe_tensor_parallel_size == 2
    assert "actor_rollout_ref.rollout.moe_tensor_parallel_size=2: TensorRT-LLM's split" in notes
    rollout = SimpleNamespace(expert_parallel_size=4, tensor_model_parallel_size=4, data_parallel_size=1)
    assert moe_split_note(rollout, "vllm") is None
    assert "has no effect with rollout.name=hf" in moe_split_note(rollout, "hf")
    rollout.expert_parallel_size = 2
    assert "expert_parallel_size=2 has no effect with rollout.name=vllm" in moe_split_note(rollout, "vllm")
    for ep, expected in ((4, True), (2, None), (1, None)):
        r = load(f"{A}.rollout.tensor_model_parallel_size=4", f"{A}.rollout.expert_parallel_size={ep}",
                 f"{A}.rollout.name=vllm").actor_rollout_ref.rollout
        kwargs = vllm_engine_kwargs(r, "/tmp/no_model", device="cuda")
        assert kwargs.get("enable_expert_parallel") is expected


def test_megatron_lora_node_fills_the_lora_keys():
    cfg, notes = load_with_notes(f"{A}.model.lora.rank=32", f"{A}.model.lora.alpha=64",
                                 f"{A}.model.lora.lora_A_init_method=kaiming",
                                 f"{A}.model.lora.exclude_modules=[linear_fc2]")
    m = cfg.actor_rollout_ref.model
    assert (m.lora_rank, m.lora_alpha) == (32, 64.0)
    assert m.target_modules == ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]
    assert m.exclude_modules == ["down_proj"]
    assert "Megatron's LoRA node trains peft adapters (rank 32, alpha 64)" in notes
    with pytest.raises(ConfigError, match=r"lora.rank=32 and actor_rollout_ref.model.lora_rank=8 set the same"):
        load(f"{A}.model.lora.rank=32", f"{A}.model.lora_rank=8")
    with pytest.raises(ConfigError, match=r"lora.dropout_position='post'"):
        load(f"{A}.model.lora.rank=8", f"{A}.model.lora.dropout_position=post")


def test_use_dist_checkpointing_needs_a_dcp_folder_at_run_stage(nano_model_dir, tmp_path):
    """Config stage: accepted as verl's scripts write it (the path comes from their environment); run stage: the
    folder must be a torch distributed checkpoint."""
    import torch.distributed.checkpoint as dcp

    from hybridflow.engine.checks import check_model_files
    from hybridflow.engine.model_loader import load_causal_lm

    keys = ["model_engine=megatron", "algorithm.adv_estimator=grpo", f"{A}.model.path={nano_model_dir}",
            f"{A}.actor.megatron.use_dist_checkpointing=true", f"{A}.actor.megatron.dist_checkpointing_path=''"]
    cfg = load(*keys)
    errors: list[str] = []
    check_model_files(cfg, errors)
    assert len(errors) == 1 and "dist_checkpointing_path='' is not a torch distributed checkpoint folder" in errors[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(load_causal_lm(nano_model_dir).state_dict(), checkpoint_id=str(tmp_path / "dcp"), no_dist=True)
    cfg = load(*keys[:-1], f"{A}.actor.megatron.dist_checkpointing_path={tmp_path / 'dcp'}")
    errors = []
    check_model_files(cfg, errors)
    assert errors == []


def test_megatron_optimizer_config_fields_in_override_optimizer_config():
    """verl's DeepSeek / Qwen3.5 Megatron lines pass Megatron-core OptimizerConfig fields through
    override_optimizer_config: CPU offload acts (fsdp_config.optimizer_offload), the rest is said inert, and none of
    them reaches the optimizer class; a partial offload is refused; a name no optimizer takes is refused at run
    stage."""
    from hybridflow.engine.checks import check_optimizers

    o = f"+{A}.actor.optim.override_optimizer_config"
    cfg, notes = load_with_notes("model_engine=megatron", f"{o}.optimizer_offload_fraction=1.0",
                                 f"{o}.optimizer_cpu_offload=True", f"{o}.use_precision_aware_optimizer=True",
                                 f"{o}.overlap_cpu_optimizer_d2h_h2d=True", f"{o}.amsgrad=True")
    assert "use_precision_aware_optimizer=True has no effect" in notes and "optimizer_cpu_offload=true: the" in notes
    assert cfg.actor_rollout_ref.actor.fsdp_config.optimizer_offload is True
    assert cfg.actor_rollout_ref.actor.optim.override_optimizer_config == {"amsgrad": True}
    errors: list[str] = []
    check_optimizers(cfg, errors)
    assert errors == []
    cfg = load("model_engine=megatron", f"{o}.optimizer_cpu_offload=False", f"{o}.optimizer_offload_fraction=1.0")
    assert cfg.actor_rollout_ref.actor.fsdp_config.optimizer_offload is False
    with pytest.raises(ConfigError, match=r"optimizer_offload_fraction=0.5: offloading part of the optimizer state"):
        load("model_engine=megatron", f"{o}.optimizer_cpu_offload=True", f"{o}.optimizer_offload_fraction=0.5")
    cfg, notes = load_with_notes("model_engine=megatron", f"{o}.offload_fraction=1.0")  # Megatron Lite's spelling
    assert cfg.actor_rollout_ref.actor.optim.override_optimizer_config == {} and "offload_fraction=1.0 has no" in notes
    cfg = load(f"{o}.no_such_argument=1")
    errors = []
    check_optimizers(cfg, errors)
    assert len(errors) == 1 and "no_such_argument is not an argument of torch.optim" in errors[0]
