"""``hybridflow train --dry-run`` runs every check of the pipeline: each known-bad configuration exits 2 naming the key.

The cases are the known-bad configurations of the config tests (test_config, test_config_time_errors,
test_async_config, test_key_policy, test_rollout_engine_keys, test_verl09) and of every check that used to run only
after Ray and the models had started (ReMax's baseline, agent-loop / tool / interaction files, the data set's size,
the reward function, dataset classes, the model's config, output folders).  Each runs through the real command line
in this process (no interpreter start-up per case).
"""

from __future__ import annotations

import contextlib
import io
import os

import pytest

A = "actor_rollout_ref"
# a valid small run on this machine (with the dry_run_assets files): 8 prompts x 2 samples on one device
GOOD = ["algorithm.adv_estimator=grpo", "data.train_batch_size=8", f"{A}.rollout.n=2",
        f"{A}.actor.ppo_mini_batch_size=8", f"{A}.actor.ppo_micro_batch_size_per_gpu=4",
        "critic.ppo_micro_batch_size_per_gpu=4", "reward_model.num_workers=0"]


def dry_run(args, cwd) -> tuple[int, str]:
    from hybridflow.cli import main

    err = io.StringIO()
    old = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                rc = int(main(["train", "--dry-run", *args]) or 0)
            except SystemExit as e:
                rc = int(e.code or 0)
    finally:
        os.chdir(old)
    return rc, err.getvalue()


@pytest.fixture()
def bad_files(tmp_path):
    """User files with one mistake each."""
    (tmp_path / "reward_ok.py").write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):"
                                           "\n    return 0.0\n")
    (tmp_path / "reward_bad_signature.py").write_text("def compute_score(text, answer):\n    return 0.0\n")
    (tmp_path / "tools_bad.yaml").write_text("tools:\n  - class_name: no_such_pkg.mod.Tool\n")
    (tmp_path / "loops_bad.yaml").write_text("- name: mine\n  _target_: no_such_pkg.loops.MyLoop\n")
    (tmp_path / "loops_no_class.yaml").write_text("- name: mine\n  _target_: json.NoSuchLoop\n")
    (tmp_path / "a_file").write_text("x")
    return tmp_path


# (id, overrides, substrings the message must contain) -- stage 1: the configuration itself
CONFIG_STAGE = [
    ("typo", [f"{A}.actor.ppo_mini_batch_sz=3"], [f"{A}.actor.ppo_mini_batch_size"]),
    ("type", [f"{A}.rollout.temperature=hot"], [f"{A}.rollout.temperature"]),
    ("megatron_vpp", [f"{A}.actor.strategy=megatron", f"{A}.actor.megatron.virtual_pipeline_model_parallel_size=2"],
     [f"{A}.actor.megatron.virtual_pipeline_model_parallel_size=2", "pipeline_model_parallel_size > 1"]),
    ("choice", ["data.truncation=sideways"], ["data.truncation"]),
    ("batch_split", ["data.train_batch_size=3", f"{A}.actor.ppo_mini_batch_size=3", "trainer.n_gpus_per_node=2",
                     f"{A}.rollout.n=1"], ["data.train_batch_size=3"]),
    ("mini_gt_train", [f"{A}.actor.ppo_mini_batch_size=16"], [f"{A}.actor.ppo_mini_batch_size=16"]),
    ("micro_missing", [f"{A}.actor.ppo_micro_batch_size_per_gpu=null"], [f"{A}.actor.ppo_micro_batch_size_per_gpu"]),
    ("estimator", ["algorithm.adv_estimator=grpoo"], ["algorithm.adv_estimator='grpoo'"]),
    ("policy_loss", [f"{A}.actor.policy_loss.loss_mode=clipp"], [f"{A}.actor.policy_loss.loss_mode='clipp'"]),
    ("otb", ["algorithm.adv_estimator=optimal_token_baseline"], [f"{A}.actor.calculate_sum_pi_squared=true"]),
    ("passk_n1", ["algorithm.adv_estimator=grpo_passk", f"{A}.rollout.n=1"], [f"{A}.rollout.n"]),
    ("temperature0", [f"{A}.rollout.temperature=0"], [f"{A}.rollout.temperature"]),
    ("cosine", [f"{A}.actor.optim.lr_scheduler_type=cosine", f"{A}.actor.optim.min_lr_ratio=null"],
     [f"{A}.actor.optim.min_lr_ratio"]),
    ("bypass", ["algorithm.rollout_correction.bypass_mode=true"], [f"{A}.rollout.calculate_log_probs=true"]),
    ("rollout_is", [f"{A}.rollout.calculate_log_probs=true", "algorithm.rollout_correction.rollout_is=tokens"],
     ["algorithm.rollout_correction.rollout_is"]),
    ("rs_threshold", ["algorithm.rollout_correction.rollout_rs_threshold=0.6_1.6"],
     ["algorithm.rollout_correction.rollout_rs_threshold"]),
    ("async_mode", ["async_training.mode=fully_sync"], ["async_training.mode"]),
    ("one_step_off", ["async_training.mode=one_step_off"], [f"{A}.hybrid_engine=false"]),
    ("fully_async_key", ["async_training.staleness_threshold=0.5"], ["async_training.staleness_threshold"]),
    ("async_reward", ["reward_model.launch_reward_fn_async=true", "algorithm.filter_groups.enable=true",
                      "algorithm.filter_groups.metric=acc"], ["reward_model.launch_reward_fn_async"]),
    ("remax", ["algorithm.adv_estimator=remax", f"{A}.rollout.val_kwargs.do_sample=true",
               f"{A}.rollout.val_kwargs.temperature=1.0"], [f"{A}.rollout.val_kwargs.do_sample=false"]),
    ("reward_manager", ["reward_model.reward_manager=naiive"], ["reward_model.reward_manager='naiive'"]),
    ("importlib_manager", ["reward.reward_manager.source=importlib"], ["reward.reward_manager.module.path"]),
    ("import_modules", ["trainer.import_modules=[no_such_user_module_xyz]"], ["trainer.import_modules[0]"]),
    ("trtllm", [f"{A}.rollout.name=trtllm"], [f"{A}.rollout.name=trtllm"]),
    ("ulysses", [f"{A}.actor.ulysses_sequence_parallel_size=2"], [f"{A}.actor.ulysses_sequence_parallel_size=2"]),
    ("prefix_grouper_sp", [f"{A}.actor.use_prefix_grouper=true", f"{A}.actor.ulysses_sequence_parallel_size=2"],
     [f"{A}.actor.use_prefix_grouper=true with {A}.actor.ulysses_sequence_parallel_size=2"]),
    ("use_v1", ["trainer.use_v1=true", "trainer.v1.trainer_mode=overlap"], ["trainer.v1.trainer_mode='overlap'"]),
    ("distillation", ["distillation.enabled=true"], ["distillation.teacher_models.teacher_model.model_path"]),
    ("genrm", ["reward.reward_model.rollout.name=hf", "reward.custom_reward_function.path=x.py"],
     ["reward_model.enable=true"]),
    ("alias_conflict", ["reward.num_workers=2", "reward_model.num_workers=3"],
     ["reward.num_workers=2 and reward_model.num_workers=3"]),
    ("mirror", [f"{A}.actor.rollout_n=5"], [f"{A}.actor.rollout_n=5"]),
    ("model_engine", ["model_engine=torchtitan"], ["model_engine=torchtitan"]),
    ("torchtitan", [f"+{A}.actor.torchtitan.param_offload=true"], [f"{A}.actor.torchtitan.param_offload"]),
]

# stage 2: the machine and the files (these passed load_config and used to fail after Ray and the models started)
RUN_STAGE = [
    ("vllm_tp_on_cpu", [f"{A}.rollout.name=vllm"], [f"{A}.rollout.tensor_model_parallel_size=2"]),
    ("sglang_on_cpu", [f"{A}.rollout.name=sglang"], [f"{A}.rollout.name=sglang"]),
    ("precision", ["trainer.device=cuda", f"{A}.rollout.calculate_log_probs=true", f"{A}.rollout.dtype=float16"],
     [f"{A}.rollout.dtype=float16", f"{A}.actor.fsdp_config.dtype"]),
    ("model_missing", [f"{A}.model.path={{tmp}}/no_model"], [f"{A}.model.path="]),
    ("data_missing", ["data.train_files={tmp}/no.parquet"], ["data.train_files"]),
    ("data_too_small", ["data.train_batch_size=32", f"{A}.actor.ppo_mini_batch_size=32"],
     ["data.train_files", "data.train_batch_size=32"]),
    ("val_missing", ["data.val_files={tmp}/no_val.parquet"], ["data.val_files"]),
    ("reward_file", ["custom_reward_function.path={tmp}/missing_reward.py"], ["custom_reward_function.path="]),
    ("reward_name", ["custom_reward_function.path={tmp}/reward_ok.py", "custom_reward_function.name=score"],
     ["custom_reward_function.path=", "'score'"]),
    ("reward_signature", ["custom_reward_function.path={tmp}/reward_bad_signature.py"],
     ["custom_reward_function.path", "solution_str"]),
    ("custom_dataset", ["data.custom_cls.path={tmp}/no_ds.py", "data.custom_cls.name=MyDataset"],
     ["data.custom_cls.path="]),
    ("external_lib", [f"{A}.model.external_lib=no_such_model_lib_xyz"], [f"{A}.model.external_lib="]),
    ("optimizer", [f"{A}.actor.optim.optimizer=AdamWW"], [f"{A}.actor.optim.optimizer='AdamWW'"]),
    ("optimizer_impl", [f"{A}.actor.optim.optimizer_impl=no_such_optim_pkg"],
     [f"{A}.actor.optim.optimizer_impl='no_such_optim_pkg'"]),
    ("tool_config", [f"{A}.rollout.multi_turn.tool_config_path={{tmp}}/tools_bad.yaml"],
     [f"{A}.rollout.multi_turn.tool_config_path", "no_such_pkg.mod"]),
    ("agent_loop_file", [f"{A}.rollout.agent.agent_loop_config_path={{tmp}}/loops_bad.yaml"],
     [f"{A}.rollout.agent.agent_loop_config_path", "no_such_pkg.loops"]),
    ("agent_loop_class", [f"{A}.rollout.agent.agent_loop_config_path={{tmp}}/loops_no_class.yaml"],
     [f"{A}.rollout.agent.agent_loop_config_path", "has no attribute 'NoSuchLoop'"]),
    ("default_agent_loop", [f"{A}.rollout.agent.default_agent_loop=my_loop"],
     [f"{A}.rollout.agent.default_agent_loop='my_loop'"]),
    ("tool_format", [f"{A}.rollout.multi_turn.format=qwen"], [f"{A}.rollout.multi_turn.format='qwen'"]),
    ("output_dir", ["trainer.default_local_dir={tmp}/a_file/ckpt"], ["trainer.default_local_dir="]),
    ("pipeline_split", [f"{A}.actor.strategy=megatron", f"{A}.actor.megatron.pipeline_model_parallel_size=2",
                        "trainer.n_gpus_per_node=2", f"+{A}.actor.megatron.override_transformer_config."
                        "num_layers_in_first_pipeline_stage=3"],
     [f"{A}.actor.megatron.pipeline_model_parallel_size: 2 decoder layers cannot be split into 2 stages"]),
]


@pytest.mark.parametrize("case,overrides,needles", CONFIG_STAGE + RUN_STAGE,
                         ids=[c[0] for c in CONFIG_STAGE + RUN_STAGE])
def test_dry_run_exits_2_naming_the_key(case, overrides, needles, dry_run_assets, bad_files):
    args = [*dry_run_assets, *GOOD, *(o.format(tmp=bad_files) for o in overrides)]
    rc, err = dry_run(args, bad_files)
    assert rc == 2, f"{case}: exit {rc}\n{err}"
    for needle in needles:
        assert needle in err, f"{case}: {needle!r} not in\n{err}"
    assert "Traceback" not in err


def test_the_good_configuration_passes_every_check(dry_run_assets, tmp_path):
    rc, err = dry_run([*dry_run_assets, *GOOD], tmp_path)
    assert rc == 0, err


def test_all_problems_of_a_stage_are_reported_at_once(dry_run_assets, bad_files):
    rc, err = dry_run([*dry_run_assets, *GOOD, "data.train_files={}/no.parquet".format(bad_files),
                       "custom_reward_function.path={}/missing_reward.py".format(bad_files),
                       f"{A}.rollout.multi_turn.format=qwen"], bad_files)
    assert rc == 2
    assert "data.train_files" in err and "custom_reward_function.path=" in err and "multi_turn.format" in err


def test_a_served_seq_cls_reward_model_runs_on_the_reward_model_worker(dry_run_assets, tmp_path):
    """verl 0.9 serves a sequence-classification reward model through its rollout keys; here the reward-model worker
    scores it (the same score), the command line passes every check, and the note says the engine keys are not read."""
    rm = ["reward.reward_model.enable=true"]
    served = ["reward.reward_model.rollout.name=vllm", "reward.reward_model.rollout.tensor_model_parallel_size=1",
              "reward.reward_model.rollout.gpu_memory_utilization=0.5"]
    rc, err = dry_run([*dry_run_assets, *GOOD, *rm, *served], tmp_path)
    assert rc == 0, err
    assert "discriminative (sequence-classification) reward model" in err and "not read" in err, err


def test_prefix_grouper_passes_the_checks(dry_run_assets, tmp_path):
    rc, err = dry_run([*dry_run_assets, *GOOD, f"{A}.actor.use_prefix_grouper=true"], tmp_path)
    assert rc == 0, err


def test_over_sample_rate_is_inert_as_in_verl(dry_run_assets, tmp_path):
    """verl reads rollout.over_sample_rate nowhere (its SGLang SPMD reader is gone): a command line setting it runs,
    with the key named in the note of keys without effect."""
    rc, err = dry_run([*dry_run_assets, *GOOD, f"{A}.rollout.over_sample_rate=0.1"], tmp_path)
    assert rc == 0, err
    assert "have no effect" in err and f"{A}.rollout.over_sample_rate=0.1" in err
