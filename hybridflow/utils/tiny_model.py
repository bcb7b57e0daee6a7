"""Build tiny Hugging Face checkpoints locally (no hub access): tokenizer + random-init model.

Tests, the quickstart and the benchmarks all need "an HF model directory" without downloads.
These helpers build one from a config and ``save_pretrained`` it, so the directory is then
loaded through exactly the code path a user's real checkpoint takes.

Two tokenizers are offered:
* ``char``: one token per character over a fixed alphabet (digits, letters, punctuation) plus
  ChatML specials -- ideal for arithmetic-style tasks a 0.5M-parameter model can learn;
* ``bpe``: a byte-level BPE trained on a small corpus (for tests that want realistic merges).

:data:`FAMILIES` names the model families hybridflow is tested on (Qwen2, Qwen2.5, Qwen3, Llama-3.1, Mistral,
Gemma-2, DeepSeek-V3, Qwen3-MoE): each is the family's ``model_type`` plus the config fields that make it that
family (rope scaling, sliding windows, soft-capping, MLA and MoE shapes), scaled down so that every feature is
still exercised by short test sequences (windows of 8 tokens, 4 experts), and what the random init must set for
that (DeepSeek-V3's routing bias).  It is the one table of families: the library's benchmarks and every test that
builds a family's model (``tests/families``, ``tests/engine``'s tensor / expert parallel cases, the vLLM family
tests) read it.
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<pad>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAR_ALPHABET = string.digits + string.ascii_letters + string.punctuation + " \n"

# Named model sizes (hidden, intermediate, layers, heads, kv_heads).
MODEL_SIZES: dict[str, tuple[int, int, int, int, int]] = {
    "nano": (64, 128, 2, 4, 2),  # ~0.1M params: unit tests
    "tiny": (128, 256, 2, 4, 2),  # ~0.4M: integration tests, quickstart
    "small": (256, 768, 4, 4, 2),  # ~3M
    "medium": (512, 1408, 6, 8, 4),  # ~18M: benchmarks
    "base100m": (768, 3072, 12, 12, 4),  # ~104M (GPT-2-small width/depth): the top of the CPU scaling sweep
    "qwen2.5-0.5b": (896, 4864, 24, 14, 2),  # Qwen2.5-0.5B's shape (~360M without its 151k vocab): GPU tests
}


@dataclass(frozen=True)
class Family:
    """A model family as a tiny config: its ``model_type``, the config fields that characterise it, and what a
    random init must set for the family's features to be exercised (``init_weights(model)``, after the init)."""

    name: str
    model_type: str
    overrides: dict[str, Any] = field(default_factory=dict)
    features: str = ""  # what the tiny config exercises (docs, test ids)
    init_weights: Callable[[Any], None] | None = None


def _spread_routing_bias(model) -> None:
    """DeepSeek-V3's router picks experts (and expert groups) by its scores plus ``e_score_correction_bias``, which a
    random init leaves at zero: a spread across the experts makes the selection depend on it."""
    import torch

    with torch.no_grad():
        for module in model.modules():
            bias = getattr(module, "e_score_correction_bias", None)
            if isinstance(bias, torch.Tensor):
                bias.copy_(torch.linspace(-0.05, 0.05, bias.numel()))


# Windows of 8 tokens are shorter than the tests' prompt + response, so a model that ignored a window (or applied
# one it should not) gives different tokens.
_WINDOW = 8
FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("qwen2", "qwen2", {"rope_theta": 1e6, "use_sliding_window": False, "sliding_window": None},
           "GQA, q/k/v biases, tied embeddings"),
    # Qwen2.5's config.json declares a sliding window and max_window_layers but switches it off
    # (use_sliding_window=false): nothing may apply that window.
    Family("qwen2.5", "qwen2", {"rope_theta": 1e6, "use_sliding_window": False, "sliding_window": _WINDOW,
                                "max_window_layers": 1, "rms_norm_eps": 1e-6},
           "a declared but disabled sliding window (use_sliding_window=false, max_window_layers)"),
    Family("qwen3", "qwen3", {"head_dim": 32, "rope_theta": 1e6, "attention_bias": False},
           "q/k RMS norms, head_dim != hidden/heads"),
    Family("llama3.1", "llama", {"tie_word_embeddings": False, "rope_scaling": {
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}},
           "llama3 rope scaling, untied lm_head"),
    Family("mistral", "mistral", {"tie_word_embeddings": False, "sliding_window": _WINDOW},
           "sliding-window attention on every layer (Mistral-7B-v0.1)"),
    Family("gemma2", "gemma2", {"head_dim": 16, "sliding_window": _WINDOW, "query_pre_attn_scalar": 24,
                                "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
                                "tie_word_embeddings": False},
           "alternating sliding/full layers, attention and final logit soft-capping, query_pre_attn_scalar "
           "(lm_head untied: tied to the sqrt(hidden)-scaled embeddings, a random init repeats its last token)"),
    Family("deepseek-v3", "deepseek_v3", {
        "num_key_value_heads": None, "q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8, "v_head_dim": 12, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_group": 2,
        "topk_group": 1, "n_shared_experts": 1, "moe_intermediate_size": 32, "first_k_dense_replace": 1,
        "tie_word_embeddings": False},
           "MLA attention (K and V head dims differ), a dense layer then a MoE layer with group-limited routing by "
           "scores plus a non-zero correction bias", _spread_routing_bias),
    Family("qwen3-moe", "qwen3_moe", {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                                      "norm_topk_prob": True, "decoder_sparse_step": 1, "head_dim": 16},
           "sparse MoE layers (softmax top-k router, load-balancing auxiliary loss)"),
)}


def build_char_tokenizer(alphabet: str = CHAR_ALPHABET, chat_template: str = CHATML_TEMPLATE,
                         added_tokens: Iterable[str] = ()):
    """A character-level tokenizer with ChatML specials, EOS=<|im_end|>, PAD=<pad>: one token per character.

    ``added_tokens`` are extra whole-word tokens that are *not* special (kept when decoding with
    ``skip_special_tokens=True``), as Qwen2.5's ``<tool_call>`` / ``</tool_call>``.

    It is built as a byte-level BPE without merges over the alphabet -- the pipeline of Qwen2's tokenizer
    (NFC, Qwen2's split regex, byte-level symbols) -- because transformers loads every checkpoint whose
    ``model_type`` is ``qwen2`` with that pipeline, whatever ``tokenizer.json`` says: a plain character
    vocabulary would lose its spaces and newlines on the way through ``save_pretrained`` /
    ``AutoTokenizer.from_pretrained``.  Built this way, the tokenizer in memory and the one a run loads
    from the checkpoint produce the same ids.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    symbol = _byte_level_symbols()
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in alphabet:
        for b in ch.encode("utf-8"):
            vocab.setdefault(symbol[b], len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS)  # without this the specials would be split into characters
    if added_tokens:
        from tokenizers import AddedToken

        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in added_tokens])
    return _wrap(tok, chat_template)


def _byte_level_symbols() -> dict[int, str]:
    """GPT-2's byte -> printable-symbol table used by byte-level tokenizers (Radford et al. 2019)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    codes = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            codes.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, codes)}


def build_bpe_tokenizer(corpus: Iterable[str] | None = None, vocab_size: int = 512, chat_template: str = CHATML_TEMPLATE):
    """A byte-level BPE tokenizer trained on ``corpus`` (a built-in synthetic corpus by default)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if corpus is None:
        corpus = _default_corpus()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(list(corpus), trainer=trainer)
    return _wrap(tok, chat_template)


def _wrap(tok, chat_template: str):
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<pad>",
        bos_token=None,
        unk_token="<|endoftext|>",
        chat_template=chat_template,
    )
    fast.padding_side = "left"
    return fast


def _default_corpus() -> list[str]:
    import random

    rng = random.Random(0)
    words = ["the", "answer", "is", "question", "add", "sum", "number", "step", "think", "result", "####"]
    lines = []
    for _ in range(2000):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        w = " ".join(rng.choice(words) for _ in range(rng.randint(3, 9)))
        lines.append(f"{w} {a} + {b} = {a + b}. #### {a + b}")
    return lines


def build_tiny_model(tokenizer, size: str = "tiny", arch: str = "qwen2", seed: int = 0, family: str | None = None,
                     **overrides):
    """A random-init causal LM sized by ``MODEL_SIZES[size]`` whose vocab matches ``tokenizer``.

    ``family`` (a key of :data:`FAMILIES`) takes the family's ``model_type`` and config fields instead of
    ``arch``; ``overrides`` apply on top of either.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    hidden, inter, layers, heads, kv = MODEL_SIZES[size]
    chosen = _family(family)
    if chosen is not None:
        arch, overrides = chosen.model_type, {**chosen.overrides, **overrides}
    fields = dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    fields.update(overrides)
    if fields["num_key_value_heads"] is None:  # MLA: keys and values have one head per query head
        fields["num_key_value_heads"] = heads
    cfg = AutoConfig.for_model(arch, **fields)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    if chosen is not None and chosen.init_weights is not None:
        chosen.init_weights(model)
    return model


def _family(name: str | None) -> Family | None:
    if name is None:
        return None
    if name not in FAMILIES:
        raise ValueError(f"unknown model family {name!r}; known: {sorted(FAMILIES)}")
    return FAMILIES[name]


def make_tiny_checkpoint(
    path: str | Path,
    size: str = "tiny",
    tokenizer: str = "char",
    arch: str = "qwen2",
    seed: int = 0,
    family: str | None = None,
    **overrides,
) -> Path:
    """Write tokenizer + random-init model to ``path`` (an HF folder) and return the path."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok = build_char_tokenizer() if tokenizer == "char" else build_bpe_tokenizer()
    model = build_tiny_model(tok, size=size, arch=arch, seed=seed, family=family, **overrides)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


__all__ = [
    "CHATML_TEMPLATE",
    "FAMILIES",
    "Family",
    "MODEL_SIZES",
    "build_char_tokenizer",
    "build_bpe_tokenizer",
    "build_tiny_model",
    "make_tiny_checkpoint",
]
