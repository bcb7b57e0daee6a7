"""Loading user reward functions (``custom_reward_function.{path,name}``) and calling sync or async ones.

A :class:`ScoreFnSpec` names the function instead of holding it: scoring runs in *spawned* worker processes,
and a function loaded from an arbitrary file cannot be pickled by reference, so each worker re-loads it from
the path. The parent loads it once too (:meth:`ScoreFnSpec.resolve`) so a wrong path or name fails at start-up
with a message naming the config field, not later inside a worker.
"""

from __future__ import annotations

import asyncio
import inspect
from dataclasses import dataclass
from typing import Any, Callable


class RewardFunctionError(ValueError):
    """The configured custom reward function cannot be loaded."""


def load_custom_reward_fn(path: str, name: str = "compute_score") -> Callable[..., Any]:
    """Function ``name`` of ``path`` (a ``.py`` file or a dotted module; verl's ``compute_score`` signature)."""
    from hybridflow.utils.load_object import LoadObjectError, load_object

    if not path:
        raise RewardFunctionError("custom_reward_function.path is empty; set it to a .py file or leave it null")
    try:
        return load_object(path, name=name or "compute_score", key="custom_reward_function.path",
                           kind="reward function", expect=_must_be_callable)
    except LoadObjectError as e:
        raise RewardFunctionError(f"{e} (custom_reward_function.name={name!r}; with path=null the built-in scorers "
                                  "are used)") from e


def _must_be_callable(obj: Any) -> str | None:
    return None if callable(obj) else f"is a {type(obj).__name__}, not a function"


@dataclass(frozen=True)
class ScoreFnSpec:
    """Which scoring function to use: ``path=None`` means the built-in ``default_compute_score``.

    ``fn`` may hold an importable (module-level) callable instead of a path, e.g. for library users; it must
    be picklable by reference when scoring runs in worker processes.
    """

    path: str | None = None
    name: str = "compute_score"
    fn: Callable[..., Any] | None = None

    def resolve(self) -> Callable[..., Any]:
        if self.fn is not None:
            return self.fn
        if self.path is None:
            from hybridflow.rewards.scorers import default_compute_score

            return default_compute_score
        return load_custom_reward_fn(self.path, self.name)

    def check_call(self, keywords: list[str], expected: str) -> None:
        """Refuse now a function that cannot take the keywords the reward manager will call it with (a wrong
        signature would otherwise fail on every sample, every step); ``expected`` is the signature to suggest."""
        fn = self.resolve()
        try:
            signature = inspect.signature(fn)
        except (TypeError, ValueError):  # a builtin or C callable: nothing to inspect
            return
        try:
            signature.bind(**{k: None for k in keywords})
        except TypeError as exc:
            where = (f"custom_reward_function.path={self.path} (custom_reward_function.name={self.name!r})"
                     if self.fn is None and self.path
                     else self.describe())
            raise RewardFunctionError(
                f"{where} has the signature {getattr(fn, '__name__', 'fn')}{signature}, but the reward manager "
                f"calls it with the keywords {', '.join(keywords)} ({exc}); define it as "
                f"def {getattr(fn, '__name__', 'compute_score')}{expected}"
            ) from None

    def accepts(self, keyword: str) -> bool:
        """Whether the function takes ``keyword`` (by name, or through ``**kwargs``)."""
        try:
            params = inspect.signature(self.resolve()).parameters
        except (TypeError, ValueError):
            return False
        return keyword in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())

    def describe(self) -> str:
        if self.fn is not None:
            return f"{getattr(self.fn, '__module__', '?')}.{getattr(self.fn, '__qualname__', self.fn)}"
        return "default_compute_score" if self.path is None else f"{self.path}:{self.name}"


def call_score_fn(fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    """Call ``fn(**kwargs)``; coroutine functions (async judges) are run to completion on a fresh loop."""
    result = fn(**kwargs)
    if not inspect.isawaitable(result):
        return result
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # no loop in this thread: the usual case (worker process, sync trainer)
        return asyncio.run(_await(result))
    # Called from inside a running loop (an async trainer scoring in-process): finish on a helper thread.
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1) as ex:
        return ex.submit(asyncio.run, _await(result)).result()


async def _await(awaitable):
    return await awaitable
