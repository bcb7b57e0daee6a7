"""What ``VLLMRolloutEngine`` and ``VLLMServerFleet`` decide before vLLM starts, tested without vLLM (the modules
import it lazily)."""

from __future__ import annotations

import re

import pytest

from hybridflow.launch.config import load_config

BASE = ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "critic.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.name=vllm"]


def test_the_vllm_engines_own_settings_without_vllm(tmp_path):
    """What ``VLLMRolloutEngine`` decides before vLLM starts (importable without vLLM): the config's free_cache_engine
    and bucket size unless given, ``engine_args`` last, LoRA's settings over dummy weights, the engine core's
    process."""
    from hybridflow.rollout.vllm.config import enable_lora
    from hybridflow.rollout.vllm.engine import _engine_core_in_child, _engine_settings

    rollout = load_config(BASE + ["actor_rollout_ref.rollout.free_cache_engine=false",
                                  "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=64",
                                  "actor_rollout_ref.rollout.load_format=dummy"]).actor_rollout_ref.rollout
    kw, free, mb = _engine_settings(str(tmp_path), rollout, {"seed": 9}, "cuda", 0, True, None, None)
    assert (free, mb, kw["seed"], kw["load_format"]) == (False, 64, 9, "dummy")
    assert _engine_settings(str(tmp_path), rollout, None, "cuda", 0, True, True, 8)[1:] == (True, 8)
    bare, free, mb = _engine_settings(str(tmp_path), None, None, "cpu", 0, True, None, None)
    assert bare == {"model": str(tmp_path), "skip_tokenizer_init": True, "logprobs_mode": "processed_logprobs"}
    with pytest.raises(ValueError, match="rollout_config needs model_path"):
        _engine_settings(None, rollout, None, "cuda", 0, True, None, None)
    with pytest.raises(ValueError, match=re.escape("needs model_path (or engine_args['model'])")):
        _engine_settings(None, None, {"seed": 1}, "cuda", 0, True, None, None)
    enable_lora(kw, 12)
    assert (kw["load_format"], kw["enable_lora"], kw["max_lora_rank"], kw["max_loras"]) == ("auto", True, 16, 1)
    assert _engine_core_in_child(True) and not _engine_core_in_child(None)  # no torch.distributed group here


def test_the_server_fleets_engine_arguments(nano_model_dir, tiny_vlm_dir):
    from hybridflow.rollout.vllm.server_fleet import _server_engine_kwargs
    from hybridflow.rollout.vllm.weight_check import EXTENSION

    kw = _server_engine_kwargs(nano_model_dir, {"load_format": "dummy", "enable_chunked_prefill": True}, "cpu", 12, 300)
    assert kw["model"] == nano_model_dir and kw["load_format"] == "auto"  # reloads read safetensors folders
    assert kw["disable_log_stats"] is False  # the stall watchdog reads the servers' token counters
    assert kw["enable_chunked_prefill"] is False  # CPU
    assert (kw["enable_lora"], kw["max_lora_rank"], kw["max_loras"], kw["worker_extension_cls"]) == (
        True, 16, 1, EXTENSION)
    plain = _server_engine_kwargs(nano_model_dir, {"worker_extension_cls": "mine.Ext"}, "cuda", 0, 0)
    assert "enable_lora" not in plain and "disable_log_stats" not in plain
    assert plain["worker_extension_cls"] == "mine.Ext"
    with pytest.raises(ValueError, match="hybrid_engine=false.*carries no images"):
        _server_engine_kwargs(tiny_vlm_dir, {}, "cpu", 0, 300)
