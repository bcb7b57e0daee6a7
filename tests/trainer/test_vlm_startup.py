"""A vision-language checkpoint starts with its processor (the guard of phase 1 is gone: the rollout
generates with images); a text checkpoint has none."""

from types import SimpleNamespace


def _config(model_dir):
    model = SimpleNamespace(path=model_dir, tokenizer_path=None, trust_remote_code=False, custom_chat_template=None)
    return SimpleNamespace(actor_rollout_ref=SimpleNamespace(model=model))


def test_vlm_run_gets_its_processor(tiny_vlm_dir, nano_model_dir):
    from hybridflow.launch.inputs import load_processor_for

    assert load_processor_for(_config(nano_model_dir)) is None
    processor = load_processor_for(_config(tiny_vlm_dir))
    assert type(processor).__name__ == "Qwen2VLProcessor" and processor.chat_template
