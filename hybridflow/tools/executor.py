"""Run the tool calls of a trajectory so that every call ends with an observation for the model.

The agent loop hands over what the parser extracted (a name and the arguments as the model wrote them) and
the sample's ``tools_kwargs``; the executor runs ``create -> execute -> calc_reward -> release`` with a time
limit and never raises for anything the model or the tool did. Failures become an error text the model reads
next turn plus an *error kind*, counted in metrics:

===================== =====================================================================================
kind                  when
===================== =====================================================================================
``unknown_tool``      the name is not one of the configured tools
``invalid_json``      the arguments are not a JSON object
``invalid_arguments`` they violate the tool's schema (missing/unknown argument, wrong type, not in enum)
``tool_exception``    ``create`` or ``execute`` raised
``timeout``           ``create`` + ``execute`` took longer than ``timeout_s``
``bad_return``        ``execute`` returned something other than ``(ToolResponse | str, reward, metrics)``
``parse_error``       the parser found a malformed call (see :meth:`ToolExecutor.parse_error_outcome`)
===================== =====================================================================================

Two ways to call:

* ``await executor.call(name, arguments, tools_kwargs)``: one call, its own tool instance (verl's current
  agent loop: create, execute and release per call);
* ``session = executor.session(tools_kwargs)``; ``await session.call(...)`` for each call of the trajectory
  (an instance per tool lives across turns, so stateful tools such as ``calc_gsm8k_reward`` see earlier
  answers); ``rewards = await session.close()`` returns ``{tool_name: calc_reward}`` and releases everything.

``tools_kwargs`` is the sample's ``extra_info.tools_kwargs``: ``{tool_name: {create_kwargs, execute_kwargs,
calc_reward_kwargs, release_kwargs}}``, each passed to the method of the same name.

Observation text longer than ``max_tool_response_length`` characters is cut as verl cuts it
(``tool_response_truncate_side``): ``left`` keeps the beginning, ``right`` keeps the end, ``middle`` keeps
both halves.

A ``timeout`` interrupts a tool at its next ``await``; an ``async def`` tool that blocks the event loop with
synchronous work cannot be interrupted (write blocking work as a sync function with :func:`function_tool`, or
use ``asyncio.to_thread``, so it runs in a thread).
"""

from __future__ import annotations

import asyncio
import logging
import math
import numbers
import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from hybridflow.tools.base_tool import BaseTool
from hybridflow.tools.function_tool import as_base_tool
from hybridflow.tools.schemas import ToolResponse, parse_arguments, validate_arguments
from hybridflow.utils.stopping import wait_awaitable

logger = logging.getLogger(__name__)

ERROR_KINDS = ("unknown_tool", "invalid_json", "invalid_arguments", "tool_exception", "timeout", "bad_return",
               "parse_error")
TRUNCATE_SIDES = ("left", "right", "middle")
_KWARG_KEYS = ("create_kwargs", "execute_kwargs", "calc_reward_kwargs", "release_kwargs")


def truncate_tool_response(text: str, max_length: int, side: str) -> str:
    """verl's cut of an observation longer than ``max_length`` characters (markers added, not counted)."""
    if side not in TRUNCATE_SIDES:
        raise ValueError(f"tool_response_truncate_side={side!r} must be one of {', '.join(TRUNCATE_SIDES)}")
    if len(text) <= max_length:
        return text
    if side == "left":
        return text[:max_length] + "...(truncated)"
    if side == "right":
        return "(truncated)..." + text[-max_length:]
    half = max_length // 2
    return text[:half] + "...(truncated)..." + (text[-half:] if half else "")


@dataclass
class ToolCallOutcome:
    """One call's result. ``response.text`` is what goes into the tool message (already truncated).

    ``step_reward`` is the reward ``execute`` returned (0.0 on error); ``metrics`` the tool's metrics;
    ``error_kind`` is None for a successful call, else one of :data:`ERROR_KINDS` with ``error`` the message.
    ``tool_reward`` is the tool's ``calc_reward`` when the call ran in its own instance (:meth:`ToolExecutor.call`).
    """

    name: str
    response: ToolResponse
    step_reward: float = 0.0
    metrics: dict[str, Any] = field(default_factory=dict)
    error_kind: str | None = None
    error: str | None = None
    truncated: bool = False
    tool_reward: float | None = None

    @property
    def text(self) -> str:
        return self.response.text or ""

    @property
    def ok(self) -> bool:
        return self.error_kind is None


def summarize_outcomes(outcomes: Iterable[ToolCallOutcome]) -> dict[str, float]:
    """Per-trajectory counts: ``tool_calls``, ``tool_errors`` and ``tool_errors/<kind>`` for each kind seen."""
    calls, kinds = 0, Counter()
    for o in outcomes:
        calls += 1
        if o.error_kind is not None:
            kinds[o.error_kind] += 1
    out = {"tool_calls": float(calls), "tool_errors": float(sum(kinds.values()))}
    out.update({f"tool_errors/{k}": float(v) for k, v in sorted(kinds.items())})
    return out


class ToolExecutor:
    """Runs model-issued calls against ``tools`` (a list or a ``{name: tool}`` mapping of ``BaseTool`` objects
    or ``@function_tool`` :class:`~hybridflow.tools.function_tool.FunctionTool` entries).

    ``timeout_s`` bounds ``create`` + ``execute`` of one call (``release`` and ``calc_reward`` get the same
    bound separately); ``validate`` checks arguments against the tool's schema before ``execute``.
    :attr:`stats` counts every call and error since construction (``tool_calls``, ``tool_errors/<kind>``).
    """

    def __init__(self, tools: Mapping[str, BaseTool] | Sequence[BaseTool], timeout_s: float = 60.0,
                 max_tool_response_length: int = 256, tool_response_truncate_side: str = "middle",
                 validate: bool = True):
        listed = dict(tools) if isinstance(tools, Mapping) else {t.name: t for t in tools}
        self.tools: dict[str, BaseTool] = {name: as_base_tool(t) for name, t in listed.items()}
        if not timeout_s > 0:
            raise ValueError(f"tool timeout_s must be > 0 seconds, got {timeout_s}")
        if max_tool_response_length < 1:
            raise ValueError(f"rollout.multi_turn.max_tool_response_length must be >= 1, got {max_tool_response_length}")
        if tool_response_truncate_side not in TRUNCATE_SIDES:
            raise ValueError(f"rollout.multi_turn.tool_response_truncate_side={tool_response_truncate_side!r} must be "
                             f"one of {', '.join(TRUNCATE_SIDES)}")
        self.timeout_s = float(timeout_s)
        self.max_tool_response_length = int(max_tool_response_length)
        self.tool_response_truncate_side = tool_response_truncate_side
        self.validate = validate
        self.stats: Counter[str] = Counter()

    def session(self, tools_kwargs: Mapping[str, Any] | None = None) -> "ToolSession":
        """Instances that live for one trajectory (see the module doc)."""
        return ToolSession(self, tools_kwargs)

    async def call(self, name: str, arguments: str | dict | None, tools_kwargs: Mapping[str, Any] | None = None,
                   **execute_extra: Any) -> ToolCallOutcome:
        """One call in a fresh instance: create, execute, calc_reward, release. Never raises."""
        session = self.session(tools_kwargs)
        try:
            outcome = await session.call(name, arguments, **execute_extra)
        finally:
            rewards = await session.close()
        if outcome.ok and name in rewards:
            outcome.tool_reward = rewards[name]
        return outcome

    async def call_many(self, calls: Sequence[Any], tools_kwargs: Mapping[str, Any] | None = None,
                        **execute_extra: Any) -> list[ToolCallOutcome]:
        """Concurrent :meth:`call` for objects with ``.name`` and ``.arguments`` (the parser's FunctionCall)."""
        return list(await asyncio.gather(*(self.call(c.name, c.arguments, tools_kwargs, **execute_extra)
                                           for c in calls)))

    def parse_error_outcome(self, message: str, name: str = "") -> ToolCallOutcome:
        """An observation for a call the parser could not read (malformed JSON, missing name); counted."""
        return self._failure(name, "parse_error", message)

    # ------------------------------------------------------------------------------------------ internals
    def _observation(self, name: str, response: ToolResponse) -> tuple[ToolResponse, bool]:
        text = response.text
        if text is None or len(text) <= self.max_tool_response_length:
            return response, False
        cut = truncate_tool_response(text, self.max_tool_response_length, self.tool_response_truncate_side)
        return response.model_copy(update={"text": cut}), True

    def _failure(self, name: str, kind: str, message: str) -> ToolCallOutcome:
        self.stats["tool_calls"] += 1
        self.stats["tool_errors"] += 1
        self.stats[f"tool_errors/{kind}"] += 1
        response, truncated = self._observation(name, ToolResponse(text=f"Error: {message}"))
        return ToolCallOutcome(name=name, response=response, error_kind=kind, error=message, truncated=truncated)

    def _success(self, name: str, response: ToolResponse, reward: float, metrics: dict) -> ToolCallOutcome:
        self.stats["tool_calls"] += 1
        response, truncated = self._observation(name, response)
        return ToolCallOutcome(name=name, response=response, step_reward=reward, metrics=metrics, truncated=truncated)

    def check_call(self, name: str, arguments: str | dict | None) -> tuple[dict | None, str | None, str | None]:
        """``(arguments dict, None, None)`` or ``(None, error kind, message)`` for a call before running it."""
        tool = self.tools.get(name)
        if tool is None:
            available = ", ".join(sorted(self.tools)) or "none"
            return None, "unknown_tool", f"unknown tool {name!r}; available tools: {available}"
        args, error = parse_arguments(arguments)
        if error is not None:
            return None, "invalid_json", f"{name}: {error}"
        if self.validate:
            args = tool.coerce_arguments(args)
            error = validate_arguments(tool.tool_schema, args)
            if error is not None:
                return None, "invalid_arguments", error if error.startswith(name) else f"{name}: {error}"
        return args, None, None


def _check_return(name: str, value: Any) -> tuple[tuple[ToolResponse, float, dict] | None, str | None]:
    """``execute``'s return value -> (response, reward, metrics), or an error message when it is garbage."""
    if isinstance(value, ToolResponse):
        return (value, 0.0, {}), None
    if not isinstance(value, tuple) or len(value) != 3:
        kind = f"a tuple of length {len(value)}" if isinstance(value, tuple) else type(value).__name__
        return None, (f"{name} returned {kind}; execute() must return (ToolResponse, step_reward, metrics)")
    response, reward, metrics = value
    if isinstance(response, str):
        response = ToolResponse(text=response)
    if not isinstance(response, ToolResponse):
        return None, f"{name} returned {type(response).__name__} as its response; expected a ToolResponse"
    if reward is None:
        reward = 0.0
    if isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not math.isfinite(float(reward)):
        return None, f"{name} returned step_reward {reward!r:.80}; expected a finite number"
    if metrics is None:
        metrics = {}
    if not isinstance(metrics, dict):
        return None, f"{name} returned metrics of type {type(metrics).__name__}; expected a dict"
    return (response, float(reward), dict(metrics)), None


class _ToolRaised(Exception):
    """Carries an exception of the tool that the executor's time-out handling would misread."""


def _describe(exc: BaseException) -> str:
    return traceback.format_exception_only(type(exc), exc)[-1].strip()


class ToolSession:
    """Tool instances of one trajectory; created on first use of each tool, released by :meth:`close`."""

    def __init__(self, executor: ToolExecutor, tools_kwargs: Mapping[str, Any] | None):
        self.executor = executor
        self.tools_kwargs = dict(tools_kwargs or {})
        self.instances: dict[str, str] = {}
        self.outcomes: list[ToolCallOutcome] = []
        self._creating: dict[str, asyncio.Future] = {}

    def _kwargs(self, name: str, key: str) -> dict[str, Any]:
        entry = self.tools_kwargs.get(name) or {}
        value = entry.get(key) if isinstance(entry, Mapping) else None
        return dict(value or {})

    async def _instance(self, name: str, tool: BaseTool) -> str:
        if name in self.instances:
            return self.instances[name]
        if name in self._creating:  # a parallel call of the same tool is creating it
            return await asyncio.shield(self._creating[name])
        future = asyncio.get_running_loop().create_future()
        self._creating[name] = future
        try:
            create_kwargs = self._kwargs(name, "create_kwargs")
            # Both spellings verl tools read: spread out (sglang rollout) and as create_kwargs= (agent loop).
            spread = {k: v for k, v in create_kwargs.items() if k not in ("instance_id", "create_kwargs")}
            created = await tool.create(create_kwargs=create_kwargs, **spread)
            instance_id = created[0] if isinstance(created, tuple) else created
            if not isinstance(instance_id, str):
                raise TypeError(f"create() returned {type(created).__name__}; expected (instance_id, ToolResponse)")
            self.instances[name] = instance_id
            future.set_result(instance_id)
            return instance_id
        except BaseException as e:
            future.set_exception(e)
            future.exception()  # mark retrieved: parallel waiters re-raise it themselves
            raise
        finally:
            self._creating.pop(name, None)

    async def call(self, name: str, arguments: str | dict | None, **execute_extra: Any) -> ToolCallOutcome:
        """Run one call in this trajectory's instance of the tool. Never raises (except on cancellation)."""
        ex = self.executor
        args, kind, message = ex.check_call(name, arguments)
        if kind is not None:
            outcome = ex._failure(name, kind, message)
        else:
            outcome = await self._run(name, ex.tools[name], args, execute_extra)
        self.outcomes.append(outcome)
        return outcome

    async def _run(self, name: str, tool: BaseTool, args: dict, execute_extra: dict) -> ToolCallOutcome:
        ex = self.executor

        async def create_and_execute():
            try:
                instance_id = await self._instance(name, tool)
                return await tool.execute(instance_id, args,
                                          **{**self._kwargs(name, "execute_kwargs"), **execute_extra})
            except asyncio.TimeoutError as e:  # the tool's own time-out, not ours
                raise _ToolRaised(e) from e

        try:
            # a stop request (SIGTERM) gives up the step when the tool stays stuck (hybridflow.utils.stopping)
            value = await wait_awaitable(create_and_execute(), ex.timeout_s, f"tool {name}")
        except asyncio.TimeoutError:
            return ex._failure(name, "timeout", f"{name} did not answer within {ex.timeout_s:g} s")
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the rollout goes on; the model reads what went wrong
            logger.debug("tool %s raised", name, exc_info=True)
            cause = e.__cause__ if isinstance(e, _ToolRaised) else e
            return ex._failure(name, "tool_exception", f"{name} failed: {_describe(cause)}")
        checked, problem = _check_return(name, value)
        if problem is not None:
            return ex._failure(name, "bad_return", problem)
        return ex._success(name, *checked)

    async def close(self) -> dict[str, float]:
        """``{tool_name: calc_reward}`` for every instance (numbers only), then release them all. Never raises."""
        rewards: dict[str, float] = {}
        timeout = self.executor.timeout_s
        for name, instance_id in list(self.instances.items()):
            tool = self.executor.tools[name]
            try:
                value = await asyncio.wait_for(tool.calc_reward(instance_id, **self._kwargs(name, "calc_reward_kwargs")),
                                               timeout=timeout)
                if isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value)):
                    rewards[name] = float(value)
            except asyncio.CancelledError:
                raise
            except Exception:
                self.executor.stats["calc_reward_errors"] += 1
                logger.warning("calc_reward of tool %s failed", name, exc_info=True)
            try:
                await asyncio.wait_for(tool.release(instance_id, **self._kwargs(name, "release_kwargs")),
                                       timeout=timeout)
            except asyncio.CancelledError:
                raise
            except Exception:
                self.executor.stats["release_errors"] += 1
                logger.warning("release of tool %s failed", name, exc_info=True)
        self.instances.clear()
        return rewards

    def metrics(self) -> dict[str, float]:
        """:func:`summarize_outcomes` over this session's calls."""
        return summarize_outcomes(self.outcomes)


__all__ = [
    "ERROR_KINDS",
    "TRUNCATE_SIDES",
    "ToolCallOutcome",
    "ToolExecutor",
    "ToolSession",
    "summarize_outcomes",
    "truncate_tool_response",
]
