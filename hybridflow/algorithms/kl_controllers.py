"""KL coefficient controllers for the KL-in-reward penalty (``algorithm.kl_ctrl``).

``fixed`` keeps β constant.  ``adaptive`` is the proportional controller of Ziegler et al. 2019
("Fine-Tuning Language Models from Human Preferences", arXiv 1909.08593, §2.2):

    e = clip(KL / KL_target − 1, −0.2, 0.2),   β ← β · (1 + e · n_steps / horizon)

Both expose ``value`` (the current β), ``update(current_kl, n_steps)`` and
``state_dict()``/``load_state_dict()`` so a resumed run continues with the exact β it stopped at.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FixedKLController", "AdaptiveKLController", "get_kl_controller", "KL_CONTROLLER_TYPES"]

KL_CONTROLLER_TYPES = ("fixed", "adaptive")


class FixedKLController:
    """β stays at ``kl_coef``."""

    def __init__(self, kl_coef: float):
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op: a fixed coefficient ignores the observed KL."""

    def state_dict(self) -> dict[str, Any]:
        return {"type": "fixed", "value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _check_type(state, "fixed")
        self.value = float(state["value"])


class AdaptiveKLController:
    """Proportional β controller driving the observed KL towards ``target_kl`` (Ziegler et al. 2019)."""

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int):
        if horizon <= 0:
            raise ValueError(f"algorithm.kl_ctrl.horizon must be > 0 for the adaptive controller, got {horizon}")
        if target_kl <= 0:
            raise ValueError(f"algorithm.kl_ctrl.target_kl must be > 0 for the adaptive controller, got {target_kl}")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = int(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict[str, Any]:
        return {"type": "adaptive", "value": self.value, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _check_type(state, "adaptive")
        self.value = float(state["value"])
        self.target = float(state["target"])
        self.horizon = int(state["horizon"])


def _check_type(state: dict[str, Any], expected: str) -> None:
    if state.get("type") != expected:
        raise ValueError(
            f"KL controller checkpoint is of type '{state.get('type')}' but algorithm.kl_ctrl.type is "
            f"'{expected}'; resume with the controller type the run was started with"
        )


def get_kl_controller(kl_ctrl_config) -> FixedKLController | AdaptiveKLController:
    """Build the controller named by ``kl_ctrl_config.type`` (reads ``kl_coef``, ``target_kl``, ``horizon``)."""
    kind = kl_ctrl_config.type
    if kind == "fixed":
        return FixedKLController(kl_coef=kl_ctrl_config.kl_coef)
    if kind == "adaptive":
        return AdaptiveKLController(
            init_kl_coef=kl_ctrl_config.kl_coef, target_kl=kl_ctrl_config.target_kl, horizon=kl_ctrl_config.horizon
        )
    raise ValueError(f"Unknown algorithm.kl_ctrl.type '{kind}'; choose one of {', '.join(KL_CONTROLLER_TYPES)}")
