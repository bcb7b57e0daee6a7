"""Unwritable output folders and a full disk are reported before any model is loaded (the check pipeline's run
stage, config/checks/outputs.py)."""

from __future__ import annotations

import shutil

import pytest

from hybridflow.launch.config import load_config
from hybridflow.config import ConfigError
from hybridflow.config.checks import outputs as preflight
from hybridflow.config.checks.outputs import PreflightError
from hybridflow.launch.config import check_for_run

from .conftest import base_args, invoke_cli, read_metrics


def _blocked(tmp_path):
    """A path no user can create a folder at, root included: its parent is a regular file."""
    (tmp_path / "a_file").write_text("x")
    return tmp_path / "a_file" / "ckpt"


def test_unwritable_checkpoint_dir_names_the_key_and_the_fix(tmp_path):
    with pytest.raises(PreflightError, match=r"trainer\.default_local_dir=.*a_file/ckpt is not a writable folder"):
        preflight.check_writable("trainer.default_local_dir", _blocked(tmp_path))


def test_writable_check_leaves_nothing_behind(tmp_path):
    assert preflight.check_writable("trainer.default_local_dir", tmp_path / "new" / "ckpt") == tmp_path
    assert list(tmp_path.iterdir()) == []  # no folder created, the probe file is gone
    (tmp_path / "ckpt").mkdir()
    assert preflight.check_writable("trainer.default_local_dir", tmp_path / "ckpt") == tmp_path / "ckpt"
    assert list((tmp_path / "ckpt").iterdir()) == []


def test_not_enough_free_space_is_reported_with_sizes(tmp_path):
    free = shutil.disk_usage(tmp_path).free
    assert preflight.check_free_space("trainer.default_local_dir", tmp_path, 1) >= 1
    with pytest.raises(PreflightError, match=r"MiB free on that disk, but one checkpoint needs about .* MiB"):
        preflight.check_free_space("trainer.default_local_dir", tmp_path / "not" / "yet", free * 2)


def test_checkpoint_estimate_counts_params_and_adam_moments(tmp_path, nano_model_dir, fault_data):
    cfg = load_config(base_args(nano_model_dir, fault_data / "train.parquet", tmp_path))
    weights = preflight.model_bytes(nano_model_dir)
    assert weights > 0
    assert preflight.estimate_checkpoint_bytes(cfg) == 6 * weights  # GRPO: actor only, fp32 x (param + 2 moments)
    cfg_ppo = load_config(base_args(nano_model_dir, fault_data / "train.parquet", tmp_path,
                                    extra=["algorithm.adv_estimator=gae", "critic.ppo_micro_batch_size_per_gpu=8",
                                           "critic.forward_micro_batch_size_per_gpu=8"]))
    assert preflight.estimate_checkpoint_bytes(cfg_ppo) == 12 * weights  # + critic


def test_the_run_stage_checks_every_configured_output_dir(tmp_path, nano_model_dir, fault_data):
    cfg = load_config(base_args(nano_model_dir, fault_data / "train.parquet", tmp_path,
                                extra=[f"trainer.rollout_data_dir={_blocked(tmp_path)}", "trainer.save_freq=1"]))
    with pytest.raises(ConfigError, match=r"\n  - trainer\.rollout_data_dir="):
        check_for_run(cfg, logger_dir=tmp_path / "logs")
    ok = load_config(base_args(nano_model_dir, fault_data / "train.parquet", tmp_path, extra=["trainer.save_freq=1"]))
    check_for_run(ok, logger_dir=tmp_path / "logs")  # the tiny model fits: no error


def test_cli_refuses_unwritable_output_before_training(tmp_path, nano_model_dir, fault_data):
    args = base_args(nano_model_dir, fault_data / "train.parquet", tmp_path,
                     extra=[f"trainer.default_local_dir={_blocked(tmp_path)}", "trainer.save_freq=1"])
    result = invoke_cli(args, tmp_path)
    assert result.rc != 0 and "trainer.default_local_dir" in result.message and "not a writable folder" in result.message
    assert read_metrics(tmp_path) == []  # nothing trained


def test_cli_refuses_a_vision_model_with_vllm_servers_before_training(tmp_path, tiny_vlm_dir, fault_data):
    """``hybrid_engine=false rollout.name=vllm`` with a Qwen2-VL checkpoint: exit 2 with the key and the fix,
    before any worker or vLLM server starts (the server replicas take no images; the colocated engine does, see
    docs/vision.md)."""
    args = base_args(tiny_vlm_dir, fault_data / "train.parquet", tmp_path,
                     extra=["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.hybrid_engine=false",
                            "actor_rollout_ref.rollout.tensor_model_parallel_size=1"])
    result = invoke_cli(args, tmp_path)
    assert result.rc == 2, result.message
    assert "actor_rollout_ref.rollout.name=vllm" in result.message and "actor_rollout_ref.rollout.name=hf" in result.message
    assert "carries no images" in result.message
    assert read_metrics(tmp_path) == []


def test_cli_refuses_a_vision_model_vllm_cannot_load_before_training(tmp_path, tiny_vlm_dir, fault_data):
    """Colocated ``rollout.name=vllm`` with a Qwen2-VL checkpoint whose processor needs torchvision (none here,
    and no image-only processor in the folder): exit 2 naming the key and both fixes, before any worker starts."""
    args = base_args(tiny_vlm_dir, fault_data / "train.parquet", tmp_path,
                     extra=["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.tensor_model_parallel_size=1"])
    result = invoke_cli(args, tmp_path)
    assert result.rc == 2, result.message
    assert "actor_rollout_ref.rollout.name=vllm" in result.message and "write_image_only_processor" in result.message
    assert "actor_rollout_ref.rollout.name=hf" in result.message
    assert read_metrics(tmp_path) == []


def test_an_overlong_prompt_and_a_huge_row_are_refused_at_the_run_stage(tmp_path, nano_model_dir, fault_data):
    """Issue 34: an overlong prompt was found only when a step drew it (after 8 steps), and a 200 MB row went to the
    tokenizer. Both are now run-stage errors naming the file and row, before anything starts."""
    from hybridflow.data.io import read_rows, write_parquet

    rows = read_rows(str(fault_data / "train.parquet"))
    long_rows = [dict(r) for r in rows]
    long_rows[11] = dict(rows[11], prompt=[{"role": "user", "content": "1+1=" * 40}])
    overlong = write_parquet(long_rows, str(tmp_path / "overlong.parquet"))
    cfg = load_config(base_args(nano_model_dir, overlong, tmp_path))
    with pytest.raises(ConfigError) as err:
        check_for_run(cfg, logger_dir=tmp_path / "logs")
    assert f"data.train_files: row 11 of '{overlong}': prompt is" in str(err.value)
    assert "data.max_prompt_length=32" in str(err.value) and "data.filter_overlong_prompts=true" in str(err.value)
    check_for_run(load_config(base_args(nano_model_dir, overlong, tmp_path,  # the filter drops it instead
                                        extra=["data.filter_overlong_prompts=true"])), logger_dir=tmp_path / "logs")
    huge_rows = [dict(r) for r in rows]
    huge_rows[3] = dict(rows[3], extra_info={**rows[3]["extra_info"], "blob": "x" * 3000})
    huge = write_parquet(huge_rows, str(tmp_path / "huge.parquet"))
    cfg = load_config(base_args(nano_model_dir, huge, tmp_path, extra=["data.max_row_bytes=2048"]))
    with pytest.raises(ConfigError, match=rf"data.train_files: row 3 of '{huge}' holds .* over data.max_row_bytes=2048"):
        check_for_run(cfg, logger_dir=tmp_path / "logs")
