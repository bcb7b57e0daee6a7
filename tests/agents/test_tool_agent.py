"""The tool agent's state machine on scripted model turns: tool calls, observations, limits, bad calls,
interactions, and the token budget.  The "model" is a replica that answers each turn with a fixed text, so
every branch is reached on purpose; the real engine path is exercised by the end-to-end tests."""

from __future__ import annotations

import asyncio
import json

import pytest

from hybridflow.agents import AgentLoopOutput, DictConfigWrap
from hybridflow.agents.tool_agent import ToolAgentLoop
from hybridflow.rollout.base import TokenOutput
from hybridflow.rollout.service.replica import RolloutReplica
from hybridflow.rollout.service.server_manager import AsyncLLMServerManager


class ScriptedReplica(RolloutReplica):
    """Answers turn k with ``turns[k]`` (ending with EOS unless it ends with '...'), within ``max_tokens``."""

    name = "scripted"

    def __init__(self, tokenizer, turns):
        self.tok, self.turns, self.prompts = tokenizer, list(turns), []

    async def generate(self, request_id, prompt_ids, sampling_params, multi_modal_data=None):
        self.prompts.append(list(prompt_ids))
        text = self.turns.pop(0)
        stop = not text.endswith("...")
        ids = self.tok.encode(text, add_special_tokens=False) + ([self.tok.eos_token_id] if stop else [])
        finish = "stop" if stop else "length"
        if len(ids) > sampling_params.max_tokens:
            ids, finish = ids[: sampling_params.max_tokens], "length"
        return TokenOutput(request_id, ids, [-0.5] * len(ids) if sampling_params.logprobs else None, finish)


def call(name, **arguments):
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture()
def make_loop(tiny_model_dir, tokenizer, tmp_path):
    tools = tmp_path / "tools.yaml"
    tools.write_text("tools:\n  - class_name: calculator\n    config: {type: native}\n")

    def make(turns, *overrides, response_length=256):
        from omegaconf import OmegaConf

        from hybridflow.config import config_to_dict
        from hybridflow.launch.config import load_config

        cfg = load_config([f"actor_rollout_ref.model.path={tiny_model_dir}", f"critic.model.path={tiny_model_dir}",
                           "actor_rollout_ref.rollout.name=hf", f"data.max_response_length={response_length}",
                           f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tools}",
                           "actor_rollout_ref.rollout.multi_turn.enable=true", "trainer.n_gpus_per_node=1",
                           "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "critic.ppo_micro_batch_size_per_gpu=2",
                           *overrides])
        replica = ScriptedReplica(tokenizer, turns)
        manager = AsyncLLMServerManager([replica], default_max_tokens=response_length)
        plain = OmegaConf.create(config_to_dict(cfg))
        loop = ToolAgentLoop(trainer_config=DictConfigWrap(plain, typed=cfg), server_manager=manager,
                             tokenizer=tokenizer, dataset_config=DictConfigWrap(plain.data, typed=cfg.data))
        return loop, replica

    return make


def run(loop, **row) -> AgentLoopOutput:
    row.setdefault("raw_prompt", [{"role": "user", "content": "what is 12*34?"}])
    return asyncio.run(loop.run({"temperature": 1.0, "logprobs": True}, request_id="r0", **row))


def segments(tokenizer, out: AgentLoopOutput):
    """The response cut into (text, mask) runs."""
    runs, cur, mask = [], [], None
    for tok, m in zip(out.response_ids, out.response_mask):
        if m != mask and cur:
            runs.append((tokenizer.decode(cur), mask))
            cur = []
        cur.append(tok)
        mask = m
    runs.append((tokenizer.decode(cur), mask))
    return runs


def test_a_tool_call_is_executed_and_its_result_masked(make_loop, tokenizer):
    loop, replica = make_loop([call("calculator", expression="12*34"), "408"])
    out = run(loop)
    runs = segments(tokenizer, out)
    assert [m for _, m in runs] == [1, 0, 1]
    assert runs[0][0].startswith("<tool_call>") and runs[0][0].endswith("<|im_end|>")
    assert "408" in runs[1][0] and runs[1][0].startswith("\n<|im_start|>tool\n")
    assert runs[1][0].endswith("<|im_start|>assistant\n")
    assert runs[2][0] == "408<|im_end|>"
    # the second turn saw the first prompt, the call, and the observation
    assert replica.prompts[1] == out.prompt_ids + out.response_ids[: len(replica.prompts[1]) - len(out.prompt_ids)]
    assert out.num_turns == 4 and out.extra_fields["tool_call_count"] == 1
    assert out.extra_fields["tool_error_count"] == 0 and "tokenization_mismatch" not in out.extra_fields
    lp = out.response_logprobs
    assert all(lp[i] == (-0.5 if m else 0.0) for i, m in enumerate(out.response_mask))


@pytest.mark.parametrize("bad, kind", [
    ('<tool_call>{"name": "calculator", "arguments": {"expression": </tool_call>', "parse_error"),
    (call("weather", city="Paris"), "unknown_tool"),
    (call("calculator", expr="1+1"), "invalid_arguments"),
    (call("calculator", expression="1/0"), None),  # the tool answers with its own error text
])
def test_bad_calls_become_error_observations_and_the_run_goes_on(make_loop, tokenizer, bad, kind):
    loop, _ = make_loop([bad, "done"])
    out = run(loop)
    runs = segments(tokenizer, out)
    assert [m for _, m in runs] == [1, 0, 1] and runs[2][0] == "done<|im_end|>"
    assert "rror" in runs[1][0]
    if kind is not None:
        assert out.extra_fields["tool_error_count"] == 1
        assert out.metrics.model_dump()[f"tool_errors/{kind}"] == 1


def test_turn_and_parallel_call_limits(make_loop, tokenizer):
    three = call("calculator", expression="1+1") + call("calculator", expression="2+2") + call("calculator", expression="3+3")
    loop, _ = make_loop([three, three, "end"], "actor_rollout_ref.rollout.multi_turn.max_parallel_calls=2",
                        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2", response_length=1024)
    out = run(loop)
    runs = segments(tokenizer, out)
    assert [m for _, m in runs] == [1, 0, 1]  # two assistant turns, the second one ends it
    assert runs[1][0].count("<|im_start|>tool") == 2  # only two of the three calls ran
    assert out.extra_fields["tool_call_count"] == 2

    loop, _ = make_loop([call("calculator", expression="1+1"), call("calculator", expression="2+2"), "end"],
                        "actor_rollout_ref.rollout.multi_turn.max_user_turns=1")
    out = run(loop)
    assert [m for _, m in segments(tokenizer, out)] == [1, 0, 1]


def test_the_response_budget_spans_all_turns_and_ends_cleanly(make_loop, tokenizer):
    first = call("calculator", expression="12*34")
    n_first = len(tokenizer.encode(first)) + 1
    loop, _ = make_loop([first, "x" * 100], response_length=n_first + 30)
    out = run(loop)
    assert len(out.response_ids) == n_first + 30  # the last turn got exactly what was left
    assert out.extra_fields["finish_reason"] == "length"
    # strict tokenization check (the default): a last turn cut without its end-of-turn token is no mismatch
    assert "tokenization_mismatch" not in out.extra_fields and sum(out.response_mask) > n_first
    # an observation that does not fit is not appended: the trajectory ends after the model's turn
    loop, _ = make_loop([first, "never"], response_length=n_first + 5)
    out = run(loop)
    assert out.response_mask == [1] * n_first and len(out.response_ids) == n_first


def test_interaction_replies_are_user_turns_with_scores(make_loop, tokenizer, tmp_path):
    cfg = tmp_path / "interaction.yaml"
    cfg.write_text("interaction:\n  - name: gsm8k\n    class_name: hybridflow.interactions.gsm8k_interaction.Gsm8kInteraction\n"
                   "    config: {}\n")
    loop, _ = make_loop(["#### 7", "#### 408"], f"actor_rollout_ref.rollout.multi_turn.interaction_config_path={cfg}")
    out = run(loop, interaction_kwargs={"name": "gsm8k", "query": "12*34", "ground_truth": "408"})
    runs = segments(tokenizer, out)
    assert [m for _, m in runs] == [1, 0, 1]
    assert "<|im_start|>user" in runs[1][0]
    assert len(out.extra_fields["turn_scores"]) == 2 and out.extra_fields["turn_scores"][-1] > out.extra_fields["turn_scores"][0]


@pytest.mark.parametrize("mode, trained", [("strict", False), ("ignore_strippable", True)])
def test_tokenization_check_flags_a_drifted_prompt(make_loop, tokenizer, mode, trained):
    loop, _ = make_loop([call("calculator", expression="2+2"), "4"],
                        f"actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode={mode}")
    assert "tokenization_mismatch" not in run(loop).extra_fields  # incremental == full render
    loop, _ = make_loop([call("calculator", expression="2+2"), "4"],
                        f"actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode={mode}")

    async def drifted(messages, **kwargs):  # a prompt the full render will not reproduce
        return tokenizer.encode("<|im_start|>user\nsomething else<|im_end|>\n<|im_start|>assistant\n")

    loop.apply_chat_template = drifted
    out = run(loop)
    assert "tokenization_mismatch" in out.extra_fields
    assert (sum(out.response_mask) > 0) == trained  # strict: an error, never trained on; otherwise a warning
    # the masked tokens are still the model's: counted as model tokens (untrained), not as observations
    from hybridflow.agents.loop_worker import AgentLoopWorker

    metrics = AgentLoopWorker._metrics(out, 0.1, 0.0)
    generated = len(tokenizer.encode(call("calculator", expression="2+2") + "4", add_special_tokens=False)) + 2
    assert metrics["model_tokens"] == generated  # both turns' tokens, each with its end-of-turn token
    assert metrics["untrained_model_tokens"] == (0 if trained else generated)
    assert metrics["model_tokens"] + metrics["observation_tokens"] == len(out.response_mask)
