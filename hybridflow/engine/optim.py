"""AdamW and the learning-rate schedules verl users configure (``*.optim.*``).

Schedules are multiplicative factors on ``optim.lr`` as a function of the optimizer step ``s``
(warm-up length ``W``, total steps ``T``, ``m = min_lr_ratio``, ``c = num_cycles``):

* ``constant``: ``s / W`` during warm-up, then 1.
* ``cosine``:   ``m + (1 - m) * s / W`` during warm-up, then
  ``m + (1 - m) * 0.5 * (1 + cos(2 pi c p))`` with ``p = (s - W) / (T - W)`` (half-cosine decay
  to ``m`` for the default ``c = 0.5``; Loshchilov & Hutter 2017, SGDR).

``W = lr_warmup_steps`` when it is > 0, else ``int(lr_warmup_steps_ratio * T)``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Iterable

import torch
from torch.optim.lr_scheduler import LambdaLR

if TYPE_CHECKING:
    from hybridflow.config.schema import OptimConfig

__all__ = ["build_optimizer", "build_lr_scheduler", "warmup_steps", "constant_factor", "cosine_factor"]

_SCHEDULES = ("constant", "cosine")


def optimizer_class(optim_config: OptimConfig, field: str = "actor.optim"):
    """verl's ``optim.optimizer_impl`` (a module) + ``optim.optimizer`` (a class in it), e.g. ``torch.optim`` +
    ``AdamW`` (the default) or ``bitsandbytes.optim`` + ``AdamW8bit``."""
    from hybridflow.utils.load_object import LoadObjectError, import_source

    impl, name = str(optim_config.optimizer_impl), str(optim_config.optimizer)
    try:
        module = import_source(impl, key=f"{field}.optimizer_impl")
    except LoadObjectError as e:
        raise ValueError(f"{e}; install it or use torch.optim") from None
    cls = getattr(module, name, None)
    if cls is None and impl == "torch.optim":  # verl configs spell AdamW in any case
        cls = {k.lower(): v for k, v in vars(module).items() if isinstance(v, type)}.get(name.lower())
    if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
        raise ValueError(f"{field}.optimizer={name!r} is not an optimizer class of {impl}")
    return cls


def build_optimizer(params: Iterable[torch.nn.Parameter], optim_config: OptimConfig, field: str = "actor.optim"):
    """The ``optimizer_impl.optimizer`` class over the trainable ``params`` (lr, betas, weight_decay, then
    ``override_optimizer_config``), as verl builds it; ``betas`` only for classes that take them."""
    import inspect

    cls = optimizer_class(optim_config, field)
    params = [p for p in params if p.requires_grad]
    if not params:
        raise ValueError(f"{field}: the model has no trainable parameters (frozen model or LoRA misconfigured)")
    accepted = inspect.signature(cls.__init__).parameters
    kwargs: dict[str, Any] = dict(lr=float(optim_config.lr), weight_decay=float(optim_config.weight_decay))
    if "betas" in accepted:
        kwargs["betas"] = tuple(optim_config.betas)
    overrides = dict(optim_config.override_optimizer_config or {})
    if cls in (torch.optim.Adam, torch.optim.AdamW) and not {"fused", "foreach"} & overrides.keys() \
            and _fused_kernels_fit(params):
        # One kernel per parameter for the whole update (moments, bias correction, step): on CPU the
        # per-parameter loop's temporaries (sqrt, divisions) cost 4x the fused kernel (bench_vs_trl --shape step).
        kwargs["fused"] = True
    elif "foreach" in accepted:
        # foreach=False keeps per-parameter kernels, which also works with FSDP2 DTensor shards on gloo.
        kwargs["foreach"] = False
    kwargs.update(overrides)
    return cls(params, **kwargs)


def _fused_kernels_fit(params: list[torch.nn.Parameter]) -> bool:
    """Whether torch has a fused optimizer kernel for every parameter: a floating dtype, on one device type
    torch lists (CPU and CUDA among them)."""
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices
    except ImportError:  # a torch without the list: the per-parameter kernels
        return False
    supported = set(_get_fused_kernels_supported_devices())
    kinds = {p.device.type for p in params}
    return len(kinds) == 1 and kinds <= supported and all(torch.is_floating_point(p) for p in params)


def warmup_steps(optim_config: OptimConfig, total_steps: int) -> int:
    if int(optim_config.lr_warmup_steps) > 0:
        return int(optim_config.lr_warmup_steps)
    return int(float(optim_config.lr_warmup_steps_ratio) * total_steps)


def constant_factor(step: int, warmup: int) -> float:
    if step < warmup:
        return float(step) / float(max(1, warmup))
    return 1.0


def cosine_factor(step: int, warmup: int, total: int, min_lr_ratio: float = 0.0, num_cycles: float = 0.5) -> float:
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise ValueError(f"optim.min_lr_ratio must lie in [0, 1], got {min_lr_ratio}")
    if step < warmup:
        return min_lr_ratio + (1.0 - min_lr_ratio) * float(step) / float(max(1, warmup))
    progress = float(step - warmup) / float(max(1, total - warmup))
    cos = math.cos(math.pi * float(num_cycles) * 2.0 * progress)
    return max(min_lr_ratio, min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + cos))


def _schedule_type(optim_config: OptimConfig, field: str) -> str:
    kind = optim_config.warmup_style or optim_config.lr_scheduler_type  # warmup_style: verl's deprecated alias
    if kind not in _SCHEDULES:
        raise ValueError(f"{field}.lr_scheduler_type={kind!r} is not supported; use one of {list(_SCHEDULES)}")
    return kind


def build_lr_scheduler(optimizer, optim_config: OptimConfig, total_steps: int | None = None, field: str = "actor.optim"):
    """A ``LambdaLR`` implementing the schedule above (its state dict saves/restores the step)."""
    total = int(total_steps if total_steps is not None else optim_config.total_training_steps)
    kind = _schedule_type(optim_config, field)
    warm = warmup_steps(optim_config, max(total, 0))
    if kind == "cosine":
        if total <= 0:
            raise ValueError(
                f"{field}.total_training_steps must be set (> 0) for the cosine schedule; the trainer "
                "fills it from trainer.total_training_steps or the dataset size"
            )
        m, c = float(optim_config.min_lr_ratio), float(optim_config.num_cycles)
        first = 0 if getattr(optim_config, "zero_indexed_step", True) else 1  # verl's optim.zero_indexed_step
        return LambdaLR(optimizer, lambda s: cosine_factor(s + first, warm, total, m, c))
    return LambdaLR(optimizer, lambda s: constant_factor(s, warm))
