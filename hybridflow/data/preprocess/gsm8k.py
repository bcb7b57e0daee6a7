"""GSM8K -> verl-format parquet (Cobbe et al. 2021), matching verl's ``examples/data_preprocess/gsm8k.py``.

Each question gets verl's instruction appended so the policy learns to end with ``#### <answer>``, which the
strict GSM8K scorer requires; ``extra_info`` keeps the original question and worked answer.

``--tool`` writes the rows of verl's ``gsm8k_tool_agent_loop.py`` instead: ``agent_name: tool_agent``, a system
prompt asking the model to check its answer with the ``calc_gsm8k_reward`` tool, and in ``extra_info`` the
``tools_kwargs`` (the ground truth for the tool's ``create``) and ``interaction_kwargs`` (``name: gsm8k``,
the query and the ground truth, for the gsm8k interaction).
"""

from __future__ import annotations

import argparse
import os

from hybridflow.data.io import read_hub_rows, write_parquet
from hybridflow.data.preprocess.common import HUB_FIX, read_split, require_columns, run_main, standard_parser

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
TOOL_INSTRUCTION = "Let's think step by step and output the final answer after `####`."
TOOL_SYSTEM_PROMPT = (
    "You are a math expert. You are given a question and you need to solve it step by step. "
    "Reasoning step by step before any tool call. "
    "You should use the `calc_gsm8k_reward` tool after step by step solving the question, "
    "before generate final answer at least once and refine your answer if necessary. "
    "Put your final answer in the format of `#### <answer>`."
)
TOOL_NAME = "calc_gsm8k_reward"


def extract_final_answer(answer: str) -> str:
    """The number after ``####`` in a reference solution, thousands separators removed."""
    if "####" not in answer:
        raise ValueError(f"GSM8K answer has no '####' final-answer marker: {answer[-80:]!r}")
    return answer.split("####")[-1].strip().replace(",", "")


def to_row(example: dict, split: str, index: int) -> dict:
    question = example["question"]
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": extract_final_answer(example["answer"])},
        "extra_info": {"split": split, "index": index, "answer": example["answer"], "question": question},
    }


def to_tool_row(example: dict, split: str, index: int) -> dict:
    """A row for ``tool_agent`` with the calc_gsm8k_reward tool (verl's gsm8k_tool_agent_loop.py)."""
    question = example["question"]
    solution = extract_final_answer(example["answer"])
    prompt = f"{question} {TOOL_INSTRUCTION}"
    return {
        "data_source": DATA_SOURCE,
        "agent_name": "tool_agent",
        "prompt": [{"role": "system", "content": TOOL_SYSTEM_PROMPT}, {"role": "user", "content": prompt}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": solution},
        "extra_info": {
            "split": split,
            "index": index,
            "answer": example["answer"],
            "question": question,
            "need_tools_kwargs": True,
            "tools_kwargs": {TOOL_NAME: {"create_kwargs": {"ground_truth": solution}}},
            "interaction_kwargs": {"name": "gsm8k", "query": prompt, "ground_truth": solution},
        },
    }


def preprocess_gsm8k(input_dir: str | None, local_dir: str, tool: bool = False) -> dict[str, str]:
    """Write ``train.parquet`` / ``test.parquet`` under ``local_dir`` from ``input_dir`` jsonl or the hub
    (``tool=True``: tool-agent-loop rows)."""
    paths = {}
    make_row = to_tool_row if tool else to_row
    for split in ("train", "test"):
        rows = read_split(input_dir, split) if input_dir else read_hub_rows("openai/gsm8k", split, "main", HUB_FIX)
        require_columns(rows, ("question", "answer"), f"GSM8K {split} split")
        out = [make_row(r, split, i) for i, r in enumerate(rows)]
        paths[split] = write_parquet(out, os.path.join(local_dir, f"{split}.parquet"))
    return paths


def setup_parser(parser: argparse.ArgumentParser) -> None:
    standard_parser(parser, "~/data/gsm8k")
    parser.add_argument("--tool", action="store_true",
                        help="rows for the tool agent loop with the calc_gsm8k_reward tool (verl's "
                             "gsm8k_tool_agent_loop.py): agent_name, tools_kwargs, interaction_kwargs")


def run(args: argparse.Namespace) -> dict[str, str]:
    return preprocess_gsm8k(args.input, os.path.expanduser(args.local_dir), tool=args.tool)


def main(argv: list[str] | None = None) -> dict[str, str]:
    return run_main(setup_parser, run, "hybridflow data gsm8k", argv)
