"""Build tiny Hugging Face checkpoints locally (no hub access): tokenizer + random-init model.

Tests, the quickstart and the benchmarks all need "an HF model directory" without downloads.
These helpers build one from a config and ``save_pretrained`` it, so the directory is then
loaded through exactly the code path a user's real checkpoint takes.

Two tokenizers are offered:
* ``char``: one token per character over a fixed alphabet (digits, letters, punctuation) plus
  ChatML specials -- ideal for arithmetic-style tasks a 0.5M-parameter model can learn;
* ``bpe``: a byte-level BPE trained on a small corpus (for tests that want realistic merges).
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Iterable

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


def build_tiny_model(tokenizer, size: str = "tiny", arch: str = "qwen2", seed: int = 0, **overrides):
    """A random-init causal LM sized by ``MODEL_SIZES[size]`` whose vocab matches ``tokenizer``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    hidden, inter, layers, heads, kv = MODEL_SIZES[size]
    cfg = AutoConfig.for_model(
        arch,
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
        **overrides,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)


def make_tiny_checkpoint(
    path: str | Path,
    size: str = "tiny",
    tokenizer: str = "char",
    arch: str = "qwen2",
    seed: int = 0,
    **overrides,
) -> Path:
    """Write tokenizer + random-init model to ``path`` (an HF folder) and return the path."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok = build_char_tokenizer() if tokenizer == "char" else build_bpe_tokenizer()
    model = build_tiny_model(tok, size=size, arch=arch, seed=seed, **overrides)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


__all__ = [
    "CHATML_TEMPLATE",
    "MODEL_SIZES",
    "build_char_tokenizer",
    "build_bpe_tokenizer",
    "build_tiny_model",
    "make_tiny_checkpoint",
]
