"""Multi-turn SFT on conversations with tool calls and tool messages: loss on assistant tokens only, learned."""

from __future__ import annotations

import json
import random

import pytest
import torch

from hybridflow.data.io import read_rows, write_parquet
from hybridflow.tools import CalculatorTool
from hybridflow.sft.data import SFTDataError, multi_turn_example
from hybridflow.sft.trainer import SFTTrainer, build_examples, load_sft_config
from hybridflow.utils.tool_chat_template import HERMES_TOOL_CHAT_TEMPLATE

TOOLS = [CalculatorTool().tool_schema.model_dump(exclude_none=True)]


@pytest.fixture(scope="module")
def tok():
    from hybridflow.utils.tiny_model import build_char_tokenizer

    return build_char_tokenizer(chat_template=HERMES_TOOL_CHAT_TEMPLATE)


def chat(a: int, b: int, arguments_as_text: bool = False, note: str = "Let me compute.") -> list[dict]:
    arguments = {"expression": f"{a}*{b}"}
    call = {"type": "function", "function": {"name": "calculator",
                                             "arguments": json.dumps(arguments) if arguments_as_text else arguments}}
    return [{"role": "system", "content": "Be exact."}, {"role": "user", "content": f"{a}*{b}?"},
            {"role": "assistant", "content": note, "tool_calls": [call]},
            {"role": "tool", "content": str(a * b)}, {"role": "tool", "content": "(cached)"},
            {"role": "assistant", "content": f"#### {a * b}"}]


def masked(tok, ex) -> str:
    return tok.decode([t for t, m in zip(ex.input_ids, ex.loss_mask) if m])


def unmasked(tok, ex) -> str:
    return tok.decode([t for t, m in zip(ex.input_ids, ex.loss_mask) if not m])


def test_loss_covers_assistant_text_and_tool_calls_not_tool_results(tok):
    ex = multi_turn_example(tok, chat(123, 45), "row 0", tools=TOOLS)
    assert len(ex.input_ids) == len(ex.loss_mask)
    assert masked(tok, ex) == ('Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": '
                               '"123*45"}}\n</tool_call><|im_end|>\n#### 5535<|im_end|>\n')
    rest = unmasked(tok, ex)
    assert "<tool_response>\n5535\n</tool_response>\n<tool_response>\n(cached)\n</tool_response>" in rest
    assert '<tools>\n{"type": "function", "function": {"name": "calculator"' in rest  # schemas in the system turn
    assert rest.endswith("<|im_start|>assistant\n")  # generation prompts are not trained on
    # the whole example is exactly the template's render of the conversation
    assert ex.input_ids == tok.encode(tok.apply_chat_template(chat(123, 45), tools=TOOLS, tokenize=False),
                                      add_special_tokens=False)


def test_row_spellings_give_the_same_example(tok, tmp_path):
    reference = multi_turn_example(tok, chat(7, 8), "r", tools=TOOLS)
    as_text = multi_turn_example(tok, chat(7, 8, arguments_as_text=True), "r", tools=json.dumps(TOOLS))
    assert as_text == reference
    # through parquet (absent struct fields come back as None, lists as arrays)
    rows = [{"messages": chat(7, 8), "tools": json.dumps(TOOLS)}, {"messages": chat(9, 9, note="")}]
    path = write_parquet(rows, str(tmp_path / "sft.parquet"))
    cfg = load_sft_config(["data.multiturn.enable=true"])
    first, second = build_examples(read_rows(path), tok, cfg.data)
    assert first == reference
    assert masked(tok, second).startswith('<tool_call>\n{"name": "calculator"')
    no_tools = load_sft_config(["data.multiturn.enable=true", "data.multiturn.tools_key=nope"])
    assert "<tools>" not in tok.decode(build_examples(read_rows(path), tok, no_tools.data)[0].input_ids)


@pytest.mark.parametrize("messages, tools, message", [
    ([{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": [{"function": {}}]}],
     None, "each tool call needs"),
    ([{"role": "user", "content": "x"},
      {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "{bad"}}]}],
     None, "arguments of tool call 'f' are not valid JSON"),
    ([{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}], "{bad", "tools column is not valid"),
    ([{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}], [1], "list of OpenAI function"),
])
def test_bad_tool_rows_name_the_problem(tok, messages, tools, message):
    with pytest.raises(SFTDataError, match=message):
        multi_turn_example(tok, messages, "row 3", tools=tools)


def _segment_losses(model, tok, ex, needle: list[int]) -> tuple[float, float]:
    """Mean next-token loss over the example's loss tokens and over the tokens of ``needle`` (a tool result)."""
    ids = torch.tensor([ex.input_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, :-1]
    nll = torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="none")
    trained = torch.tensor(ex.loss_mask[1:], dtype=torch.bool)
    start = next(i for i in range(len(ex.input_ids)) if ex.input_ids[i:i + len(needle)] == needle)
    result = torch.zeros_like(trained)
    result[start - 1:start - 1 + len(needle)] = True  # position t predicts token t+1
    assert not (trained & result).any()
    return nll[trained].mean().item(), nll[result].mean().item()


@pytest.mark.slow
def test_sft_learns_assistant_turns_and_never_the_tool_results(tok, tmp_path):
    from transformers import AutoModelForCausalLM

    from hybridflow.utils.tiny_model import build_tiny_model

    model_dir = tmp_path / "init"
    build_tiny_model(tok, size="nano", seed=0).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    rng = random.Random(0)
    result_text = "RESULT IS READY"  # the same in every row: trivially learnable if it were trained on

    def row(a, b):
        messages = chat(a, b, note="")[1:4] + [{"role": "assistant", "content": "#### done"}]
        messages[2] = {"role": "tool", "content": result_text}
        return {"messages": messages}

    rows = [row(rng.randint(100, 999), rng.randint(10, 99)) for _ in range(32)]
    cfg = load_sft_config([f"model.partial_pretrain={model_dir}", "data.multiturn.enable=true",
                           "data.train_batch_size=8", "data.micro_batch_size_per_gpu=8", "optim.lr=1e-2",
                           "optim.lr_scheduler=constant", "optim.weight_decay=0", "trainer.total_training_steps=40",
                           f"trainer.default_local_dir={tmp_path / 'out'}", "data.max_length=256"])
    held_out = build_examples([row(271, 82)], tok, cfg.data)[0]
    needle = tok.encode(result_text, add_special_tokens=False)
    before = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    trained_before, result_before = _segment_losses(before, tok, held_out, needle)
    # SFTTrainer with this tokenizer object: a tiny char-level tokenizer saved next to a qwen2 config reloads as
    # Qwen2Tokenizer in transformers 5, which drops spaces and newlines (see the report of this branch)
    trainer = SFTTrainer(cfg, tok, build_examples(rows, tok, cfg.data))
    out = trainer.fit()
    assert out.history[-1]["train/loss"] < 0.5 * out.history[0]["train/loss"]
    after = AutoModelForCausalLM.from_pretrained(out.hf_dir, dtype=torch.float32).eval()
    trained_after, result_after = _segment_losses(after, tok, held_out, needle)
    print(f"assistant tokens {trained_before:.2f} -> {trained_after:.2f}; tool result {result_before:.2f} -> "
          f"{result_after:.2f}")
    assert trained_after < 0.35 * trained_before  # the assistant's turns, tool call included, are learned
    assert result_after > 0.6 * result_before  # the tool's output, identical in every row, is not
