"""``tool_agent``: verl's multi-turn loop -- the model calls tools (and talks to a simulated user) until done.

State machine (verl's): *generating* -> the model's turn; if it wrote tool calls -> *processing tools* ->
back to generating; if it wrote none and an interaction is configured -> *interacting* (the simulated user
answers) -> generating; otherwise -> *terminated*.  Limits (``actor_rollout_ref.rollout.multi_turn.*``):
``max_assistant_turns``, ``max_user_turns`` (tool rounds and user replies both count, as in verl),
``max_parallel_calls`` (calls beyond it in one turn are ignored), ``max_tool_response_length`` +
``tool_response_truncate_side`` (observation text), ``format`` (the tool-call parser).

Tokens: the model's tokens are kept exactly as sampled (``response_mask`` 1, their rollout log-probs);
what the chat template puts between turns (tool results, user replies, the next generation prompt) is
appended with ``response_mask`` 0 and log-prob 0.  ``rollout.response_length`` is the budget of the
whole trajectory: each turn may use what is left, an observation that does not fit ends the trajectory
without being appended, so a trajectory always ends after a model turn.

Images (vision-language models): the row's images are in its messages; a tool whose ``ToolResponse``
carries images adds them to its tool message (images first, then the text), rendered by the processor's
chat template with the image tokens expanded. Every model call sends all images so far, and the output's
``multi_modal_data`` lists them in order, so the actor recomputes log-probs with the same pixels.

Failures are observations, not crashes: a malformed call, an unknown tool, arguments that violate the
schema, a tool that raises, hangs past its time limit or returns garbage -- the model reads an error text
next turn, and the trajectory counts it (``tool_errors`` by kind).
"""

from __future__ import annotations

import asyncio
import logging
import time
from enum import Enum
from typing import Any

from hybridflow.agents.base import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, ToolListWrap, register
from hybridflow.agents.chat import check_tokenization, render_continuation
from hybridflow.agents.tool_parser import ToolParser
from hybridflow.agents.tool_session import load_executor, load_interactions, tool_schemas
from hybridflow.agents.trajectory_images import image_message_content, message_images, tool_images

__all__ = ["AgentState", "ToolAgentLoop"]

logger = logging.getLogger(__name__)


class AgentState(Enum):
    """The states of a tool-agent trajectory (verl's names; ``INTERACTING`` is the simulated user's turn)."""

    PENDING = "pending"
    GENERATING = "generating"
    PROCESSING_TOOLS = "processing_tools"
    INTERACTING = "interacting"
    TERMINATED = "terminated"


@register("tool_agent")
class ToolAgentLoop(AgentLoopBase):
    """``tools=ToolListWrap([...])`` (verl's way, BaseTool objects or ``@function_tool`` entries) replaces the
    tools of ``rollout.multi_turn.tool_config_path`` / ``function_tool_path``."""

    def __init__(self, *args, tools: ToolListWrap | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        rollout = self.typed_config.actor_rollout_ref.rollout
        self.mt = rollout.multi_turn
        self.response_length = int(rollout.response_length)
        given = list(tools.tools) if tools is not None else None
        self.executor = load_executor(self.mt, given)
        self.tool_schemas = tool_schemas(self.executor.tools.values())
        self.interactions = load_interactions(self.mt.interaction_config_path)
        self.parser = ToolParser.get_tool_parser(self.mt.format, self.tokenizer)
        self.parser_tools = [t.tool_schema for t in self.executor.tools.values()]
        eos = self.tokenizer.eos_token_id
        self.stop_ids = [eos] if isinstance(eos, int) else list(eos or [])

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        state = _Trajectory(list(kwargs["raw_prompt"]))
        request_id = str(kwargs.get("request_id") or id(state))
        interaction, interaction_kwargs, instance = await self._start_interaction(request_id, kwargs)
        session = self.executor.session(kwargs.get("tools_kwargs") or {})
        state.images = message_images(state.messages) if self.processor is not None else []
        prompt_ids = await self.apply_chat_template(state.messages, tools=self.tool_schemas or None,
                                                    images=state.images or None)
        state.phase = AgentState.GENERATING
        try:
            while state.phase is not AgentState.TERMINATED:
                if state.phase is AgentState.GENERATING:
                    state.phase = await self._generating(state, request_id, prompt_ids, sampling_params,
                                                         interaction is not None)
                elif state.phase is AgentState.PROCESSING_TOOLS:
                    ok = await self._run_tools(state, state.pending, session)
                    state.phase = AgentState.GENERATING if ok else AgentState.TERMINATED
                else:  # INTERACTING
                    ok = await self._interact(state, interaction, instance, interaction_kwargs)
                    state.phase = AgentState.GENERATING if ok else AgentState.TERMINATED
        finally:
            reward_scores = await session.close()
            if interaction is not None:
                await interaction.finalize_interaction(instance)
        return self._output(state, prompt_ids, session, reward_scores, sampling_params)

    # ------------------------------------------------------------------ states
    async def _generating(self, state: "_Trajectory", request_id: str, prompt_ids: list[int], sampling_params,
                          interacting: bool) -> AgentState:
        """One model turn; the next state from what it wrote and the turn limits."""
        budget = self.response_length - len(state.response)
        if budget <= 0:
            return AgentState.TERMINATED
        output = await self._generate(state, request_id, prompt_ids, sampling_params, budget)
        if output.finish_reason != "stop" or self._turn_limit(state.assistant_turns, self.mt.max_assistant_turns):
            return AgentState.TERMINATED
        found = await self.parser.extract_tool_calls_with_errors(output.token_ids, self.parser_tools)
        if not found.items and not interacting:
            return AgentState.TERMINATED
        if self._turn_limit(state.user_turns, self.mt.max_user_turns):
            return AgentState.TERMINATED
        state.pending = found.items
        return AgentState.PROCESSING_TOOLS if found.items else AgentState.INTERACTING

    async def _generate(self, state: "_Trajectory", request_id: str, prompt_ids: list[int], sampling_params,
                        budget: int):
        params = dict(sampling_params, max_tokens=budget)
        if self.parser.stop_token_ids:  # formats whose models keep writing after a call (Kimi, GLM, Gemma 4)
            params["stop_token_ids"] = list(dict.fromkeys([*self.stop_ids, *self.parser.stop_token_ids]))
        start = time.perf_counter()
        output = await self.server_manager.generate(request_id=request_id, prompt_ids=prompt_ids + state.response,
                                                    sampling_params=params, image_data=list(state.images) or None)
        state.generate_s += time.perf_counter() - start
        tokens = list(output.token_ids)[:budget]
        state.response += tokens
        state.mask += [1] * len(tokens)
        state.log_probs += list(output.log_probs[: len(tokens)]) if output.log_probs is not None else [0.0] * len(tokens)
        state.has_log_probs = state.has_log_probs and output.log_probs is not None
        state.assistant_turns += 1
        state.last_stop = output.finish_reason == "stop"
        state.finish_reason = output.finish_reason
        text = self.tokenizer.decode(tokens[:-1] if state.last_stop else tokens, skip_special_tokens=False)
        state.messages.append({"role": "assistant", "content": text})
        return output

    async def _run_tools(self, state: "_Trajectory", items, session) -> bool:
        """Execute the turn's calls (parse errors answered as errors); append the observation if it fits."""
        items = items[: int(self.mt.max_parallel_calls)]
        start = time.perf_counter()
        outcomes = await asyncio.gather(*(
            session.call(item.name, item.arguments) if hasattr(item, "arguments")
            else _settled(self.executor.parse_error_outcome(item.message)) for item in items
        ))
        state.tool_s += time.perf_counter() - start
        for outcome in outcomes:
            if not hasattr(outcome, "response"):
                continue
            state.tool_rewards.append(float(outcome.step_reward))
            if outcome.error_kind == "parse_error":  # parse errors never reach the session: count them here
                state.parse_errors += 1
        texts = [o.text for o in outcomes]
        names = [o.name for o in outcomes]
        new_images = [tool_images(o.name, o.response.image) for o in outcomes]
        flat_images = [im for ims in new_images for im in ims]
        formatted = None if flat_images else self.parser.format_tool_responses(texts, names)
        new_messages = [{"role": "tool", "content": image_message_content(t, ims)} for t, ims in zip(texts, new_images)]
        if formatted is not None:
            observation = self.tokenizer.encode(formatted, add_special_tokens=False)
        else:
            observation = render_continuation(self.tokenizer, new_messages, self.stop_ids, state.last_stop,
                                              self.processor, images=flat_images, **self.apply_chat_template_kwargs)
        if not self._append_observation(state, observation, new_messages):
            return False
        state.images += flat_images
        return True

    async def _interact(self, state: "_Trajectory", interaction, instance: str, interaction_kwargs: dict) -> bool:
        terminate, reply, score, _ = await interaction.generate_response(instance, state.messages, **interaction_kwargs)
        state.user_turns += 1
        if score is not None:
            state.turn_scores.append(float(score))
        if terminate:
            return False
        message = [{"role": "user", "content": str(reply)}]
        observation = render_continuation(self.tokenizer, message, self.stop_ids, state.last_stop, self.processor,
                                          **self.apply_chat_template_kwargs)
        return self._append_observation(state, observation, message, count_turn=False)

    def _append_observation(self, state: "_Trajectory", observation: list[int], messages, count_turn=True) -> bool:
        if len(state.response) + len(observation) >= self.response_length:
            return False  # no room for the observation and an answer: end after the model's turn
        state.response += observation
        state.mask += [0] * len(observation)
        state.log_probs += [0.0] * len(observation)
        state.messages.extend(messages)
        state.user_turns += int(count_turn)
        return True

    async def _start_interaction(self, request_id: str, kwargs: dict):
        if not self.interactions:
            return None, {}, ""
        extra = kwargs.get("extra_info") or {}
        interaction_kwargs = dict(kwargs.get("interaction_kwargs") or extra.get("interaction_kwargs") or {})
        name = interaction_kwargs.get("name")
        if name is None:
            if len(self.interactions) != 1:
                raise ValueError("extra_info.interaction_kwargs.name is required to pick one of the interactions "
                                 f"{sorted(self.interactions)}")
            name = next(iter(self.interactions))
        if name not in self.interactions:
            raise ValueError(f"extra_info.interaction_kwargs.name={name!r} is not in "
                             f"rollout.multi_turn.interaction_config_path (known: {sorted(self.interactions)})")
        interaction = self.interactions[name]
        instance = await interaction.start_interaction(request_id, **interaction_kwargs)
        return interaction, interaction_kwargs, instance

    @staticmethod
    def _turn_limit(turns: int, limit: int | None) -> bool:
        return limit is not None and turns >= int(limit)

    # ------------------------------------------------------------------ output
    def _output(self, state: "_Trajectory", prompt_ids: list[int], session, reward_scores: dict,
                sampling_params: dict) -> AgentLoopOutput:
        tool_metrics = session.metrics()
        calls = tool_metrics.get("tool_calls", 0.0) + state.parse_errors
        errors = tool_metrics.get("tool_errors", 0.0) + state.parse_errors
        extra: dict[str, Any] = {"turn_scores": state.turn_scores, "tool_rewards": state.tool_rewards,
                                 "reward_scores": reward_scores, "tool_call_count": calls, "tool_error_count": errors,
                                 "finish_reason": state.finish_reason}
        mismatch = check_tokenization(self.tokenizer, prompt_ids + state.response, state.messages,
                                      self.tool_schemas or None, self.mt.tokenization_sanity_check_mode,
                                      self.processor, images=state.images, **self.apply_chat_template_kwargs)
        mask = state.mask
        if mismatch is not None:
            extra["tokenization_mismatch"] = mismatch
            if self.mt.tokenization_sanity_check_mode == "strict":  # an error: never trained on
                extra["untrained_model_tokens"] = sum(mask)  # generated, then masked: not observations
                mask = [0] * len(mask)
        kinds = {k: v for k, v in tool_metrics.items() if k.startswith("tool_errors/")}
        if state.parse_errors:
            kinds["tool_errors/parse_error"] = kinds.get("tool_errors/parse_error", 0.0) + state.parse_errors
        metrics = AgentLoopMetrics(generate_sequences=state.generate_s, tool_calls=state.tool_s, **kinds)
        wants_log_probs = bool(sampling_params.get("logprobs", False))
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=state.response,
            response_mask=mask,
            response_logprobs=state.log_probs if (wants_log_probs and state.has_log_probs) else None,
            multi_modal_data={"image": list(state.images)} if state.images else None,
            num_turns=state.user_turns + state.assistant_turns + 1,
            metrics=metrics,
            extra_fields=extra,
        )


class _Trajectory:
    """Everything one tool-agent trajectory accumulates."""

    def __init__(self, messages: list[dict[str, Any]]):
        self.messages = messages
        self.images: list = []  # every image shown so far (prompt, then tool responses), in token order
        self.response: list[int] = []
        self.mask: list[int] = []
        self.log_probs: list[float] = []
        self.has_log_probs = True
        self.assistant_turns = 0
        self.user_turns = 0
        self.turn_scores: list[float] = []
        self.tool_rewards: list[float] = []
        self.parse_errors = 0
        self.last_stop = True
        self.finish_reason = "stop"
        self.generate_s = 0.0
        self.tool_s = 0.0
        self.phase = AgentState.PENDING
        self.pending: list = []  # the calls (and parse errors) of the last model turn


async def _settled(value):
    return value
