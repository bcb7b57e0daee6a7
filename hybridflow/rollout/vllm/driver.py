"""The thread that owns an in-process vLLM engine: it runs the engine's commands (add, abort, reload, sleep)
queued by other threads, steps the engine while requests are in flight, and hands each finished request its
tokens and full-vocabulary log-probs (image requests: after checking vLLM's prompt against ours).

A step that raises kills the driver: every request in flight and every command queued or submitted later
fails with a :class:`RolloutEngineDeadError` carrying the step's traceback (an
:class:`~hybridflow.rollout.base.EngineError`, so a training run stops on it).  ``steps`` and ``doing`` are
the stall watchdog's view of it (:meth:`~hybridflow.rollout.base.RolloutEngine.progress`)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import queue
import threading
from collections import deque
from typing import Any, Callable

from hybridflow.rollout.base import EngineError, TokenOutput, engine_failure
from hybridflow.rollout.vllm.vision import prompt_mismatch, reported_log_prob

__all__ = ["RolloutEngineStartError", "RolloutEngineDeadError"]

_LOG_TAIL_LINES = 40


class RolloutEngineStartError(RuntimeError):
    """The engine did not start (bad argument, no memory, time-out); the message ends with its log tail."""


class RolloutEngineDeadError(EngineError):
    """The engine failed while running; every request in flight gets this error."""


class _LogTail(logging.Handler):
    """Keeps the last lines vLLM logged, for start-up error messages."""

    def __init__(self, lines: int = _LOG_TAIL_LINES):
        super().__init__(level=logging.DEBUG)
        self.lines: deque[str] = deque(maxlen=lines)

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):
            self.lines.append(f"{record.levelname} {record.name}: {record.getMessage()}")

    def text(self) -> str:
        return "\n".join(self.lines) or "(vLLM logged nothing)"


class _Request:
    __slots__ = ("request_id", "future", "token_ids", "log_probs", "want_log_probs", "expected_prompt", "unbias")

    def __init__(self, request_id: str, future: concurrent.futures.Future, want_log_probs: bool,
                 expected_prompt: list[int] | None = None, unbias: tuple[tuple[int, ...], float] | None = None):
        self.request_id = request_id
        self.future = future
        self.token_ids: list[int] = []
        self.log_probs: list[float] = []
        self.want_log_probs = want_log_probs
        self.expected_prompt = expected_prompt  # image requests: the prompt vLLM must end up with
        self.unbias = unbias  # (placeholder ids, -bias / T): undo their logit_bias in the reported log-probs

    def log_prob(self, entry: dict, token: int) -> float:
        """The sampled token's log-prob over the full vocabulary (:func:`~.vllm_vision.full_vocab_log_prob`)."""
        return reported_log_prob(entry, token, self.unbias)

    def output(self, finish_reason: str) -> TokenOutput:
        return TokenOutput(self.request_id, list(self.token_ids),
                           list(self.log_probs) if self.want_log_probs else None, finish_reason)


class _Driver(threading.Thread):
    """The one thread that touches the vLLM engine: runs queued commands, then steps while work remains."""

    def __init__(self, build: Callable[[], Any], name: str, engine_name: str = "vllm"):
        super().__init__(name=name, daemon=True)
        self.engine_name = engine_name
        self._build = build
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._stopping = threading.Event()
        self.started_future: concurrent.futures.Future = concurrent.futures.Future()
        self.engine: Any = None
        self.active: dict[str, _Request] = {}
        self.error: BaseException | None = None  # what killed the driver (a RolloutEngineDeadError)
        self.steps = 0
        self.doing = "idle"
        self.failed = False  # a step or the engine itself raised (not a normal stop)
        self._gate = threading.Lock()  # a command is either queued before the driver stops, or refused

    def call(self, fn: Callable[[Any], Any]) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._gate:
            if self.error is not None:
                future.set_exception(self.error)
                return future
            self._commands.put((fn, future))
        return future

    def stop(self) -> None:
        self._stopping.set()
        self._commands.put((None, None))

    def run(self) -> None:
        try:
            self.engine = self._build()
        except BaseException as e:  # noqa: BLE001 - reported to the constructor
            self.error = e
            self.started_future.set_exception(e)
            return
        self.started_future.set_result(self.engine)
        try:
            while not self._stopping.is_set():
                busy = bool(self.active) or self.engine.has_unfinished_requests()
                self._run_commands(block=not busy)
                if self._stopping.is_set():
                    break
                if self.active or self.engine.has_unfinished_requests():
                    self.doing = f"a step with {len(self.active)} request(s)"
                    self._deliver(self.engine.step())
                    self.steps += 1
                    self.doing = "idle"
            error = RolloutEngineDeadError(f"vLLM engine '{self.engine_name}' was shut down")
        except BaseException as e:  # noqa: BLE001 - every waiter learns what happened
            self.failed = True
            error = engine_failure(e, self.engine_name, self.doing, len(self.active), cls=RolloutEngineDeadError)
        with self._gate:  # from here on, call() refuses: nothing can be queued behind the drain below
            self.error = error
        self._fail_all(error)
        while True:  # commands queued behind the stop or the failure
            try:
                _, future = self._commands.get_nowait()
            except queue.Empty:
                break
            if future is not None and not future.done():
                future.set_exception(error)

    def _run_commands(self, block: bool) -> None:
        while True:
            try:
                fn, future = self._commands.get(timeout=0.5) if block else self._commands.get_nowait()
            except queue.Empty:
                return
            block = False
            if fn is None:
                return
            self.doing = f"a command ({getattr(fn, '__name__', 'call')})"
            try:
                future.set_result(fn(self))
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                future.set_exception(e)
            self.doing = "idle"

    def _deliver(self, outputs) -> None:
        for out in outputs:
            req = self.active.get(out.request_id)
            if req is None:
                continue
            if req.expected_prompt is not None and out.prompt_token_ids is not None:
                expected, req.expected_prompt = req.expected_prompt, None
                error = prompt_mismatch(req.request_id, [int(t) for t in out.prompt_token_ids], expected)
                if error is not None:
                    del self.active[out.request_id]
                    self.engine.abort_request([out.request_id])
                    req.future.set_exception(error)
                    continue
            completion = out.outputs[0]
            req.token_ids.extend(int(t) for t in completion.token_ids)
            if req.want_log_probs and completion.logprobs:
                for entry, token in zip(completion.logprobs, completion.token_ids):
                    req.log_probs.append(req.log_prob(entry, token))
            if out.finished:
                del self.active[out.request_id]
                reason = completion.finish_reason if completion.finish_reason in ("stop", "length") else "abort"
                req.future.set_result(req.output(reason))

    def _fail_all(self, error: BaseException) -> None:
        for req in self.active.values():
            if not req.future.done():
                req.future.set_exception(error)
        self.active.clear()

    def abort_all(self) -> int:
        ids = list(self.active)
        if ids:
            self.engine.abort_request(ids)
        for rid in ids:
            req = self.active.pop(rid)
            req.future.set_result(req.output("abort"))
        return len(ids)
