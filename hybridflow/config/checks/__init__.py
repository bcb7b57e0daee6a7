"""The check pipeline's machinery: a :class:`Check` (a named rule), what the run stage knows besides the config
(:class:`RunContext`), and :func:`run_checks`, which runs an ordered list of them.

The rules that read only the configuration live in this package, one module per concern; rules that need another
floor's knowledge live with that floor (``algorithms/checks.py``, ``rewards/checks.py``, ``engine/checks.py``,
``engine/parallel/checks.py``, ``data/checks.py``, ``agents/checks.py``, ``rollout/<engine>/checks.py``). The two
ordered lists -- the configuration stage and the run stage -- are in ``hybridflow/launch/config.py``.

Each check is ``fn(cfg, errors, notes)`` (``fn(cfg, errors)`` is fine when it has nothing to note; run-stage
checks may take a fourth argument, the :class:`RunContext`). A check appends one message per problem naming the
key and the fix; all of a stage's checks run, then the stage raises one ``ConfigError`` listing every problem.
"""

from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass
from typing import Any, Callable

from hybridflow.config.errors import ConfigError

__all__ = ["Check", "ConfigWarning", "RunContext", "check_plan", "run_checks"]


class ConfigWarning(UserWarning):
    """A key hybridflow accepts for verl compatibility but does not act on, or a deprecated spelling."""


@dataclass(frozen=True)
class Check:
    """One rule of the pipeline: a name (shown by ``--dry-run``) and the function that applies it."""

    name: str
    fn: Callable[..., None]

    def __call__(self, cfg, errors: list[str], notes: list[str], ctx: "RunContext | None" = None) -> None:
        arity = len(inspect.signature(self.fn).parameters)
        args = (cfg, errors, notes, ctx)[:max(2, min(arity, 4))]
        self.fn(*args)


@dataclass
class RunContext:
    """What the run stage knows besides the config: where the logger writes, and the device (resolved lazily)."""

    cfg: Any
    logger_dir: str | None = None
    _device: str | None = None

    @property
    def device(self) -> str:
        if self._device is None:
            from hybridflow.config.checks.machine import resolve_device

            self._device = resolve_device(self.cfg)
        return self._device


def check_plan(cfg, errors: list[str]) -> None:
    """The step plan can be decided (where pi_old comes from, which stages run); ReMax needs a greedy baseline."""
    from hybridflow.config.plan import plan_step

    try:
        plan_step(cfg)
    except ValueError as e:
        errors.append(str(e))


def run_checks(cfg, checks: tuple[Check, ...], ctx: RunContext | None = None) -> list[str]:
    """Run ``checks`` in order; raise ``ConfigError`` listing every problem, else warn each note and return them."""
    errors: list[str] = []
    notes: list[str] = []
    for check in checks:
        check(cfg, errors, notes, ctx)
    if errors:
        raise ConfigError(errors)
    for note in notes:
        warnings.warn(note, ConfigWarning, stacklevel=3)
    return notes
