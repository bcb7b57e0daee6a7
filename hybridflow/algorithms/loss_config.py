"""How a policy loss reads its settings and the global loss normalisers.

Policy losses keep verl's signature ``fn(old_log_prob, log_prob, advantages, response_mask,
loss_agg_mode, config, rollout_is_weights)``, so the normalisers of :func:`.aggregation.agg_loss`
travel with ``config``: the engine wraps the actor config once per micro-batch with
:func:`with_global_batch_info`, which returns a read-only view that answers every actor attribute and
adds ``global_batch_info`` (verl's attribute name, so verl-style custom losses that call
``agg_loss(..., **config.global_batch_info)`` keep working)::

    counts = count_loss_normalizers(mask)           # summed over micro-batches, all-reduced over DP
    view = with_global_batch_info(actor_cfg, dp_size=dp, loss_scale_factor=actor_cfg.loss_scale_factor, **counts)
    loss, metrics = get_policy_loss_fn(mode)(old_lp, lp, adv, mask, actor_cfg.loss_agg_mode, view)

A config without ``global_batch_info`` (a plain actor config, or ``None``) aggregates with the local
counts of the tensors it is given.  ``config=None`` means verl's defaults for every setting.
"""

from __future__ import annotations

from typing import Any

__all__ = ["GlobalBatchConfig", "with_global_batch_info", "loss_setting", "clip_range", "agg_kwargs", "NORMALIZER_KEYS"]

NORMALIZER_KEYS = ("global_token_num", "global_batch_size", "loss_scale_factor", "dp_size")

# verl's defaults (ppo_trainer.yaml / ActorConfig) used when a loss is called with config=None.
_DEFAULTS: dict[str, Any] = {
    "clip_ratio": 0.2,
    "clip_ratio_low": None,
    "clip_ratio_high": None,
    "clip_ratio_c": 3.0,
    "tau_pos": 1.0,
    "tau_neg": 1.05,
    "policy_loss.clip_cov_ratio": 0.0002,
    "policy_loss.clip_cov_lb": 1.0,
    "policy_loss.clip_cov_ub": 5.0,
    "policy_loss.kl_cov_ratio": 0.0002,
    "policy_loss.ppo_kl_coef": 0.1,
    "sppo_eta": 1.0,
}


class GlobalBatchConfig:
    """An actor config (or ``None``) plus ``global_batch_info``; attribute reads fall through to the config."""

    def __init__(self, config: Any, global_batch_info: dict[str, Any]):
        unknown = sorted(set(global_batch_info) - set(NORMALIZER_KEYS))
        if unknown:
            hint = " (verl's 'batch_num_tokens' is called 'global_token_num' here)" if "batch_num_tokens" in unknown else ""
            raise ValueError(f"global_batch_info has unknown keys {unknown}{hint}; allowed: {', '.join(NORMALIZER_KEYS)}")
        self.base = config
        self.global_batch_info = dict(global_batch_info)

    def __getattr__(self, name: str):
        if name in ("base", "global_batch_info"):  # not set yet (e.g. during unpickling)
            raise AttributeError(name)
        if self.base is None:
            raise AttributeError(f"{name} (no actor config given)")
        return getattr(self.base, name)

    def __repr__(self) -> str:
        return f"GlobalBatchConfig({self.global_batch_info}, base={type(self.base).__name__})"


def with_global_batch_info(
    config: Any,
    *,
    global_token_num: int | None = None,
    global_batch_size: int | None = None,
    loss_scale_factor: float | None = None,
    dp_size: int = 1,
) -> GlobalBatchConfig:
    """Wrap ``config`` with the mini-batch's global normalisers (see :mod:`.aggregation`)."""
    base = config.base if isinstance(config, GlobalBatchConfig) else config
    info = {
        "global_token_num": global_token_num,
        "global_batch_size": global_batch_size,
        "loss_scale_factor": loss_scale_factor,
        "dp_size": dp_size,
    }
    return GlobalBatchConfig(base, info)


def loss_setting(config: Any, name: str):
    """Setting ``name`` (dotted for ``policy_loss.*``) from the actor config, verl's default for ``None``."""
    base = config.base if isinstance(config, GlobalBatchConfig) else config
    if base is None:
        return _DEFAULTS[name]
    obj = base
    for part in name.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise AttributeError(
                f"policy loss config {type(base).__name__} has no '{name}'; pass the actor config "
                "(cfg.actor_rollout_ref.actor) or None for verl's defaults"
            ) from None
    return obj


def clip_range(config: Any) -> tuple[float, float]:
    """(ε_low, ε_high): ``clip_ratio_low/high``, each falling back to ``clip_ratio`` when None."""
    eps = loss_setting(config, "clip_ratio")
    low = loss_setting(config, "clip_ratio_low")
    high = loss_setting(config, "clip_ratio_high")
    return (eps if low is None else low), (eps if high is None else high)


def agg_kwargs(config: Any) -> dict[str, Any]:
    """Keyword arguments for ``agg_loss``: ``config.global_batch_info`` when the config carries it, plus
    the actor's ``loss_scale_factor`` when that is set and the info does not override it."""
    if config is None:
        return {}
    info = getattr(config, "global_batch_info", None) or {}
    unknown = sorted(set(info) - set(NORMALIZER_KEYS))
    if unknown:
        raise ValueError(f"global_batch_info has unknown keys {unknown}; allowed: {', '.join(NORMALIZER_KEYS)}")
    kwargs = {k: v for k, v in info.items() if v is not None}
    base = config.base if isinstance(config, GlobalBatchConfig) else config
    if "loss_scale_factor" not in kwargs and base is not None and hasattr(base, "loss_scale_factor"):
        if base.loss_scale_factor is not None:
            kwargs["loss_scale_factor"] = base.loss_scale_factor
    return kwargs
