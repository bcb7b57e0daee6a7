"""verl's agent-loop API (``verl.experimental.agent_loop``) at ``hybridflow.experimental.agent_loop``.

A loop constructed verl's way -- ``DictConfigWrap(DictConfig)`` without hybridflow's typed config,
``data_config=`` (verl's name since Feb 2026) or ``dataset_config=`` (before), ``tools=ToolListWrap([...])``
for the tool agent -- must run; ``AgentLoopOutput.as_dict`` gives verl's per-trajectory dict.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import torch
from omegaconf import OmegaConf

from hybridflow.experimental.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    DictConfigWrap,
    ToolAgentLoop,
    ToolListWrap,
)
from hybridflow.experimental.agent_loop.tool_agent_loop import AgentState
from hybridflow.experimental.agent_loop.tool_parser import GptOssToolParser, ToolParser
from hybridflow.rollout.base import TokenOutput
from hybridflow.rollout.service.replica import RolloutReplica
from hybridflow.rollout.service.server_manager import AsyncLLMServerManager
from hybridflow.tools import function_tool as function_tool_mod
from hybridflow.tools.function_tool import FUNCTION_TOOL_REGISTRY, function_tool


# --------------------------------------------------------------------------------------------- as_dict
def test_as_dict_converts_the_fields_that_were_set():
    out = AgentLoopOutput(prompt_ids=[1, 2], response_ids=[3, 4, 5], response_mask=[1, 0, 1],
                          response_logprobs=[-0.1, 0.0, -0.3], reward_score=0.75, metrics=AgentLoopMetrics(),
                          extra_fields={"turn_scores": [1.0], "teacher_ids": [7], "teacher_logprobs": [-1.0]})
    d = out.as_dict()
    assert d["prompts"].dtype == d["responses"].dtype == d["response_mask"].dtype == torch.int64
    assert d["prompts"].tolist() == [1, 2] and d["responses"].tolist() == [3, 4, 5]
    assert d["rollout_log_probs"].dtype == torch.float32 and d["rollout_log_probs"].tolist() == pytest.approx([-0.1, 0, -0.3])
    assert d["rm_scores"].tolist() == [0.0, 0.0, 0.75]  # the score sits on the last response token
    assert d["teacher_ids"] == [7] and d["teacher_logprobs"] == [-1.0]
    assert d["extra_fields"] == {"turn_scores": [1.0]}
    assert "num_turns" not in d and "prompt_ids" not in d and "reward_score" not in d  # unset / converted
    assert d["metrics"] == {}  # model_dump(exclude_unset=True) is recursive, as in verl


def test_as_dict_pads_routed_experts_to_the_whole_sequence_and_keeps_late_extra_fields():
    out = AgentLoopOutput(prompt_ids=[1, 2], response_ids=[3, 4], response_mask=[1, 1],
                          routed_experts=[[[1, 2]], [[3, 4]], [[5, 6]]], metrics={})
    out.extra_fields["added_later"] = True  # mutating the default dict: not in pydantic's fields-set
    d = out.as_dict()
    assert d["routed_experts"].dtype == torch.int16 and d["routed_experts"].shape == (4, 1, 2)
    assert d["routed_experts"][3].tolist() == [[0, 0]] and d["routed_experts"][2].tolist() == [[5, 6]]
    assert d["extra_fields"] == {"added_later": True} and "rollout_log_probs" not in d and "rm_scores" not in d


# --------------------------------------------------------------------------------------------- construction
class ScriptedReplica(RolloutReplica):
    """Turn k answers ``turns[k]`` followed by EOS."""

    name = "scripted"

    def __init__(self, tokenizer, turns):
        self.tok, self.turns, self.params = tokenizer, list(turns), []

    async def generate(self, request_id, prompt_ids, sampling_params, multi_modal_data=None):
        self.params.append(sampling_params)
        ids = self.tok.encode(self.turns.pop(0), add_special_tokens=False) + [self.tok.eos_token_id]
        return TokenOutput(request_id, ids, None, "stop")


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def verl_config(**multi_turn):
    """The part of verl's trainer config an agent loop reads (as verl's AgentLoopWorker passes it)."""
    return OmegaConf.create({
        "data": {"apply_chat_template_kwargs": {}},
        "actor_rollout_ref": {"rollout": {
            "prompt_length": 128, "response_length": 128,
            "multi_turn": {"enable": True, "format": "hermes", "max_assistant_turns": 3, "max_user_turns": 3,
                           "max_parallel_calls": 1, "max_tool_response_length": 256,
                           "tool_response_truncate_side": "middle", **multi_turn}}},
    })


@pytest.fixture
def registry():
    saved, saved_paths = dict(FUNCTION_TOOL_REGISTRY), dict(function_tool_mod._LOADED_FUNCTION_TOOL_PATHS)
    yield
    FUNCTION_TOOL_REGISTRY.clear()
    FUNCTION_TOOL_REGISTRY.update(saved)
    function_tool_mod._LOADED_FUNCTION_TOOL_PATHS.clear()
    function_tool_mod._LOADED_FUNCTION_TOOL_PATHS.update(saved_paths)


def test_tool_agent_built_verls_way_runs_function_tools(tokenizer, registry):
    @function_tool("double")
    def double(n: int) -> dict:
        """Double a number.

        Args:
            n: the number.
        """
        return {"result": 2 * n}

    cfg = verl_config()
    replica = ScriptedReplica(tokenizer, ['<tool_call>{"name": "double", "arguments": {"n": 21}}</tool_call>', "42"])
    loop = ToolAgentLoop(trainer_config=DictConfigWrap(cfg), server_manager=AsyncLLMServerManager([replica], 128),
                         tokenizer=tokenizer, processor=None, dataset_cls=None, data_config=DictConfigWrap(cfg.data),
                         tools=ToolListWrap([FUNCTION_TOOL_REGISTRY["double"]]))
    assert loop.config is cfg and loop.data_config is cfg.data
    out = asyncio.run(loop.run({"temperature": 1.0}, raw_prompt=[{"role": "user", "content": "double 21"}]))
    observation = tokenizer.decode([t for t, m in zip(out.response_ids, out.response_mask) if m == 0])
    assert '{"result": 42}' in observation
    assert out.extra_fields["tool_call_count"] == 1 and out.extra_fields["tool_error_count"] == 0
    assert out.num_turns == 4
    assert loop.tool_schemas[0]["function"]["name"] == "double"  # the model is shown the tool


def test_function_tool_path_is_read_from_the_config(tokenizer, tmp_path, registry):
    path = tmp_path / "my_tools.py"
    path.write_text("from hybridflow.tools.function_tool import function_tool\n\n"
                    "@function_tool\ndef shout(text: str) -> str:\n"
                    "    '''Upper-case a text.\n\n    Args:\n        text: the text.\n    '''\n"
                    "    return text.upper()\n")
    cfg = verl_config(function_tool_path=str(path), tool_config_path=None)
    replica = ScriptedReplica(tokenizer, ['<tool_call>{"name": "shout", "arguments": {"text": "hi"}}</tool_call>', "ok"])
    loop = ToolAgentLoop(DictConfigWrap(cfg), AsyncLLMServerManager([replica], 128), tokenizer, None, None,
                         DictConfigWrap(cfg.data), "qwen2")  # verl's positions, hf_model_type last
    out = asyncio.run(loop.run({"temperature": 1.0}, raw_prompt=[{"role": "user", "content": "shout hi"}]))
    assert "HI" in tokenizer.decode([t for t, m in zip(out.response_ids, out.response_mask) if m == 0])


class EchoLoop(AgentLoopBase):
    """A user loop as verl's docs write one."""

    async def run(self, sampling_params, **kwargs):
        prompt_ids = await self.apply_chat_template(kwargs["raw_prompt"])
        out = await self.server_manager.generate(request_id="e", prompt_ids=prompt_ids, sampling_params=sampling_params,
                                                 image_data=None, audio_data=None, video_data=None,
                                                 mm_processor_kwargs={}, priority=0)  # verl's keywords
        return AgentLoopOutput(prompt_ids=prompt_ids, response_ids=out.token_ids,
                               response_mask=[1] * len(out.token_ids), num_turns=2, metrics=AgentLoopMetrics())


@pytest.mark.parametrize("keyword", ["data_config", "dataset_config"])
def test_user_loop_accepts_both_data_config_spellings(tokenizer, keyword):
    cfg = verl_config()
    cfg.data.apply_chat_template_kwargs = {"enable_thinking": False}
    replica = ScriptedReplica(tokenizer, ["hello"])
    loop = EchoLoop(trainer_config=DictConfigWrap(cfg), server_manager=AsyncLLMServerManager([replica], 128),
                    tokenizer=tokenizer, processor=None, dataset_cls=None, **{keyword: DictConfigWrap(cfg.data)})
    assert loop.data_config is cfg.data and loop.dataset_config is cfg.data
    assert loop.apply_chat_template_kwargs == {"enable_thinking": False}
    assert loop.rollout_config.response_length == 128
    out = asyncio.run(loop.run({"temperature": 1.0}, raw_prompt=[{"role": "user", "content": "hi"}]))
    assert tokenizer.decode(out.response_ids).startswith("hello")
    with pytest.raises(TypeError, match="data config once"):
        EchoLoop(DictConfigWrap(cfg), None, tokenizer, data_config=DictConfigWrap(cfg.data),
                 dataset_config=DictConfigWrap(OmegaConf.create({})))


# --------------------------------------------------------------------------------------------- names
def test_verl_names_at_verl_paths(tokenizer):
    assert [s.value for s in AgentState][:4] == ["pending", "generating", "processing_tools", "interacting"]
    assert AgentState.TERMINATED.value == "terminated"
    assert isinstance(ToolParser.get_tool_parser("gpt-oss", tokenizer), GptOssToolParser)
    from hybridflow.protocol import DataProtoConfig

    assert DataProtoConfig.auto_padding in (True, False)
    wrapped = ToolListWrap([1, 2])
    assert wrapped.tools == [1, 2]
    assert json.loads(json.dumps(AgentLoopMetrics().model_dump()))["compute_score"] == 0.0


# what verl's users import from ``verl.experimental.agent_loop`` and its ``agent_loop`` module
VERL_AGENT_LOOP_NAMES = ("AgentLoopBase", "AgentLoopManager", "AgentLoopMetrics", "AgentLoopOutput", "AgentLoopWorker",
                         "AsyncLLMServerManager", "DictConfigWrap", "SingleTurnAgentLoop", "TokenOutput",
                         "ToolAgentLoop", "ToolListWrap", "register")


@pytest.mark.parametrize("path", ["hybridflow.experimental.agent_loop", "hybridflow.experimental.agent_loop.agent_loop"])
def test_verls_agent_loop_paths_re_export_the_one_list(path):
    """Both verl paths export :mod:`hybridflow.agents`' ``__all__`` -- the same objects, nothing more or less -- and
    it holds every name verl's users import there."""
    import importlib

    import hybridflow.agents as agents

    module = importlib.import_module(path)
    assert module.__all__ == agents.__all__
    assert all(getattr(module, name) is getattr(agents, name) for name in agents.__all__)
    assert set(VERL_AGENT_LOOP_NAMES) <= set(agents.__all__)
    namespace: dict = {}
    exec(f"from {path} import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(agents.__all__)


# --------------------------------------------------------------------------------------------- worker
SEEN: dict = {}


class RecordingLoop(AgentLoopBase):
    """Records what verl's worker hands every loop."""

    def __init__(self, *args, tools: ToolListWrap | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        SEEN["tools"] = tools

    async def run(self, sampling_params, **kwargs):
        return AgentLoopOutput(prompt_ids=[1], response_ids=[2], response_mask=[1], metrics=AgentLoopMetrics())


def test_the_worker_hands_every_loop_the_runs_tools(tiny_model_dir, tokenizer, tmp_path):

    from hybridflow.agents.base import register
    from hybridflow.agents.loop_worker import AgentLoopWorker
    from hybridflow.launch.config import load_config
    from hybridflow.protocol import DataProto

    register("recording_agent")(RecordingLoop)
    tools = tmp_path / "tools.yaml"
    tools.write_text("tools:\n  - class_name: calculator\n    config: {type: native}\n")
    cfg = load_config([f"actor_rollout_ref.model.path={tiny_model_dir}", f"critic.model.path={tiny_model_dir}",
                       f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tools}", "trainer.n_gpus_per_node=1",
                       "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "critic.ppo_micro_batch_size_per_gpu=2"])
    worker = AgentLoopWorker(cfg, [ScriptedReplica(tokenizer, [])], tokenizer=tokenizer)
    rows = {"__request_id__": ["r0"], "__seed__": [1], "agent_name": ["recording_agent"],
            "raw_prompt": [[{"role": "user", "content": "hi"}]]}
    (output, metrics), = asyncio.run(worker.run_trajectories(DataProto.from_dict(non_tensors=rows)))
    assert metrics["error"] == 0.0 and output.response_ids == [2]
    assert isinstance(SEEN["tools"], ToolListWrap) and [t.name for t in SEEN["tools"].tools] == ["calculator"]


def test_an_unregistered_agent_name_is_verls_assertion_and_a_key_error():
    from hybridflow.agents.base import resolve_agent_loop

    for error in (AssertionError, KeyError):
        with pytest.raises(error, match="'no_such_agent' is not registered"):
            resolve_agent_loop("no_such_agent")


# --------------------------------------------------------------------------------------------- extra fields schema
def test_extra_fields_keep_one_schema_across_loops_for_concatenation(tokenizer, registry):
    """verl's intent (agent-loop extra-fields schema test): whichever loop produced a trajectory, the rollout batch
    has the stable extra-field columns, one entry per row, the list ones lists -- so the batches of two loops (or
    two generation rounds) concatenate for training."""
    from hybridflow.agents.postprocess import STABLE_EXTRA_FIELDS, outputs_to_batch
    from hybridflow.experimental.agent_loop import SingleTurnAgentLoop
    from hybridflow.protocol import DataProto

    cfg = verl_config()
    single = SingleTurnAgentLoop(trainer_config=DictConfigWrap(cfg), tokenizer=tokenizer, processor=None,
                                 server_manager=AsyncLLMServerManager([ScriptedReplica(tokenizer, ["42"])], 128),
                                 dataset_cls=None, data_config=DictConfigWrap(cfg.data))
    out = asyncio.run(single.run({"temperature": 1.0}, raw_prompt=[{"role": "user", "content": "hi"}], request_id="r0"))
    assert out.extra_fields["turn_scores"] == [] and out.extra_fields["tool_rewards"] == []

    custom = AgentLoopOutput(prompt_ids=[5, 6], response_ids=[7], response_mask=[1], num_turns=2,
                             extra_fields={"extras": {"source": "mine"}, "max_global_steps": 3})  # a user's loop
    batches = [outputs_to_batch([o], 32, 8, 0) for o in (out, custom)]
    for batch in batches:
        for key in STABLE_EXTRA_FIELDS:
            assert batch.non_tensor_batch[key].shape == (1,), key
    assert batches[1].non_tensor_batch["turn_scores"][0] == [] and batches[1].non_tensor_batch["extras"][0] == {
        "source": "mine"}
    merged = DataProto.concat([b.select(batch_keys=["responses"], non_tensor_batch_keys=list(STABLE_EXTRA_FIELDS))
                               for b in batches])
    assert merged.non_tensor_batch["tool_rewards"].tolist() == [[], []]
    assert merged.non_tensor_batch["max_global_steps"].tolist() == [None, 3]
