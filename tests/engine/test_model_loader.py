"""Model and tokenizer loading: chat-template errors, override_config, critic backbone, LoRA, device facts."""

import pytest
import torch

from hybridflow.engine import device as dev
from hybridflow.engine.model_loader import (
    ModelLoadError,
    apply_lora,
    enable_gradient_checkpointing,
    load_causal_lm,
    load_tokenizer,
    load_value_model,
)


def test_device_facts_on_this_machine():
    if torch.cuda.is_available():
        pytest.skip("CPU expectations")
    assert dev.device_type() == "cpu" and dev.dist_backend() == "gloo"
    assert dev.default_dtype() == torch.float32 and dev.resolve_dtype("auto") == torch.float32
    assert dev.resolve_dtype("bf16") == torch.bfloat16
    assert dev.attn_implementation() == "sdpa"
    assert dev.memory_stats()["cpu_rss_gb"] > 0
    with pytest.raises(ValueError, match="fsdp_config.dtype"):
        dev.resolve_dtype("fp8", "fsdp_config.dtype")


def test_tokenizer_without_chat_template_is_a_clear_error(tiny_model_dir, tmp_path):
    tok = load_tokenizer(tiny_model_dir)
    tok.chat_template = None
    tok.save_pretrained(tmp_path)
    (tmp_path / "chat_template.jinja").unlink(missing_ok=True)
    with pytest.raises(ModelLoadError, match="custom_chat_template"):
        load_tokenizer(str(tmp_path))
    template = "{% for m in messages %}[{{ m['content'] }}]{% endfor %}"
    fixed = load_tokenizer(str(tmp_path), custom_chat_template=template)
    assert fixed.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "[hi]"


def test_missing_model_path_names_the_field(tmp_path):
    with pytest.raises(ModelLoadError, match="actor_rollout_ref.model.path"):
        load_causal_lm(str(tmp_path / "nope"))


def test_override_config_and_attention_choice(tiny_model_dir):
    model = load_causal_lm(tiny_model_dir, override_config={"rms_norm_eps": 1e-3})
    assert model.config.rms_norm_eps == 1e-3
    assert model.config._attn_implementation == dev.attn_implementation()
    assert next(model.parameters()).dtype == torch.float32


def test_value_model_keeps_the_causal_lm_backbone(tiny_model_dir):
    lm = load_causal_lm(tiny_model_dir)
    critic = load_value_model(tiny_model_dir)
    assert critic.config.num_labels == 1
    lm_sd, critic_sd = lm.state_dict(), critic.state_dict()
    backbone = [k for k in critic_sd if k.startswith("model.")]
    assert backbone and all(torch.equal(critic_sd[k], lm_sd[k]) for k in backbone)
    assert critic.score.weight.shape == (1, lm.config.hidden_size)


def test_lora_wraps_all_linear_layers_and_disables_cleanly(tiny_model_dir):
    base = load_causal_lm(tiny_model_dir).eval()
    model = apply_lora(load_causal_lm(tiny_model_dir), lora_rank=4, lora_alpha=8, target_modules="all-linear").eval()
    wrapped = {n.split(".lora_A")[0].rsplit(".", 1)[-1] for n, _ in model.named_parameters() if "lora_A" in n}
    assert {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"} <= wrapped
    for n, p in model.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.5)  # make the adapters matter
    ids = torch.randint(5, base.config.vocab_size, (2, 7))
    with torch.no_grad():
        ref = base(input_ids=ids).logits
        assert not torch.allclose(model(input_ids=ids).logits, ref, atol=1e-4)
        with model.disable_adapter():
            assert torch.allclose(model(input_ids=ids).logits, ref, atol=1e-5)
    with pytest.raises(ValueError, match="lora_rank"):
        apply_lora(base, lora_rank=0, lora_alpha=8)


def test_gradient_checkpointing_gives_the_same_gradients(tiny_model_dir):
    ids = torch.randint(5, 40, (2, 9))
    grads = []
    for checkpointing in (False, True):
        model = load_causal_lm(tiny_model_dir).train()
        if checkpointing:
            enable_gradient_checkpointing(model)
            assert model.is_activation_checkpointing
        model(input_ids=ids, labels=ids).loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for n in grads[0]:
        assert torch.allclose(grads[0][n], grads[1][n], atol=1e-6), n
