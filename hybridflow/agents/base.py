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
import functools
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
    "AgentLoopNotRegistered",
    "AgentLoopOutput",
    "DictConfigWrap",
    "ToolListWrap",
    "register",
    "typed_view",
    "resolve_agent_loop",
    "load_agent_loop_config",
    "registered_agent_loops",
]


class AgentLoopMetrics(BaseModel):
    """Per-trajectory timing: seconds waiting for the model, for tools and for the reward (verl's names);
    extra keys allowed."""

    model_config = ConfigDict(extra="allow")

    generate_sequences: float = 0.0
    tool_calls: float = 0.0
    compute_score: float = 0.0
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
    mm_processor_kwargs: Optional[dict[str, Any]] = None

    def as_dict(self) -> dict[str, Any]:
        """verl's per-trajectory dict: the fields that were set, with ``prompts`` / ``responses`` /
        ``response_mask`` as int64 tensors, ``rollout_log_probs`` (float32) for ``response_logprobs``,
        ``rm_scores`` (the reward on the last response token) for ``reward_score``, ``routed_experts``
        (int16) padded with zero rows to prompt + response length, and ``teacher_ids`` /
        ``teacher_logprobs`` lifted out of ``extra_fields``."""
        import torch

        out = self.model_dump(exclude_unset=True)
        out["prompts"] = torch.tensor(out.pop("prompt_ids"), dtype=torch.int64)
        out["responses"] = torch.tensor(out.pop("response_ids"), dtype=torch.int64)
        out["response_mask"] = torch.tensor(out.pop("response_mask"), dtype=torch.int64)
        logprobs = out.pop("response_logprobs", None)
        if logprobs is not None:
            out["rollout_log_probs"] = torch.tensor(logprobs, dtype=torch.float32)
        experts = out.pop("routed_experts", None)
        if experts is not None:
            experts = torch.as_tensor(experts, dtype=torch.int16)
            total = out["prompts"].numel() + out["responses"].numel()
            aligned = experts.new_zeros((total, *experts.shape[1:]))
            rows = min(experts.shape[0], total)
            aligned[:rows] = experts[:rows]
            out["routed_experts"] = aligned
        score = out.pop("reward_score", None)
        if score is not None:
            rm_scores = torch.zeros(out["response_mask"].shape, dtype=torch.float32)
            if rm_scores.numel():
                rm_scores[-1] = score
            out["rm_scores"] = rm_scores
        extra = out.setdefault("extra_fields", dict(self.extra_fields))  # set in place: not in the fields-set
        for key in ("teacher_ids", "teacher_logprobs"):
            value = extra.pop(key, None)
            if value is not None:
                out[key] = value
        return out


class DictConfigWrap:
    """verl's wrapper that hands a config to loops without Hydra resolving it: ``self.config`` is an
    OmegaConf DictConfig, as verl users index it. ``typed`` is what hybridflow's own loops read: the
    trainer's typed ``PPOConfig`` node when the agent-loop worker builds the loop; for a loop built verl's way
    (``DictConfigWrap(cfg)``) it is ``cfg`` laid over hybridflow's defaults, so every key a built-in loop
    reads has its default value."""

    def __init__(self, config: Any, typed: Any = None):
        self.config = config
        self.typed = typed


class ToolListWrap:
    """verl's wrapper of the tool list given to ``ToolAgentLoop(tools=...)`` (Hydra instantiation would turn
    the tool objects into DictConfigs)."""

    def __init__(self, tools: list):
        self.tools = tools


@functools.lru_cache(maxsize=1)
def _default_tree():
    from omegaconf import OmegaConf

    from hybridflow.config import CONFIG_DIR

    return OmegaConf.load(CONFIG_DIR / "ppo_trainer.yaml")


def typed_view(wrapped: DictConfigWrap | None, node: str | None = None) -> Any:
    """What hybridflow's loops read from a :class:`DictConfigWrap`: its ``typed`` node, else its config over
    the defaults (``node``: the sub-node of the defaults it stands for, e.g. ``"data"``)."""
    if wrapped is None:
        return None
    if getattr(wrapped, "typed", None) is not None:
        return wrapped.typed
    from omegaconf import DictConfig, OmegaConf

    config = wrapped.config
    if not isinstance(config, DictConfig):
        config = OmegaConf.create(config if config is not None else {})
    defaults = OmegaConf.create(OmegaConf.to_container(_default_tree(), resolve=False))
    if node is not None:
        defaults = OmegaConf.create(OmegaConf.to_container(defaults, resolve=True)[node])
    return OmegaConf.merge(defaults, config)


class AgentLoopBase(ABC):
    """Base class of agent loops; one instance per trajectory (cheap: shared state lives in the worker).

    Constructed as verl does: ``cls(trainer_config=DictConfigWrap(cfg), server_manager=..., tokenizer=...,
    processor=..., dataset_cls=..., data_config=DictConfigWrap(cfg.data), hf_model_type=..., **kwargs)`` (the same
    positions); ``dataset_config=`` (verl's name before Feb 2026) is accepted for ``data_config``.
    """

    def __init__(self, trainer_config: DictConfigWrap, server_manager, tokenizer, processor=None,
                 dataset_cls: type | None = None, data_config: DictConfigWrap | None = None,
                 hf_model_type: str | None = None, dataset_config: DictConfigWrap | None = None, **kwargs):
        if data_config is not None and dataset_config is not None and data_config is not dataset_config:
            raise TypeError("give the data config once: data_config= (verl's current name) or dataset_config=")
        data_config = data_config if data_config is not None else dataset_config
        self.config = trainer_config.config
        self.hf_model_type = hf_model_type  # verl picks its token builder by it; rendering here uses the template
        self.typed_config = typed_view(trainer_config)
        self.rollout_config = self.typed_config.actor_rollout_ref.rollout
        self.server_manager = server_manager
        self.tokenizer = tokenizer
        self.processor = processor
        self.dataset_cls = dataset_cls
        self.data_config = data_config.config if data_config is not None else None
        self.dataset_config = self.data_config  # the old attribute name
        kwargs_cfg = self.data_config.get("apply_chat_template_kwargs") if self.data_config is not None else None
        self.apply_chat_template_kwargs: dict[str, Any] = dict(kwargs_cfg or {})
        mm_cfg = self.data_config.get("mm_processor_kwargs") if self.data_config is not None else None
        self.mm_processor_kwargs: dict[str, Any] = dict(mm_cfg or {})
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


class AgentLoopNotRegistered(KeyError, AssertionError):
    """An agent name nobody registered (a ``KeyError``; verl asserts, so also an ``AssertionError``)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def resolve_agent_loop(agent_name: str) -> tuple[type[AgentLoopBase], dict[str, Any]]:
    """The class and extra constructor keywords registered as ``agent_name``; a clear error otherwise."""
    if agent_name not in AGENT_LOOPS:
        hint = closest(agent_name, AGENT_LOOPS.names())
        raise AgentLoopNotRegistered(f"agent loop {agent_name!r} is not registered (known: "
                                     f"{', '.join(AGENT_LOOPS.names())})"
                       + (f"; did you mean {hint!r}?" if hint else "")
                       + ". Register it with @register(name) (in a module listed in trainer.import_modules) or list "
                       "it in actor_rollout_ref.rollout.agent.agent_loop_config_path")
    spec = AGENT_LOOPS.get(agent_name)
    extra = {k: v for k, v in spec.items() if k not in ("_target_", "_class_")}
    return spec["_class_"], extra
