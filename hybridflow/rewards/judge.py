"""Reward functions that ask a generative reward model (a judge): the client, the score parser, a built-in judge.

With ``reward_model.rollout.name`` set, the run serves ``reward_model.model.path`` on the rollout service behind
a router (``rollout/service/judge_router.py``) and every reward function call is offered, as keyword arguments
it may take (verl's reward-loop API):

* ``reward_router_address`` -- ``"host:port"`` of the router's OpenAI API (``/v1/chat/completions``,
  ``/v1/completions``): verl's GenRM functions post to it unchanged;
* ``reward_model_tokenizer`` -- the judge's tokenizer (loaded on first use in the scoring process);
* ``judge`` -- a :class:`JudgeClient` on that address: ``await judge.chat(messages, max_tokens=..., temperature=...)``
  returns the judge's text, ``await judge.complete(prompt)`` continues a prompt string.

The function builds its own prompt, asks, and parses the answer (:func:`parse_score`).  A judge that does not
answer within ``reward_model.judge.request_timeout_s`` raises :class:`JudgeTimeout`; an answer without a score
raises :class:`JudgeParseError`: the sample then scores ``reward_model.error_score`` and is counted
(``reward/judge_timeout_count``, ``reward/judge_unparsable_count``, also in ``reward/error_count``).

:func:`judge_compute_score` is the built-in judge function (used when ``custom_reward_function.path`` is null):
it fills ``reward_model.reward_kwargs.judge_template`` with the question (``extra_info.question``, else the
decoded prompt), the response and the ground truth, asks with ``judge_max_tokens`` at temperature
``judge_temperature``, and reads the score strictly on the scale 0..``judge_score_scale`` (:func:`parse_score`).

A judge whose engine fails -- e.g. non-finite logits from broken weights -- raises :class:`JudgeError` naming the
judge (``reward_model.model.path`` / ``reward_model.rollout.*``), never the policy's keys.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from typing import Any

__all__ = ["JudgeError", "JudgeTimeout", "JudgeParseError", "JudgeClient", "LazyTokenizer", "parse_score",
           "judge_compute_score", "chat_complete", "DEFAULT_TEMPLATE", "DEFAULT_SCORE_PATTERN", "JUDGE_KWARGS"]

DEFAULT_TEMPLATE = ("Question: {question}\nAnswer: {response}\nIs the answer correct? Reply with a score from 0 "
                    "(wrong) to 10 (right).")
DEFAULT_SCORE_PATTERN = r"(-?\d+(?:\.\d+)?)"
# the keyword arguments a run with a judge offers to reward functions (each passed only where accepted)
JUDGE_KWARGS = ("reward_router_address", "reward_model_tokenizer", "judge")


class JudgeError(RuntimeError):
    """The judge could not answer (router or replica error)."""


class JudgeTimeout(JudgeError):
    """The judge did not answer within ``reward_model.judge.request_timeout_s``."""


class JudgeParseError(ValueError):
    """The judge's text holds no score the pattern can read."""


class LazyTokenizer:
    """The judge's tokenizer, loaded the first time an attribute is read (it pickles as its path)."""

    def __init__(self, path: str, trust_remote_code: bool = False):
        self.path = path
        self.trust_remote_code = trust_remote_code
        self._tokenizer = None

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "trust_remote_code": self.trust_remote_code}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], state["trust_remote_code"])

    def __getattr__(self, name: str):
        if name.startswith("__") or name in ("path", "trust_remote_code", "_tokenizer"):
            raise AttributeError(name)
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.path, trust_remote_code=self.trust_remote_code)
        return getattr(self._tokenizer, name)


class JudgeClient:
    """Talks to the judge router at ``address`` (``host:port``); picklable (it holds the address only)."""

    def __init__(self, address: str, timeout_s: float = 120.0):
        self.address = address
        self.timeout_s = float(timeout_s)

    def __getstate__(self) -> dict[str, Any]:
        return {"address": self.address, "timeout_s": self.timeout_s}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["address"], state["timeout_s"])

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        import aiohttp

        # the router enforces request_timeout_s (waiting included); this client waits a little longer so the
        # router's 504 -- not a dropped connection -- is what a slow judge produces
        timeout = aiohttp.ClientTimeout(total=self.timeout_s + 30.0)
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session:
                async with session.post(f"http://{self.address}{path}", json=body) as resp:
                    text = await resp.text()
                    status = resp.status
        except asyncio.TimeoutError:
            raise JudgeTimeout(f"the judge router at {self.address} did not answer within {timeout.total:.0f}s") from None
        except aiohttp.ClientError as e:
            raise JudgeError(f"the judge router at {self.address} could not be reached: {e}") from None
        payload = json.loads(text) if text else {}
        if status == 504:
            raise JudgeTimeout(payload.get("error", {}).get("message", "judge request timed out"))
        if status != 200:
            raise JudgeError(judge_failure(status, str(payload.get("error", {}).get("message", text))))
        return payload

    async def chat(self, messages: list[dict[str, Any]], **sampling: Any) -> str:
        """The judge's reply to ``messages`` (rendered with its chat template); ``sampling``: max_tokens,
        temperature, top_p, top_k, seed."""
        payload = await self._post("/v1/chat/completions", {"messages": messages, **sampling})
        return payload["choices"][0]["message"]["content"]

    async def complete(self, prompt: str | list[int], **sampling: Any) -> str:
        """The judge's continuation of ``prompt`` (a string, or token ids of its tokenizer)."""
        payload = await self._post("/v1/completions", {"prompt": prompt, **sampling})
        return payload["choices"][0]["text"]


def judge_failure(status: int, message: str) -> str:
    """The router's error as the judge's: the engine under it words its errors for the policy it usually serves."""
    if "non-finite logits" in message:
        return (f"the judge (reward_model.model.path) produced non-finite logits (NaN or inf): its weights are broken "
                f"or its dtype overflows (reward_model.rollout.dtype); this is the judge's failure, not the policy's "
                f"(router answered {status})")
    return f"judge router answered {status}: {message}"


async def chat_complete(router_address: str, chat_complete_request: dict[str, Any]) -> dict[str, Any]:
    """verl's helper shape: post an OpenAI chat request to ``router_address``, return the JSON answer."""
    return await JudgeClient(router_address)._post("/v1/chat/completions", dict(chat_complete_request))


def parse_score(text: str, pattern: str = DEFAULT_SCORE_PATTERN, scale: float = 1.0, low: float = 0.0) -> float:
    """The judge's score on its declared scale ``[low, scale]``, divided by ``scale``.

    Strict (issue 34: the first number anywhere, unbounded, let a random judge score ~2 on a 0-1 scale): the score
    is the first match of ``pattern`` (its first group); it must be a finite number within ``[low, scale]``, and
    every other number the pattern finds must repeat it or be a bound of the scale (``7/10``, ``7 out of 10``).
    Anything else -- no match, a number off the scale, several different candidates -- raises
    :class:`JudgeParseError` quoting the text: the sample is the judge's failure, scored ``error_score``."""
    shown = repr((text or "")[:200])
    values = []
    for match in re.finditer(pattern, text or ""):
        raw = match.group(1) if match.groups() else match.group(0)
        try:
            values.append(float(raw))
        except (TypeError, ValueError):
            raise JudgeParseError(f"the judge's score {raw!r} is not a number: {shown}") from None
    if not values:
        raise JudgeParseError(f"the judge's answer holds no score matching {pattern!r}: {shown}")
    score = values[0]
    if not (math.isfinite(score) and low <= score <= scale):
        raise JudgeParseError(f"the judge's score {score:g} is outside its declared scale {low:g}..{scale:g} "
                              f"(judge_score_scale): {shown}")
    others = sorted({v for v in values[1:] if v not in (score, low, scale)})
    if others:
        raise JudgeParseError(f"the judge's answer holds several different scores ({score:g} and "
                              f"{', '.join(f'{v:g}' for v in others[:3])}): {shown}")
    return score / float(scale)


async def judge_compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None,
                              judge: JudgeClient | None = None, judge_template: str = DEFAULT_TEMPLATE,
                              judge_score_pattern: str = DEFAULT_SCORE_PATTERN, judge_score_scale: float = 10.0,
                              judge_max_tokens: int = 16, judge_temperature: float = 0.0,
                              judge_system_prompt: str | None = None, **kwargs: Any) -> dict[str, Any]:
    """The built-in judge function (see the module docstring): ``{"score": s, "judge_text": ...}``."""
    if judge is None:
        raise JudgeError("judge_compute_score needs a judge: set reward_model.rollout.name (hf | vllm) and "
                         "reward_model.model.path to the judge's checkpoint")
    info = extra_info or {}
    question = info.get("question", info.get("prompt", ""))
    content = judge_template.format(question=question, response=solution_str, ground_truth=ground_truth)
    messages = ([{"role": "system", "content": judge_system_prompt}] if judge_system_prompt else [])
    messages.append({"role": "user", "content": content})
    text = await judge.chat(messages, max_tokens=int(judge_max_tokens), temperature=float(judge_temperature))
    return {"score": parse_score(text, judge_score_pattern, judge_score_scale), "judge_text": text}
