"""The agent-loop API users write against (verl's ``verl.experimental.agent_loop``), and its registry.

An agent loop turns one dataset row into one trajectory.  Every trajectory runs as its own asyncio task
in an :class:`~hybridflow.agents.loop_worker.AgentLoopWorker`; the loop talks to the model only through
``await self.server_manager.generate(request_id=..., prompt_ids=..., sampling_params=...)`` (token ids
in, token ids and log-probs out) and returns an :class:`AgentLoopOutput`:

* ``prompt_ids`` -- the first prompt as the model saw it;
* ``response_ids`` -- everything after it: model tokens *and* observation tokens (tool results, user
  turns), with ``response_mask`` 1 on model tokens and 0 on observations (never trained on);
* ``response_logprobs`` -- the rollout's log-prob of each model token (0 on observations), when asked;
* ``num_turns``, ``metrics``, ``extra_fields`` (e.g. ``turn_scores``, ``tool_rewards``), optional
  ``reward_score`` (a loop that scores its own trajectory).

Loops are found by name: ``@register("my_agent")`` on the class, or a YAML list named by
``actor_rollout_ref.rollout.agent.agent_loop_config_path`` (``- name: my_agent`` / ``_target_:
pkg.module.Class`` plus constructor keywords), selected per row by the ``agent_name`` column or
``rollout.agent.default_agent_loop``.
"""

from __future__ import annotations

import asyncio
import os
import sys
from abc import ABC, abstractmethod
from typing import Any, Optional

import yaml
from pydantic import BaseModel, ConfigDict

from hybridflow.utils.registry import Registry, closest

__all__ = [
    "AGENT_LOOPS",
    "AgentLoopBase",
    "AgentLoopMetrics",
    "AgentLoopOutput",
    "DictConfigWrap",
    "register",
    "resolve_agent_loop",
    "load_agent_loop_config",
    "registered_agent_loops",
]


class AgentLoopMetrics(BaseModel):
    """Per-trajectory timing: seconds waiting for the model and for tools (verl's names); extra keys allowed."""

    model_config = ConfigDict(extra="allow")

    generate_sequences: float = 0.0
    tool_calls: float = 0.0
    num_preempted: int = -1


class AgentLoopOutput(BaseModel):
    """One finished trajectory (see the module docstring for the fields)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: Optional[list[float]] = None
    routed_experts: Optional[Any] = None
    multi_modal_data: Optional[dict[str, Any]] = None
    reward_score: Optional[float] = None
    num_turns: int = 0
    metrics: AgentLoopMetrics = AgentLoopMetrics()
    extra_fields: dict[str, Any] = {}


class DictConfigWrap:
    """verl's wrapper that hands the trainer config to loops (``self.config`` is an OmegaConf DictConfig,
    as verl users index it); ``typed`` is hybridflow's typed ``PPOConfig`` node for code that prefers it."""

    def __init__(self, config: Any, typed: Any = None):
        self.config = config
        self.typed = typed


class AgentLoopBase(ABC):
    """Base class of agent loops; one instance per trajectory (cheap: shared state lives in the worker)."""

    def __init__(self, trainer_config: DictConfigWrap, server_manager, tokenizer, processor=None,
                 dataset_cls: type | None = None, dataset_config: DictConfigWrap | None = None, **kwargs):
        self.config = trainer_config.config
        self.typed_config = trainer_config.typed
        self.server_manager = server_manager
        self.tokenizer = tokenizer
        self.processor = processor
        self.dataset_cls = dataset_cls
        self.dataset_config = dataset_config.config if dataset_config is not None else None
        kwargs_cfg = self.dataset_config.get("apply_chat_template_kwargs") if self.dataset_config is not None else None
        self.apply_chat_template_kwargs: dict[str, Any] = dict(kwargs_cfg or {})
        try:  # verl's loops keep the loop they run on; built outside one, there is none yet
            self.loop = asyncio.get_running_loop()
        except RuntimeError:
            self.loop = None

    async def apply_chat_template(self, messages: list[dict[str, Any]], tools: list[dict] | None = None,
                                  images: list | None = None, videos: list | None = None,
                                  remove_system_prompt: bool = False) -> list[int]:
        """Token ids of ``messages`` rendered with the model's chat template and a generation prompt.

        Rendering runs inline: a template render costs well under a millisecond, less than a thread hop.
        ``remove_system_prompt`` drops the template's default system turn (for rendering a message
        fragment to append to a conversation); see :func:`hybridflow.agents.chat.render_continuation`
        for the exact continuation of an existing conversation.
        """
        from hybridflow.agents.chat import render_prompt

        return render_prompt(self.tokenizer, self.processor, messages, tools=tools, images=images,
                             remove_system_prompt=remove_system_prompt, **self.apply_chat_template_kwargs)

    @abstractmethod
    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        """Run one trajectory; ``kwargs`` are the row's columns (``raw_prompt``, ``tools_kwargs``, ...)."""


# ---------------------------------------------------------------------------------------------- registry
# name -> {"_class_": the loop class, "_target_": its dotted path, plus the YAML entry's constructor keywords}
AGENT_LOOPS: Registry[dict[str, Any]] = Registry("agent loop")


def register(agent_name: str):
    """Class decorator: make an agent loop selectable as ``agent_name`` (verl's ``register``)."""

    def decorator(cls: type[AgentLoopBase]) -> type[AgentLoopBase]:
        AGENT_LOOPS.register(agent_name, {"_target_": f"{cls.__module__}.{cls.__qualname__}", "_class_": cls},
                             override=True)
        return cls

    return decorator


def registered_agent_loops() -> list[str]:
    return AGENT_LOOPS.names()


def load_agent_loop_config(path: str) -> list[str]:
    """Register the loops of a verl agent-loop YAML (a list of ``name`` + ``_target_`` + keywords); returns
    their names.  Every entry is checked now, so a typo fails before any model is loaded.

    ``_target_`` is a dotted ``package.module.Class`` (verl's form), ``module:Class`` or ``file.py:Class``; a module
    or file kept beside the YAML is found in every process (Ray agent-loop workers included): the YAML's folder
    is put on the import path and relative files are read from it.
    """
    from hybridflow.utils.load_object import load_object

    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"actor_rollout_ref.rollout.agent.agent_loop_config_path={path!r} does not exist")
    folder = os.path.dirname(path)
    if folder not in sys.path:
        sys.path.append(folder)
    with open(path, encoding="utf-8") as f:
        entries = yaml.safe_load(f)
    if not isinstance(entries, list):
        raise ValueError(f"{path}: an agent-loop config is a YAML list of entries with 'name' and '_target_'")
    names = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or "name" not in entry or "_target_" not in entry:
            raise ValueError(f"{path}: entry {i} needs 'name' and '_target_' (a 'package.module.Class' path), "
                             f"got {entry!r:.200}")
        spec = dict(entry)
        name = str(spec.pop("name"))
        spec["_class_"] = load_object(str(spec["_target_"]), key=f"{path}: entry '{name}' _target_",
                                      kind="agent loop class", expect=_agent_loop_class, base_dir=folder)
        AGENT_LOOPS.register(name, spec, override=True)
        names.append(name)
    return names


def _agent_loop_class(obj: Any) -> str | None:
    if isinstance(obj, type) and issubclass(obj, AgentLoopBase):
        return None
    return "must subclass AgentLoopBase (from hybridflow.experimental.agent_loop import AgentLoopBase)"


def resolve_agent_loop(agent_name: str) -> tuple[type[AgentLoopBase], dict[str, Any]]:
    """The class and extra constructor keywords registered as ``agent_name``; a clear error otherwise."""
    if agent_name not in AGENT_LOOPS:
        hint = closest(agent_name, AGENT_LOOPS.names())
        raise KeyError(f"agent loop {agent_name!r} is not registered (known: {', '.join(AGENT_LOOPS.names())})"
                       + (f"; did you mean {hint!r}?" if hint else "")
                       + ". Register it with @register(name) (in a module listed in trainer.import_modules) or list "
                       "it in actor_rollout_ref.rollout.agent.agent_loop_config_path")
    spec = AGENT_LOOPS.get(agent_name)
    extra = {k: v for k, v in spec.items() if k not in ("_target_", "_class_")}
    return spec["_class_"], extra
