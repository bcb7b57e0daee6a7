"""Decoding generated batches for validation samples and generation dumps, multi-turn rows included."""

from __future__ import annotations

import json

import pytest

from hybridflow.agents.base import AgentLoopOutput
from hybridflow.agents.postprocess import outputs_to_batch
from hybridflow.trainer.rollout_dump import decode_batch, dump_generations, response_segments


@pytest.fixture(scope="module")
def tokenizer():
    from hybridflow.utils.tiny_model import build_char_tokenizer

    return build_char_tokenizer()


def _tool_batch(tok):
    """Row 0: a tool call, its result (an observation, mask 0), then the answer; row 1: a direct answer."""
    enc = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    eos = tok.eos_token_id
    call, observation, answer = enc("call 12*34") + [eos], enc("\n<|im_start|>tool\n408<|im_end|>\n"), enc("408") + [eos]
    rows = [
        AgentLoopOutput(prompt_ids=enc("12*34"), response_ids=call + observation + answer,
                        response_mask=[1] * len(call) + [0] * len(observation) + [1] * len(answer)),
        AgentLoopOutput(prompt_ids=enc("1*2"), response_ids=enc("2") + [eos], response_mask=[1, 1]),
    ]
    return outputs_to_batch(rows, prompt_length=8, response_length=48, pad_token_id=tok.pad_token_id)


def test_multi_turn_responses_decode_whole_not_cut_at_the_model_token_count(tokenizer):
    inputs, outputs = decode_batch(tokenizer, _tool_batch(tokenizer))
    assert inputs == ["12*34", "1*2"]
    # the observation is part of the response text (as verl shows it) and the final answer is not lost
    assert outputs[0] == "call 12*34\ntool\n408\n408"
    assert outputs[1] == "2"


def test_response_segments_follow_the_mask(tokenizer):
    segments = response_segments(tokenizer, _tool_batch(tokenizer))
    assert segments[0] == [("call 12*34<|im_end|>", 1), ("\n<|im_start|>tool\n408<|im_end|>\n", 0), ("408<|im_end|>", 1)]
    assert segments[1] == [("2<|im_end|>", 1)]


def test_dumped_generations_hold_the_whole_multi_turn_response(tokenizer, tmp_path):
    path = dump_generations(str(tmp_path), 3, tokenizer, _tool_batch(tokenizer), [1.0, 0.0])
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows[0]["output"].endswith("408\n408") and rows[0]["score"] == 1.0
