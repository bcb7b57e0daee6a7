"""Build a tiny Qwen2-VL-architecture checkpoint locally: model + image processor + tokenizer + chat template.

Like :mod:`hybridflow.utils.tiny_model` for text models: a random-init model from a config, saved with
``save_pretrained`` next to its processor, so tests, the vision quickstart and the benchmarks load it through
the same code a downloaded ``Qwen/Qwen2-VL-2B-Instruct`` takes (``load_processor`` + the image-text-to-text
auto class). The tokenizer is the character-level one of ``tiny_model`` plus the Qwen2-VL vision specials
(``<|vision_start|>``, ``<|vision_end|>``, ``<|image_pad|>``, ``<|video_pad|>``); the chat template renders
``{"type": "image"}`` content items as ``<|vision_start|><|image_pad|><|vision_end|>`` as Qwen's does.
Images are cut in 8x8 patches merged 2x2, so a 32x32 image costs 4 prompt tokens.
"""

from __future__ import annotations

from pathlib import Path

from hybridflow.utils.tiny_model import MODEL_SIZES, build_char_tokenizer

__all__ = ["VL_CHAT_TEMPLATE", "VISION_SPECIAL_TOKENS", "build_vl_tokenizer", "build_tiny_processor",
           "build_tiny_vlm", "make_tiny_vlm_checkpoint"]

VL_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% else %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
VISION_SPECIAL_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]

_PROCESSORS = {"qwen2_vl": "Qwen2VLProcessor", "qwen2_5_vl": "Qwen2_5_VLProcessor"}
_VISION = {"depth": 2, "embed_dim": 32, "num_heads": 2}  # vision tower of every tiny size


def build_vl_tokenizer(chat_template: str = VL_CHAT_TEMPLATE):
    """The char tokenizer of ``tiny_model`` with the Qwen2-VL vision special tokens and a VL chat template."""
    tok = build_char_tokenizer(chat_template=chat_template)
    tok.add_special_tokens({"additional_special_tokens": VISION_SPECIAL_TOKENS})
    return tok


def build_tiny_processor(tokenizer=None, arch: str = "qwen2_vl", patch_size: int = 8, merge_size: int = 2,
                         min_pixels: int = 16 * 16, max_pixels: int = 64 * 64, chat_template: str | None = VL_CHAT_TEMPLATE):
    """A Qwen2-VL processor over the PIL image processor (no torchvision needed)."""
    import transformers
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from hybridflow.utils.hf_processor import build_processor

    tokenizer = tokenizer if tokenizer is not None else build_vl_tokenizer()
    image_processor = Qwen2VLImageProcessorPil(patch_size=patch_size, merge_size=merge_size, temporal_patch_size=2,
                                               min_pixels=min_pixels, max_pixels=max_pixels)
    return build_processor(getattr(transformers, _PROCESSORS[arch]), image_processor, tokenizer, chat_template)


def _vision_config(arch: str, out_hidden: int, patch_size: int, merge_size: int, initializer_range: float) -> dict:
    common = {"initializer_range": initializer_range, "patch_size": patch_size, "spatial_merge_size": merge_size, "temporal_patch_size": 2, "in_channels": 3,
              "depth": _VISION["depth"], "num_heads": _VISION["num_heads"]}
    if arch == "qwen2_vl":
        return {**common, "embed_dim": _VISION["embed_dim"], "hidden_size": out_hidden, "mlp_ratio": 2}
    return {**common, "hidden_size": _VISION["embed_dim"], "intermediate_size": 2 * _VISION["embed_dim"],
            "out_hidden_size": out_hidden, "window_size": patch_size * merge_size * 2, "fullatt_block_indexes": [1],
            "tokens_per_second": 2}


def build_tiny_vlm(tokenizer, size: str = "nano", arch: str = "qwen2_vl", seed: int = 0, patch_size: int = 8,
                   merge_size: int = 2, initializer_range: float = 0.02):
    """A random-init Qwen2-VL / Qwen2.5-VL whose language model is sized by ``MODEL_SIZES[size]``.

    ``initializer_range``: std of the random weights; 0.2 gives peaked next-token distributions (greedy
    outputs that vary with the prompt and the image), which equality tests need."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    if arch not in _PROCESSORS:
        raise ValueError(f"tiny VLM arch must be one of {sorted(_PROCESSORS)}, got {arch!r}")
    hidden, inter, layers, heads, kv = MODEL_SIZES[size]
    half = hidden // heads // 2  # rotary frequencies per head, split over (t, h, w)
    mrope = [half - 2 * (half // 3), half // 3, half // 3]
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in VISION_SPECIAL_TOKENS}
    text = dict(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=2048,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": mrope},
                eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
                tie_word_embeddings=True, initializer_range=initializer_range)
    cfg = AutoConfig.for_model(
        arch, text_config=text, vision_config=_vision_config(arch, hidden, patch_size, merge_size, initializer_range),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        initializer_range=initializer_range,
    )
    torch.manual_seed(seed)
    return AutoModelForImageTextToText.from_config(cfg, dtype=torch.float32)


def make_tiny_vlm_checkpoint(path: str | Path, size: str = "nano", arch: str = "qwen2_vl", seed: int = 0,
                             chat_template: str | None = VL_CHAT_TEMPLATE, initializer_range: float = 0.02,
                             image_only_processor: bool = False) -> Path:
    """Write model + processor (image processor, tokenizer, chat template) to ``path``; returns the path.

    ``chat_template=None`` writes a processor without a chat template (for the bad-input tests);
    ``image_only_processor`` ships an image-only processor class in the folder (``write_image_only_processor``:
    what vLLM's transformers backend needs without torchvision; loading it needs ``trust_remote_code``).
    """
    from hybridflow.utils.hf_processor import save_processor

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_vl_tokenizer(chat_template=chat_template or "")
    if chat_template is None:
        tokenizer.chat_template = None
    processor = build_tiny_processor(tokenizer, arch=arch, chat_template=chat_template)
    model = build_tiny_vlm(tokenizer, size=size, arch=arch, seed=seed, initializer_range=initializer_range)
    model.save_pretrained(path)
    save_processor(processor, str(path))
    if image_only_processor:
        from hybridflow.utils.hf_processor import write_image_only_processor

        write_image_only_processor(str(path))
    return path
