"""verl's vLLM keys: each one reaches the engine arguments, or is refused on hardware where it cannot act."""

from __future__ import annotations

import re

import pytest

from hybridflow.config import ConfigError
from hybridflow.launch.config import load_config
from hybridflow.config.checks import Check, RunContext, run_checks
from hybridflow.launch.config import check_rollout_hardware, rollout_hardware_errors, rollout_model_errors
from hybridflow.rollout.vllm.config import engine_kwargs_to_cli, kv_cache_bytes_needed, vllm_engine_kwargs

BASE = ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "critic.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.name=vllm"]


def hardware_check(overrides, device=None):
    """The pipeline's rollout_hardware check (run stage) on the loaded config; ``device`` as the run resolved it."""
    cfg = load_config(overrides)
    return run_checks(cfg, (Check("rollout_hardware", check_rollout_hardware),), RunContext(cfg, _device=device))


def test_tensor_parallel_on_cpu_is_refused_with_the_fix():
    with pytest.raises(ConfigError) as e:
        hardware_check(BASE + ["trainer.device=cpu"])  # verl's default tensor_model_parallel_size is 2
    msg = str(e.value)
    assert "actor_rollout_ref.rollout.tensor_model_parallel_size=2" in msg
    assert "set actor_rollout_ref.rollout.tensor_model_parallel_size=1" in msg
    cfg = load_config(BASE + ["trainer.device=cpu", "actor_rollout_ref.rollout.tensor_model_parallel_size=1"])
    assert rollout_hardware_errors(cfg, "cpu") == []
    for key in ("data_parallel_size=2", "pipeline_model_parallel_size=2", "cudagraph_capture_sizes=[1,2]"):
        with pytest.raises(ConfigError, match=key.split("=")[0]):
            hardware_check(BASE + ["trainer.device=cpu", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
                                   f"actor_rollout_ref.rollout.{key}"])


def test_gpu_jobs_load_and_are_checked_with_the_device_the_run_resolves():
    cfg = load_config(BASE)  # trainer.device=auto: the configuration stage knows no device
    assert rollout_hardware_errors(cfg, "cuda") == []
    with pytest.raises(ConfigError, match=r"tensor_model_parallel_size=2.*trainer.device=auto found no GPU here.*"
                                          r"dry-run it with trainer.device=cuda"):
        hardware_check(BASE, device="cpu")  # what `hybridflow train` (and --dry-run) refuse on a CPU machine
    hardware_check(BASE + ["trainer.device=cuda"])  # a GPU job checked from a CPU machine


def test_sglang_on_cpu_is_refused():
    with pytest.raises(ConfigError, match="SGLang has no CPU build"):
        hardware_check(BASE[:2] + ["actor_rollout_ref.rollout.name=sglang", "trainer.device=cpu"])


def test_every_vllm_key_reaches_the_engine_arguments(tmp_path):
    cfg = load_config(BASE + [
        "trainer.device=cpu", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.dtype=float32", "actor_rollout_ref.rollout.max_num_batched_tokens=3000",
        "actor_rollout_ref.rollout.max_num_seqs=17", "actor_rollout_ref.rollout.enable_chunked_prefill=false",
        "actor_rollout_ref.rollout.enable_prefix_caching=false", "actor_rollout_ref.rollout.enforce_eager=true",
        "actor_rollout_ref.rollout.load_format=auto", "actor_rollout_ref.rollout.seed=3",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.3", "data.max_prompt_length=100",
        "data.max_response_length=60", "+actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=2",
    ])
    rollout = cfg.actor_rollout_ref.rollout
    kw = vllm_engine_kwargs(rollout, str(tmp_path), "cuda")
    assert kw["dtype"] == "float32" and kw["max_num_seqs"] == 17 and kw["seed"] == 3
    assert kw["max_model_len"] == 160  # prompt + response when max_model_len is unset
    assert kw["max_num_batched_tokens"] == 3000 and kw["enable_chunked_prefill"] is False
    assert kw["enable_prefix_caching"] is False and kw["enforce_eager"] is True and kw["load_format"] == "auto"
    assert kw["tensor_parallel_size"] == 1 and kw["data_parallel_size"] == 1
    assert kw["gpu_memory_utilization"] == 0.3 and kw["enable_sleep_mode"] is True  # free_cache_engine default
    assert kw["swap_space"] == 2 and kw["logprobs_mode"] == "processed_logprobs"
    rollout.max_model_len = 4000
    assert vllm_engine_kwargs(rollout, str(tmp_path), "cuda")["max_num_batched_tokens"] == 4000  # no chunking
    rollout.free_cache_engine = False
    assert vllm_engine_kwargs(rollout, str(tmp_path), "cuda")["enable_sleep_mode"] is False
    assert vllm_engine_kwargs(rollout, str(tmp_path), "cuda", lora_rank=12)["max_lora_rank"] == 16


def test_cpu_kv_cache_is_sized_by_max_num_seqs_and_capped_by_memory_utilization(tiny_model_dir, monkeypatch):
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    cfg = load_config(BASE + ["actor_rollout_ref.rollout.tensor_model_parallel_size=1", "trainer.device=cpu",
                              "actor_rollout_ref.rollout.max_num_seqs=8", "actor_rollout_ref.rollout.dtype=float32",
                              "actor_rollout_ref.rollout.max_model_len=4096"])
    rollout = cfg.actor_rollout_ref.rollout
    need = kv_cache_bytes_needed(tiny_model_dir, 8, 4096, "float32")
    assert need == 2 * 2 * 2 * 32 * 4 * 8 * 4096  # K+V x layers x kv_heads x head_dim x fp32 x seqs x tokens
    assert vllm_engine_kwargs(rollout, tiny_model_dir, "cpu")["kv_cache_memory_bytes"] == max(need, 64 << 20)
    rollout.max_num_seqs = 10**6
    rollout.gpu_memory_utilization = 0.01
    capped = vllm_engine_kwargs(rollout, tiny_model_dir, "cpu")["kv_cache_memory_bytes"]
    assert capped < kv_cache_bytes_needed(tiny_model_dir, 10**6, 4096, "float32")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    assert "kv_cache_memory_bytes" not in vllm_engine_kwargs(rollout, tiny_model_dir, "cpu")


def test_vllm_on_cpu_refuses_deepseek_v3_and_serves_the_other_families(tmp_path):
    """vllm-cpu 0.32 lists DeepSeek-V3 but does not serve it correctly (tests/rollout_vllm/test_vllm_families.py):
    refused at config time with the fix; the families it serves pass; a GPU run is not concerned."""
    from hybridflow.utils.tiny_model import make_tiny_checkpoint

    cpu = BASE + ["trainer.device=cpu", "actor_rollout_ref.rollout.tensor_model_parallel_size=1"]
    for family in ("deepseek-v3", "qwen3-moe", "gemma2"):
        make_tiny_checkpoint(tmp_path / family, size="nano", family=family)
    with pytest.raises(ConfigError) as e:
        hardware_check(cpu + [f"actor_rollout_ref.model.path={tmp_path / 'deepseek-v3'}"])
    assert "cannot serve the deepseek_v3 model" in str(e.value) and "rollout.name=hf" in str(e.value)
    for family in ("qwen3-moe", "gemma2"):
        hardware_check(cpu + [f"actor_rollout_ref.model.path={tmp_path / family}"])
    gpu = load_config(BASE + ["trainer.device=auto", f"actor_rollout_ref.model.path={tmp_path / 'deepseek-v3'}"])
    assert rollout_hardware_errors(gpu, "cuda") == []


def test_server_flags():
    args = engine_kwargs_to_cli({"model": "/m", "dtype": "float32", "enforce_eager": True,
                                 "enable_prefix_caching": False, "disable_log_stats": False,
                                 "compilation_config": {"cudagraph_capture_sizes": [1, 2]}})
    assert args == ["--model", "/m", "--dtype", "float32", "--enforce-eager", "--no-enable-prefix-caching",
                    "--compilation-config", '{"cudagraph_capture_sizes": [1, 2]}']


def test_standalone_replicas_are_hf_or_vllm():
    with pytest.raises(ConfigError, match=r"run the hf engine or vLLM servers"):
        load_config(BASE[:2] + ["actor_rollout_ref.hybrid_engine=false", "actor_rollout_ref.rollout.name=sglang"])
    assert load_config(BASE[:2] + ["actor_rollout_ref.hybrid_engine=false"]).split_placement  # hf replicas
    cfg = load_config(BASE + ["actor_rollout_ref.hybrid_engine=false", "actor_rollout_ref.rollout.tensor_model_parallel_size=1"])
    assert cfg.actor_rollout_ref.hybrid_engine is False


def test_chunked_prefill_on_cpu_is_noted():
    with pytest.warns(UserWarning, match=r"enable_chunked_prefill=true: vLLM on CPU runs without chunked prefill"):
        hardware_check(BASE + ["trainer.device=cpu", "actor_rollout_ref.rollout.tensor_model_parallel_size=1"])


def test_vision_model_with_sglang_is_refused_naming_the_key_and_the_fix(tiny_vlm_dir, nano_model_dir):
    """The sglang adapter passes no images: a VLM run with it stops at start with the fix."""
    cfg = load_config(BASE[:2] + ["actor_rollout_ref.rollout.name=sglang", f"actor_rollout_ref.model.path={tiny_vlm_dir}"])
    (msg,) = rollout_model_errors(cfg)
    assert "actor_rollout_ref.rollout.name=sglang" in msg and "vision-language" in msg
    assert "'qwen2_vl'" in msg and "set actor_rollout_ref.rollout.name=hf" in msg.lower()
    ok = load_config(BASE[:2] + ["actor_rollout_ref.rollout.name=hf", f"actor_rollout_ref.model.path={tiny_vlm_dir}",
                                 "trainer.n_gpus_per_node=2", "trainer.backend=ray"])
    assert rollout_model_errors(ok) == []  # hf's default: one unsplit engine per rank
    # the hf engine split over 2 ranks (asked for) takes text prompts only
    split = load_config(BASE[:2] + ["actor_rollout_ref.rollout.name=hf", f"actor_rollout_ref.model.path={tiny_vlm_dir}",
                                    "trainer.n_gpus_per_node=2", "trainer.backend=ray",
                                    "actor_rollout_ref.rollout.tensor_model_parallel_size=2"])
    assert any("vision-language" in e and "tensor_model_parallel_size=1" in e for e in rollout_model_errors(split))
    text = load_config(BASE[:2] + ["actor_rollout_ref.rollout.name=sglang", f"actor_rollout_ref.model.path={nano_model_dir}"])
    assert rollout_model_errors(text) == []


@pytest.fixture()
def image_only_vlm_dir(tiny_vlm_dir, tmp_path):
    """The tiny Qwen2-VL with an image-only processor class in its folder (what vLLM's transformers backend loads
    without torchvision)."""
    import shutil

    from hybridflow.utils.hf_processor import write_image_only_processor

    path = tmp_path / "vlm"
    shutil.copytree(tiny_vlm_dir, path)
    assert write_image_only_processor(str(path)) == "processing_image_only.ImageOnlyQwen2VLProcessor"
    return str(path)


def test_vision_model_with_vllm_is_checked_at_start(tiny_vlm_dir, tiny_vlm25_dir, image_only_vlm_dir, nano_model_dir):
    """The colocated vllm engine generates with Qwen2-VL images (docs/vision.md) when vLLM can load the model here:
    without torchvision through vLLM's transformers backend, which needs an image-only processor in the folder
    and trust_remote_code.  What cannot load -- and standalone servers, and Qwen2.5-VL -- stops at start with
    the key and the fix."""
    from hybridflow.utils.hf_processor import torchvision_available

    assert not torchvision_available()  # the premise of the transformers-backend fallback checked here

    def errors(path, *extra):
        return rollout_model_errors(load_config(BASE[:2] + ["actor_rollout_ref.rollout.name=vllm",
                                                            f"actor_rollout_ref.model.path={path}", *extra]))

    assert errors(image_only_vlm_dir, "actor_rollout_ref.model.trust_remote_code=true") == []
    assert errors(image_only_vlm_dir, "actor_rollout_ref.model.trust_remote_code=true",
                  "+actor_rollout_ref.rollout.engine_kwargs.vllm.model_impl=transformers") == []
    refused = {
        "no image-only processor": (errors(tiny_vlm_dir), r"Qwen2VLProcessor needs a video processor.*"
                                    r"write_image_only_processor.*trust_remote_code=true"),
        "no trust_remote_code": (errors(image_only_vlm_dir), r"only with actor_rollout_ref\.model\.trust_remote_code=true"),
        "native module": (errors(image_only_vlm_dir, "actor_rollout_ref.model.trust_remote_code=true",
                                 "+actor_rollout_ref.rollout.engine_kwargs.vllm.model_impl=vllm"),
                          r"engine_kwargs\.vllm\.model_impl=vllm: .*torchvision is not installed"),
        "servers": (errors(image_only_vlm_dir, "actor_rollout_ref.model.trust_remote_code=true",
                           "actor_rollout_ref.hybrid_engine=false"), r"hybrid_engine=false: .*carries no images"),
        "qwen2.5-vl": (errors(tiny_vlm25_dir, "actor_rollout_ref.model.trust_remote_code=true"),
                       r"model_type 'qwen2_5_vl'.*\['qwen2_vl'\] only"),
    }
    for case, (errs, pattern) in refused.items():
        assert len(errs) == 1, (case, errs)
        assert errs[0].startswith("actor_rollout_ref.rollout.name=vllm") and re.search(pattern, errs[0]), (case, errs)
        assert "actor_rollout_ref.rollout.name=hf" in errs[0], case
    assert "write_image_only_processor" in " ".join(errors(tiny_vlm_dir))
    assert errors(nano_model_dir) == []


def test_vllm_vision_settings_pick_the_backend(image_only_vlm_dir):
    from hybridflow.rollout.vllm.config import vllm_vision_settings

    kwargs, note = vllm_vision_settings(image_only_vlm_dir, trust_remote_code=True, torchvision=False)
    assert kwargs["model_impl"] == "transformers" and kwargs["trust_remote_code"] is True
    assert kwargs["skip_tokenizer_init"] is False and kwargs["limit_mm_per_prompt"]["video"] == 0
    assert "needs torchvision" in note and "model_impl=transformers" in note and "\n" not in note
    kwargs, note = vllm_vision_settings(image_only_vlm_dir, torchvision=True)  # vLLM's native module
    assert kwargs["model_impl"] == "auto" and note == "" and "trust_remote_code" not in kwargs
    kwargs, _ = vllm_vision_settings(image_only_vlm_dir, "transformers", trust_remote_code=True, torchvision=True)
    assert kwargs["model_impl"] == "transformers"  # the user's choice is honoured

def test_free_weights_on_sleep_acts_on_the_split_hf_engine_only():
    hf = BASE[:2] + ["actor_rollout_ref.rollout.name=hf", "trainer.device=cpu", "trainer.n_gpus_per_node=2"]
    key = "actor_rollout_ref.rollout.free_weights_on_sleep"
    for value in ("true", "false"):  # the split engine: both act (workers/sharded_rollout.py)
        hardware_check(hf + ["actor_rollout_ref.rollout.tensor_model_parallel_size=2", f"{key}={value}"])
    hardware_check(hf + [f"{key}=false"])  # a whole engine keeps its weights anyway
    with pytest.raises(ConfigError, match=rf"{key}=true acts on the hf engine split over .*this run's hf engine is "
                                          "whole"):
        hardware_check(hf + [f"{key}=true"])
    with pytest.raises(ConfigError, match=rf"{key}=False acts on the split hf engine only; vllm's own sleep level"):
        hardware_check(BASE + ["trainer.device=cuda", f"{key}=false"])
    hardware_check(BASE + ["trainer.device=cuda"])  # unset: nothing to refuse
