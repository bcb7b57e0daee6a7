"""`hybridflow data gsm8k --tool` on the real GSM8K jsonl: verl's tool-agent-loop rows, usable by tool and interaction."""

from __future__ import annotations

import asyncio

import pytest

from hybridflow.cli import main as cli_main
from hybridflow.data import RLHFDataset
from hybridflow.data.io import read_rows
from hybridflow.data.preprocess.gsm8k import TOOL_SYSTEM_PROMPT
from hybridflow.interactions import Gsm8kInteraction
from hybridflow.tools import Gsm8kTool, ToolExecutor


@pytest.fixture(scope="module")
def tool_rows(gsm8k_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("gsm8k_tool")
    assert cli_main(["data", "gsm8k", "--tool", "--input", gsm8k_dir, "--local-dir", str(out)]) == 0
    return {split: str(out / f"{split}.parquet") for split in ("train", "test")}


def test_rows_have_verls_tool_agent_shape(tool_rows, gsm8k_dir):
    train = read_rows(tool_rows["train"])
    raw = read_rows(f"{gsm8k_dir}/train.jsonl")
    assert len(train) == len(raw) and len(read_rows(tool_rows["test"])) == len(read_rows(f"{gsm8k_dir}/test.jsonl"))
    row = train[0]
    assert row["data_source"] == "openai/gsm8k" and row["agent_name"] == "tool_agent" and row["ability"] == "math"
    assert row["prompt"][0] == {"role": "system", "content": TOOL_SYSTEM_PROMPT}
    assert row["prompt"][1]["role"] == "user" and row["prompt"][1]["content"].startswith(raw[0]["question"])
    assert row["prompt"][1]["content"].endswith("output the final answer after `####`.")
    assert row["reward_model"] == {"style": "rule", "ground_truth": "72"}
    extra = row["extra_info"]
    assert extra["split"] == "train" and extra["index"] == 0 and extra["need_tools_kwargs"] is True
    assert extra["question"] == raw[0]["question"] and extra["answer"] == raw[0]["answer"]
    assert extra["tools_kwargs"] == {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "72"}}}
    assert extra["interaction_kwargs"] == {"name": "gsm8k", "query": row["prompt"][1]["content"], "ground_truth": "72"}
    for r in train[:500]:
        gt = r["reward_model"]["ground_truth"]
        assert r["extra_info"]["tools_kwargs"]["calc_gsm8k_reward"]["create_kwargs"]["ground_truth"] == gt
        assert r["extra_info"]["interaction_kwargs"]["ground_truth"] == gt and "," not in gt


def test_rows_drive_the_tool_and_the_interaction(tool_rows, bpe_tokenizer, data_cfg):
    data_cfg.max_prompt_length = 2048
    ds = RLHFDataset(tool_rows["test"], bpe_tokenizer, data_cfg)
    item = ds[3]
    gt = item["reward_model"]["ground_truth"]
    assert item["agent_name"] == "tool_agent" and item["raw_prompt"][0]["role"] == "system"
    ex = ToolExecutor([Gsm8kTool()])

    async def go():
        session = ex.session(item["tools_kwargs"])
        wrong = await session.call("calc_gsm8k_reward", {"answer": str(int(float(gt)) + 1)})
        right = await session.call("calc_gsm8k_reward", {"answer": gt})
        rewards = await session.close()
        interaction = Gsm8kInteraction({"name": "gsm8k"})
        kwargs = dict(item["interaction_kwargs"])
        iid = await interaction.start_interaction("r", **kwargs)
        said = await interaction.generate_response(iid, [{"role": "assistant", "content": f"so #### {gt}"}], **kwargs)
        return wrong, right, rewards, said

    wrong, right, rewards, said = asyncio.run(go())
    assert "reward=0.0" in wrong.text and "reward=1.0" in right.text and rewards == {"calc_gsm8k_reward": 1.0}
    assert said[0] is True and said[2] == 1.0
