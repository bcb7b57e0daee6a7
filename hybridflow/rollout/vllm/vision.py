"""Images through the ``vllm`` engine (Qwen2-VL): our image requests become vLLM requests, vLLM's answers our log-probs.

A vision-language checkpoint is served with the settings of
:func:`~hybridflow.rollout.vllm.config.vllm_vision_settings`: vLLM's native module where torchvision can be
imported, else vLLM's transformers backend (``model_impl="transformers"``; the engine core then always runs in a
child process: built in this process, vLLM's transformers backend wraps transformers' model classes, after which
the trainer can no longer build an HF model of that class here).  A request's ``multi_modal_data={"image":
[PIL images]}`` goes to vLLM with our prompt ids in which each run of image pads is collapsed to one pad (vLLM's
multimodal processor replaces every pad with the image's pads, for either backend); the prompt vLLM ends up with
must equal ours token for token, checked per request (a mismatch fails the request).  The image/video
placeholders are never sampled (the response has no pixels for them and the actor's forward would refuse them):
vLLM's ``logit_bias`` (-100, its floor) removes them.  vLLM's processed log-probs are then renormalised over the
other tokens; the engine asks for the placeholders' biased log-probs too (``logprob_token_ids``) and reports the
full-vocabulary log-prob, as the hf engine and the actor (:func:`full_vocab_log_prob`).  New weights reach vLLM
under the checkpoint's names (:func:`checkpoint_names`); after a reload the engine resets vLLM's encoder cache
(image embeddings).  Other checkpoints and Qwen2.5-VL are refused at construction with the fix (docs/vision.md).

The engine (:mod:`hybridflow.rollout.vllm.engine`) owns vLLM and the requests; this module holds the pure
translations, with no vLLM import.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Sequence

import torch

from hybridflow.rollout.sampling_params import SamplingParams
from hybridflow.rollout.vllm.config import vllm_vision_settings
from hybridflow.rollout.weights.transfer import model_config

__all__ = ["vision_engine_settings", "vllm_prompt", "prompt_mismatch", "logprob_settings", "unbias_of",
           "reported_log_prob", "full_vocab_log_prob", "checkpoint_names"]

# transformers 5 names Qwen2-VL's modules ``model.language_model.*`` / ``model.visual.*`` and saves them under
# their checkpoint names ``model.*`` / ``visual.*``; vLLM's transformers backend maps only checkpoint names (it
# reads ``model.visual.x`` as ``model.language_model.visual.x``), its native module either.
_VLM_CHECKPOINT_PREFIXES = (("model.language_model.", "model."), ("model.visual.", "visual."))


# ---------------------------------------------------------------------- construction
def vision_engine_settings(kwargs: dict[str, Any], trust_remote_code: bool, warn: Callable[[str], Any]
                           ) -> tuple[int | None, dict[int, float] | None, bool]:
    """Apply :func:`~hybridflow.rollout.vllm.config.vllm_vision_settings` to the engine kwargs (in place; a
    ``limit_mm_per_prompt`` they already hold is kept; its note goes to ``warn``) and return ``(image_token_id,
    placeholders' logit_bias, whether the engine core must run in a child process)``; ``(None, None, False)``
    for a text model.  Raises ``ValueError`` (the fix) before vLLM starts when vLLM cannot load the checkpoint."""
    vision, note = vllm_vision_settings(str(kwargs["model"]), kwargs.get("model_impl"),
                                        trust_remote_code or bool(kwargs.get("trust_remote_code")))
    if vision is None:
        return None, None, False
    limits = vision.pop("limit_mm_per_prompt")
    kwargs.update(vision)
    kwargs.setdefault("limit_mm_per_prompt", limits)
    if note:
        warn(note)
    cfg = model_config(str(kwargs["model"]))
    # -100 (vLLM's floor) keeps the image/video placeholders from being sampled
    bias = {int(cfg[k]): -100.0 for k in ("image_token_id", "video_token_id") if k in cfg}
    return int(cfg["image_token_id"]), bias, kwargs["model_impl"] == "transformers"  # see the module docstring


# ---------------------------------------------------------------------- requests
def vllm_prompt(prompt_ids: Sequence[int], multi_modal_data: Any, request_id: str, image_token_id: int | None,
                model_path: str) -> tuple[dict[str, Any], list[int] | None]:
    """vLLM's prompt for our ids (and images), and the prompt vLLM must end up with (``None``: text).
    ``image_token_id`` is ``None`` for a text-only model (images are then refused)."""
    ids = [int(t) for t in prompt_ids]
    if not multi_modal_data:
        return {"prompt_token_ids": ids}, None
    if image_token_id is None:
        raise NotImplementedError(f"request '{request_id}': images were sent to the vllm rollout engine, but the "
                                  f"model {model_path} is text-only (no vision_config); point "
                                  "actor_rollout_ref.model.path at a Qwen2-VL checkpoint, or use "
                                  "actor_rollout_ref.rollout.name=hf (docs/vision.md)")
    from hybridflow.rollout.multi_modal import images_of

    images, videos = images_of(multi_modal_data)
    if videos:
        raise NotImplementedError(f"request '{request_id}': the vllm rollout engine generates with images, not "
                                  f"videos (got {len(videos)}); drop the data.video_key column or sample frames "
                                  "as images")
    if not images:
        return {"prompt_token_ids": ids}, None
    collapsed = [t for i, t in enumerate(ids) if not (t == image_token_id and i and ids[i - 1] == t)]
    runs = sum(1 for t in collapsed if t == image_token_id)
    if runs != len(images):
        raise ValueError(f"request '{request_id}': the prompt holds {runs} run(s) of image tokens (id "
                         f"{image_token_id}) but {len(images)} image(s) came with it; render the prompt "
                         "with the processor together with the same images, in the order they appear")
    return {"prompt_token_ids": collapsed, "multi_modal_data": {"image": list(images)}}, ids


def prompt_mismatch(request_id: str, got: list[int], expected: list[int]) -> ValueError | None:
    """The error that fails an image request whose prompt, as vLLM expanded it, differs from ours (else ``None``)."""
    if got == expected:
        return None
    first = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
    return ValueError(
        f"request '{request_id}': vLLM expanded the image placeholders to a prompt of {len(got)} "
        f"tokens that differs from ours ({len(expected)} tokens) from position {first} "
        f"(vLLM {got[first:first + 8]} vs ours {expected[first:first + 8]}): the images were "
        "processed differently than when the prompt was rendered; render it with the checkpoint's "
        "processor and the same images")


def logprob_settings(placeholder_bias: dict[int, float] | None, logprobs: Any) -> dict[str, Any]:
    """vLLM ``SamplingParams`` keys for the log-probs and the placeholders' bias (``None``: a text model)."""
    unbias = bool(placeholder_bias and logprobs)
    return {
        "logprobs": None if unbias else 0 if logprobs else None,  # vLLM: one or the other
        "logit_bias": placeholder_bias,
        # the placeholders' biased log-probs besides the sampled token's, to report the full-vocabulary one
        "logprob_token_ids": list(placeholder_bias) if unbias else None,  # (full_vocab_log_prob)
    }


def unbias_of(placeholder_bias: dict[int, float] | None,
              params: SamplingParams) -> tuple[tuple[int, ...], float] | None:
    """What :func:`full_vocab_log_prob` needs for a request: the placeholder ids and ``-bias / T`` (greedy
    requests: vLLM's processed log-probs are then taken at T = 1)."""
    if not (placeholder_bias and params.logprobs):
        return None
    temperature = 1.0 if params.greedy else float(params.temperature)
    bias = next(iter(placeholder_bias.values()))
    return tuple(placeholder_bias), -bias / temperature


def reported_log_prob(entry: dict, token: int, unbias: tuple[tuple[int, ...], float] | None) -> float:
    """The sampled token's log-prob over the full vocabulary from vLLM's per-token ``entry`` (token -> Logprob);
    ``unbias`` is the request's :func:`unbias_of` (``None``: vLLM's value as it is)."""
    value = float(entry[token].logprob)
    if unbias is None:
        return value
    ids, shift = unbias
    return full_vocab_log_prob(value, [float(entry[i].logprob) for i in ids if i in entry], shift)


def full_vocab_log_prob(processed: float, biased: Sequence[float], shift: float) -> float:
    """Undo a logit bias in vLLM's ``processed_logprobs``.

    vLLM reports ``log softmax`` of the processed logits ``z = (logits + bias) / T``; the actor's (and the hf
    engine's) log-prob is over ``logits / T``.  With ``b_i`` the reported log-probs of the biased tokens and
    ``shift = -bias / T`` (the same bias on each), the two normalisers differ by
    ``Z_full / Z_processed = 1 - sum exp(b_i) + sum exp(b_i + shift)``, so
    ``log p_full = processed - log(1 - sum exp(b_i) + sum exp(b_i + shift))``.  Exact as long as nothing else
    (top-k / top-p) removed tokens from the distribution (as for the text path, vLLM's processed log-prob is then
    renormalised over the kept set).  Computed in log space (``shift`` reaches 1000 at T = 0.1)."""
    if not biased:
        return processed
    b = torch.tensor(list(biased), dtype=torch.float64)
    kept = torch.log1p(-b.exp().sum().clamp(max=1.0))  # log(1 - sum exp(b_i)), ~0
    back = torch.logsumexp(b + shift, 0)  # log sum exp(b_i + shift): the placeholders' unbiased mass
    return float(processed - torch.logaddexp(kept, back))


# ---------------------------------------------------------------------- weights
def checkpoint_names(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """A vision-language actor's parameter names as its checkpoint spells them (what vLLM loaded at start)."""
    for name, tensor in named_tensors:
        for new, old in _VLM_CHECKPOINT_PREFIXES:
            if name.startswith(new):
                name = old + name[len(new):]
                break
        yield name, tensor
