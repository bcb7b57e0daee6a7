"""Config loading: verl override grammar, interpolation, typing, and the error messages users see."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from hybridflow.config import ConfigError, parse_command_line
from hybridflow.launch.config import load_config
from hybridflow.config.plan import plan_step

MICRO = ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "critic.ppo_micro_batch_size_per_gpu=4"]


def errors_of(overrides):
    with pytest.raises(ConfigError) as e:
        load_config(overrides)
    return "\n".join(e.value.messages)


def test_defaults_load_and_interpolate():
    cfg = load_config(MICRO + ["data.max_prompt_length=77", "data.max_response_length=33"])
    assert cfg.actor_rollout_ref.rollout.prompt_length == 77
    assert cfg.actor_rollout_ref.rollout.response_length == 33
    # critic follows the actor where verl does
    assert cfg.critic.ppo_mini_batch_size == cfg.actor_rollout_ref.actor.ppo_mini_batch_size
    assert cfg.critic.ppo_epochs == 1 and cfg.critic.loss_agg_mode == "token-mean"
    assert cfg.use_critic  # gae by default
    assert cfg.trainer.default_local_dir == "checkpoints/verl_examples/gsm8k"


def test_override_grammar_add_delete_lists():
    cfg = load_config(MICRO + [
        "trainer.logger=[console,file]",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.len=4",
        "+actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=2",
        "~actor_rollout_ref.model.override_config",
        "+actor_rollout_ref.model.override_config.attn_implementation=eager",
        "+trainer.val_before_train=False",  # '+' on an existing key, as some verl scripts write it
    ])
    assert cfg.trainer.logger == ["console", "file"]
    assert cfg.reward_model.reward_kwargs == {"overlong_buffer_cfg": {"len": 4}}
    assert cfg.actor_rollout_ref.rollout.engine_kwargs["vllm"] == {"swap_space": 2}
    assert cfg.actor_rollout_ref.model.override_config == {"attn_implementation": "eager"}
    assert cfg.trainer.val_before_train is False


def test_critic_follows_actor_and_types_are_coerced():
    cfg = load_config(MICRO + ["actor_rollout_ref.actor.ppo_epochs=3", "actor_rollout_ref.actor.optim.lr=1",
                               "trainer.experiment_name=123"])
    assert cfg.critic.ppo_epochs == 3
    assert isinstance(cfg.actor_rollout_ref.actor.optim.lr, float)
    assert cfg.trainer.experiment_name == "123"


def test_unknown_key_names_closest():
    msg = errors_of(MICRO + ["actor_rollout_ref.actor.ppo_mini_batch_sz=3"])
    assert "unknown config key 'actor_rollout_ref.actor.ppo_mini_batch_sz'" in msg
    assert "did you mean 'actor_rollout_ref.actor.ppo_mini_batch_size'" in msg


def test_added_unknown_key_in_typed_node_is_rejected():
    msg = errors_of(MICRO + ["+actor_rollout_ref.actor.clip_ratoi_high=0.3"])
    assert "did you mean 'actor_rollout_ref.actor.clip_ratio_high'" in msg


def test_wrong_type_names_field():
    msg = errors_of(MICRO + ["actor_rollout_ref.rollout.temperature=hot"])
    assert "'actor_rollout_ref.rollout.temperature' expects a number, got 'hot'" in msg


def test_unsupported_choices_list_alternatives():
    msg = errors_of(MICRO + ["actor_rollout_ref.rollout.name=lmdeploy", "data.truncation=sideways",
                             "actor_rollout_ref.actor.loss_agg_mode=mean"])
    assert "rollout.name='lmdeploy' is not supported; choose one of: hf, vllm, sglang" in msg
    assert "data.truncation='sideways'" in msg and "error, left, right, middle" in msg
    assert "loss_agg_mode='mean' is not a loss aggregation mode" in msg


def test_batch_size_vocabulary_uses_users_numbers():
    msg = errors_of(["algorithm.adv_estimator=grpo", "data.train_batch_size=3", "actor_rollout_ref.rollout.n=5",
                     "actor_rollout_ref.actor.ppo_mini_batch_size=4", "trainer.n_gpus_per_node=2"])
    assert "data.train_batch_size=3 prompts x rollout.n=5 = 15 trajectories" in msg
    assert "ppo_mini_batch_size=4 is larger than data.train_batch_size=3; both count prompts" in msg
    assert "ppo_micro_batch_size_per_gpu is not set" in msg


def test_micro_batch_need_not_divide_the_per_device_share_but_must_be_positive():
    """As in verl 0.9 a size that does not divide the share leaves a shorter last micro-batch (the update does not
    depend on the split: tests/workers/test_actor.py); zero is refused with the user's numbers."""
    base = ["algorithm.adv_estimator=grpo", "data.train_batch_size=8", "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4", "trainer.n_gpus_per_node=2"]
    load_config(base + ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"])
    msg = errors_of(base + ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=0"])
    assert "4 prompts x rollout.n=4 / 2 devices = 8" in msg and "must be >= 1" in msg


def test_deprecated_global_micro_batch_is_converted():
    with pytest.warns(UserWarning, match="deprecated"):
        cfg = load_config(["algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.ppo_micro_batch_size=64"])
    assert cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 8  # 64 over 8 devices


def test_parse_command_line_splits_hydra_flags():
    cl = parse_command_line(["--config-path", "/x", "--config-name=my", "--dry-run", "a.b=1"])
    assert (cl.config_path, cl.config_name, cl.dry_run, cl.overrides) == ("/x", "my", True, ["a.b=1"])


def test_user_config_file_with_defaults_list(tmp_path):
    (tmp_path / "my_grpo.yaml").write_text(textwrap.dedent("""
        defaults:
          - ppo_trainer
          - _self_
        algorithm:
          adv_estimator: grpo
        actor_rollout_ref:
          rollout: {n: 4}
          actor: {ppo_micro_batch_size_per_gpu: 2}
    """))
    cfg = load_config(["data.train_batch_size=16", "actor_rollout_ref.actor.ppo_mini_batch_size=8"], config_path=str(tmp_path), config_name="my_grpo")
    assert cfg.algorithm.adv_estimator == "grpo" and cfg.actor_rollout_ref.rollout.n == 4
    assert cfg.data.train_batch_size == 16


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "hybridflow", *args], capture_output=True, text=True, timeout=120)


def test_cli_dry_run_ok_and_error_exit_codes(dry_run_assets):
    ok = run_cli("train", "--dry-run", "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=5",
                 "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8", *dry_run_assets,
                 "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8")
    assert ok.returncode == 0, ok.stderr
    assert "adv_estimator: grpo" in ok.stdout and "8 prompts x rollout.n=5 = 40 trajectories" in ok.stdout
    # the step plan, decided once: exact log-probs (the default for hf on CPU) make the rollout's log-probs pi_old
    assert "# pi_old: the rollout's own log-probs" in ok.stdout
    bad = run_cli("train", "--dry-run", "actor_rollout_ref.actor.ppo_mini_batch_sz=3")
    assert bad.returncode == 2
    assert "did you mean 'actor_rollout_ref.actor.ppo_mini_batch_size'" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_optim_clip_grad_is_honoured_and_a_missing_engine_is_refused():
    with pytest.warns(UserWarning) as rec:
        cfg = load_config(MICRO + ["actor_rollout_ref.actor.optim.clip_grad=0.5"])
    assert cfg.actor_rollout_ref.actor.grad_clip == 0.5
    assert any("clip_grad=0.5 is used as actor_rollout_ref.actor.grad_clip" in str(w.message) for w in rec)
    assert "no TensorRT-LLM adapter; use actor_rollout_ref.rollout.name=vllm" in errors_of(
        MICRO + ["actor_rollout_ref.rollout.name=trtllm"])


def test_cli_subcommands_return_exit_code_zero(tmp_path):
    out = run_cli("data", "synthetic", "--task", "addition", "--local-dir", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "wrote" in out.stdout and any(tmp_path.rglob("*.parquet"))


def test_optimal_token_baseline_needs_sum_pi_squared_and_accepts_the_script_spelling():
    msg = errors_of(MICRO + ["algorithm.adv_estimator=optimal_token_baseline"])
    assert "set actor_rollout_ref.actor.calculate_sum_pi_squared=true" in msg
    cfg = load_config(MICRO + ["algorithm.adv_estimator=optimal_token_baseline",
                               "actor_rollout_ref.actor.compute_sum_pi_squared=True"])
    assert cfg.actor_rollout_ref.actor.calculate_sum_pi_squared is True


def test_rollout_log_probs_as_pi_old_need_the_training_precision():
    """The run stage's precision rule reads the step plan's reuse_rollout_log_probs (one rule, one place)."""
    from hybridflow.config.checks import Check, RunContext, run_checks
    from hybridflow.config.checks.machine import check_rollout_precision
    from hybridflow.launch.config import check_rollout_hardware

    def run_stage(overrides, device):
        cfg = load_config(overrides)
        checks = (Check("rollout_hardware", check_rollout_hardware), Check("precision", check_rollout_precision))
        return run_checks(cfg, checks, RunContext(cfg, _device=device))

    def errors(overrides, device="cuda"):
        with pytest.raises(ConfigError) as e:
            run_stage(overrides, device)
        return str(e.value)

    base = MICRO + ["data.train_batch_size=8", "trainer.n_gpus_per_node=1", "trainer.device=cuda",
                    "actor_rollout_ref.rollout.calculate_log_probs=true"]
    on_policy = base + ["actor_rollout_ref.actor.ppo_mini_batch_size=8"]
    assert plan_step(load_config(on_policy)).reuse_rollout_log_probs
    msg = errors(on_policy + ["actor_rollout_ref.rollout.dtype=float16"])
    assert "rollout.dtype=float16 but actor_rollout_ref.actor.fsdp_config.dtype=bfloat16" in msg
    assert "uses the rollout's log-probs as pi_old" in msg
    run_stage(on_policy + ["actor_rollout_ref.rollout.dtype=bf16"], "cuda")  # same precision, other spelling
    run_stage(on_policy, "cuda")  # the defaults agree (bfloat16 both)
    # the actor recomputes pi_old (two mini-batches): no constraint
    run_stage(base + ["actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.rollout.dtype=float16"],
              "cuda")
    # optimal_token_baseline needs the actor's pass: the plan does not reuse the rollout's log-probs, no constraint
    run_stage(on_policy + ["actor_rollout_ref.rollout.dtype=float16", "algorithm.adv_estimator=optimal_token_baseline",
                           "actor_rollout_ref.actor.calculate_sum_pi_squared=true"], "cuda")
    run_stage(on_policy + ["actor_rollout_ref.rollout.dtype=float16", "trainer.device=cpu"], "cpu")  # CPU: fp32 both
    assert "not a dtype" in errors_of(MICRO + ["actor_rollout_ref.rollout.dtype=bf17"])
    with pytest.warns(UserWarning) as rec:  # CPU: say that these do nothing there (defaults stay silent)
        run_stage(MICRO + ["trainer.device=cpu", "actor_rollout_ref.rollout.dtype=float16",
                           "actor_rollout_ref.rollout.gpu_memory_utilization=0.9"], "cpu")
    text = "\n".join(str(w.message) for w in rec)
    assert "rollout.dtype=float16 has no effect on CPU" in text
    assert "gpu_memory_utilization=0.9 has no effect on CPU" in text
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run_stage(MICRO + ["trainer.device=cpu"], "cpu")