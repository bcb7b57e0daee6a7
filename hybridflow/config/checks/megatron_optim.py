"""Megatron-core's ``OptimizerConfig`` fields in ``<role>.optim.override_optimizer_config``.

verl's Megatron scripts pass them there
(``+actor_rollout_ref.actor.optim.override_optimizer_config.optimizer_cpu_offload=True``...); the dict's other
entries are keyword arguments of the optimizer class, which takes none of these.  They are taken out of the dict at
config time and each acts or is said to have no effect:

* ``optimizer_cpu_offload`` (Megatron keeps the optimizer state on the CPU and steps it there) -> the role's
  ``fsdp_config.optimizer_offload`` (the state lives on the CPU between phases; the step runs where the parameters
  are), with ``optimizer_offload_fraction`` (Megatron Lite: ``offload_fraction``) 1 (all of it) -- a fraction strictly
  between 0 and 1 is refused (a part of the state is not offloaded apart), 0 offloads nothing;
* ``use_precision_aware_optimizer`` (moments kept in a lower precision), ``overlap_cpu_optimizer_d2h_h2d`` (copies
  overlapped with the CPU step): inert, said -- the moments are kept in the parameters' dtype.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MEGATRON_OPTIMIZER_KEYS", "megatron_optimizer_overrides"]

_INERT = {"use_precision_aware_optimizer": "the moments are kept in the parameters' dtype",
          "overlap_cpu_optimizer_d2h_h2d": "there is no CPU optimizer step whose copies could overlap"}
_FRACTIONS = ("optimizer_offload_fraction", "offload_fraction")  # Megatron-core's, Megatron Lite's
MEGATRON_OPTIMIZER_KEYS = ("optimizer_cpu_offload", *_FRACTIONS, *_INERT)


def _offload(key: str, given: dict, fsdp: Any, errors: list[str], notes: list[str]) -> None:
    name = next((n for n in _FRACTIONS if n in given), None)
    fraction = None if name is None else float(given[name])
    if fraction is not None and 0.0 < fraction < 1.0:
        errors.append(f"{key}.{name}={fraction}: offloading part of the optimizer state is not built (the whole "
                      "state moves to the CPU between phases); set it to 1.0, or 0 to keep it on the device")
        return
    if given.get("optimizer_cpu_offload") and (fraction is None or fraction >= 1.0):
        fsdp.optimizer_offload = True
        notes.append(f"{key}.optimizer_cpu_offload=true: the optimizer state lives on the CPU between phases "
                     "(fsdp_config.optimizer_offload=true); the step itself runs where the parameters are")
    elif fraction is not None:
        notes.append(f"{key}.{name}={fraction} has no effect of its own: the whole optimizer state is offloaded when "
                     "the role offloads it (optimizer_cpu_offload, or the optimizer_offload of its megatron / engine "
                     "/ fsdp_config node), none of it otherwise")


def megatron_optimizer_overrides(key: str, optim: Any, fsdp: Any, errors: list[str], notes: list[str]) -> None:
    """Take Megatron's ``OptimizerConfig`` fields out of ``optim.override_optimizer_config`` (``key`` is that dict's
    config key) and apply them to ``fsdp`` (the role's fsdp_config)."""
    overrides = optim.override_optimizer_config
    if not overrides or not any(name in overrides for name in MEGATRON_OPTIMIZER_KEYS):
        return
    given = {name: overrides[name] for name in MEGATRON_OPTIMIZER_KEYS if name in overrides}
    optim.override_optimizer_config = {k: v for k, v in overrides.items() if k not in MEGATRON_OPTIMIZER_KEYS}
    _offload(key, given, fsdp, errors, notes)
    for name, why in _INERT.items():
        if name in given:
            notes.append(f"{key}.{name}={given[name]} has no effect (Megatron's optimizer option): {why}")
