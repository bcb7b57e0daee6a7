"""Multimodal HF processors (image processor + tokenizer + chat template) that work without torchvision.

transformers 5 builds a vision-language processor (``Qwen2VLProcessor``...) from its image processor,
tokenizer *and video processor*, and checks each against its base class. The video processors and their
base class are only importable with torchvision, so on a machine without it (this project's CPU machines:
PyPI only has a CUDA build of torchvision, which breaks with the CPU torch) neither
``AutoProcessor.from_pretrained`` nor the processor's constructor works, even for image-only data.

This module keeps torchvision optional:

* :func:`load_processor` tries ``AutoProcessor.from_pretrained`` first (the normal path with torchvision);
  when that fails for want of torchvision it assembles the same processor class from the checkpoint's
  image processor (the PIL/numpy backend), tokenizer and chat template, with no video processor -- so
  images work and videos raise a clear error naming torchvision.
* :func:`build_processor` is that construction, used by the tiny-model builders too.
* :func:`write_image_only_processor` ships an image-only subclass of a checkpoint's processor in its folder
  (``auto_map``, loaded with ``trust_remote_code``), for loaders that call ``AutoProcessor`` themselves -- vLLM's
  transformers backend (docs/vision.md).
* :func:`save_processor` writes the hub layout (``preprocessor_config.json`` naming the processor class,
  tokenizer files, ``chat_template.jinja``) that both load paths read, so a saved checkpoint loads the
  way a downloaded Qwen2-VL checkpoint does.
"""

from __future__ import annotations

import json
import os
from typing import Any

__all__ = ["build_processor", "save_processor", "load_processor", "is_multimodal_processor", "torchvision_available",
           "write_image_only_processor", "IMAGE_ONLY_PROCESSOR_FILE"]

CHAT_TEMPLATE_FILE = "chat_template.jinja"


def torchvision_available() -> bool:
    from transformers.utils import is_torchvision_available

    return bool(is_torchvision_available())


def is_multimodal_processor(obj: Any) -> bool:
    """A processor with an image processor (not a bare tokenizer, which ``AutoProcessor`` may return)."""
    from transformers import ProcessorMixin

    return isinstance(obj, ProcessorMixin) and getattr(obj, "image_processor", None) is not None


def build_processor(processor_cls: type, image_processor: Any, tokenizer: Any, chat_template: str | None,
                    video_processor: Any = None):
    """``processor_cls(image_processor, tokenizer, video_processor, chat_template)``, allowing no video processor.

    The base-class check of ``ProcessorMixin.__init__`` is relaxed for ``None`` arguments on this one
    instance only (an instance attribute shadowing the method during construction), so nothing global
    in transformers is patched.
    """
    processor = processor_cls.__new__(processor_cls)
    strict = processor.check_argument_for_proper_class
    processor.check_argument_for_proper_class = lambda name, arg: None if arg is None else strict(name, arg)
    try:
        processor_cls.__init__(processor, image_processor=image_processor, tokenizer=tokenizer,
                               video_processor=video_processor, chat_template=chat_template)
    finally:
        del processor.check_argument_for_proper_class
    return processor


def save_processor(processor: Any, path: str) -> None:
    """Save ``processor`` so that :func:`load_processor` (and ``AutoProcessor`` with torchvision) reload it."""
    if getattr(processor, "video_processor", None) is not None:
        processor.save_pretrained(path)
        return
    os.makedirs(path, exist_ok=True)
    image_processor = processor.image_processor
    image_processor._processor_class = type(processor).__name__
    image_processor.save_pretrained(path)
    processor.tokenizer.save_pretrained(path)
    if isinstance(processor.chat_template, str):
        with open(os.path.join(path, CHAT_TEMPLATE_FILE), "w", encoding="utf-8") as f:
            f.write(processor.chat_template)


def _processor_class_name(path: str, model_type: str | None) -> str | None:
    for name in ("processor_config.json", "preprocessor_config.json"):
        file = os.path.join(path, name)
        if os.path.isfile(file):
            with open(file, encoding="utf-8") as f:
                saved = json.load(f)
            value = saved.get("processor_class") or saved.get("_processor_class")
            if value:
                return value
    config = os.path.join(path, "config.json")
    if model_type is None and os.path.isfile(config):
        with open(config, encoding="utf-8") as f:
            model_type = json.load(f).get("model_type")
    if model_type:
        from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

        return PROCESSOR_MAPPING_NAMES.get(model_type)
    return None


def _chat_template(path: str, tokenizer: Any) -> str | None:
    jinja = os.path.join(path, CHAT_TEMPLATE_FILE)
    if os.path.isfile(jinja):
        with open(jinja, encoding="utf-8") as f:
            return f.read()
    legacy = os.path.join(path, "chat_template.json")
    if os.path.isfile(legacy):
        with open(legacy, encoding="utf-8") as f:
            return json.load(f).get("chat_template")
    return getattr(tokenizer, "chat_template", None)


def _assemble_without_torchvision(path: str, trust_remote_code: bool, model_type: str | None):
    import transformers
    from transformers import AutoImageProcessor, AutoTokenizer

    name = _processor_class_name(path, model_type)
    cls = getattr(transformers, name, None) if name else None
    if cls is None:
        return None
    image_processor = AutoImageProcessor.from_pretrained(path, trust_remote_code=trust_remote_code)
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    return build_processor(cls, image_processor, tokenizer, _chat_template(path, tokenizer))


def load_processor(path: str, trust_remote_code: bool = False, model_type: str | None = None):
    """The checkpoint's multimodal processor, or ``None`` for a text-only checkpoint.

    Without torchvision the processor is assembled from its parts (see the module docstring); a local
    folder with no image-processor config is text-only.
    """
    local = os.path.isdir(path)
    if local and not any(os.path.isfile(os.path.join(path, f))
                         for f in ("preprocessor_config.json", "processor_config.json")):
        return None
    from transformers import AutoProcessor  # after the check: its import costs ~1 s of a text-only run's start-up

    try:
        processor = AutoProcessor.from_pretrained(path, trust_remote_code=trust_remote_code)
    except ImportError:
        if torchvision_available() or not local:
            raise
        processor = _assemble_without_torchvision(path, trust_remote_code, model_type)
    return processor if processor is not None and is_multimodal_processor(processor) else None


IMAGE_ONLY_PROCESSOR_FILE = "processing_image_only.py"

_IMAGE_ONLY_SOURCE = '''"""An image-only {base}: no video processor, so transformers builds it without torchvision.

Written by hybridflow.utils.hf_processor.write_image_only_processor; loaded through ``auto_map`` with
``trust_remote_code=True`` (e.g. by vLLM's transformers backend). Images only: videos need {base}.
"""
from transformers import {base}
from transformers.processing_utils import ProcessorMixin


class {name}({base}):
    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        self.image_token = getattr(tokenizer, "image_token", None) or "<|image_pad|>"
        self.video_token = getattr(tokenizer, "video_token", None) or "<|video_pad|>"
        self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
        self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
        ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template, **kwargs)
        self.video_processor = None
'''


def write_image_only_processor(path: str, model_type: str | None = None) -> str:
    """Make the checkpoint folder ``path`` load, through ``AutoProcessor.from_pretrained(path,
    trust_remote_code=True)``, an image-only subclass of its processor class (Qwen2-VL's ``Qwen2VLProcessor``):
    writes :data:`IMAGE_ONLY_PROCESSOR_FILE` and points ``auto_map["AutoProcessor"]`` of its processor configs at
    it.  Returns the class reference (``"processing_image_only.ImageOnlyQwen2VLProcessor"``).

    Why: transformers 5's Qwen2-VL processors need a video processor, which needs torchvision, and vLLM's
    transformers backend builds the processor with ``AutoProcessor`` itself (docs/vision.md).  The tokenizer,
    image processor and chat template files are left as they are.
    """
    base = _processor_class_name(path, model_type)
    if not base or base.startswith("ImageOnly"):
        raise ValueError(f"{path}: no processor class to derive from (processor_class / model_type)")
    name = f"ImageOnly{base}"
    ref = f"{IMAGE_ONLY_PROCESSOR_FILE[:-3]}.{name}"
    with open(os.path.join(path, IMAGE_ONLY_PROCESSOR_FILE), "w", encoding="utf-8") as f:
        f.write(_IMAGE_ONLY_SOURCE.format(base=base, name=name))
    for fname, key in (("processor_config.json", "processor_class"), ("preprocessor_config.json", "_processor_class")):
        file = os.path.join(path, fname)
        saved: dict = {}
        if os.path.isfile(file):
            with open(file, encoding="utf-8") as f:
                saved = json.load(f)
        elif fname == "preprocessor_config.json":
            continue
        saved[key] = name
        saved.setdefault("auto_map", {})["AutoProcessor"] = ref
        with open(file, "w", encoding="utf-8") as f:
            json.dump(saved, f, indent=2)
    return ref
