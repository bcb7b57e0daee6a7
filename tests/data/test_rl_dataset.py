"""RLHFDataset on written parquet/json files: items, truncation modes, filtering and bad-input errors."""

from __future__ import annotations

import json

import pytest
import torch

from hybridflow.data import DataFileError, PromptTooLongError, RLHFDataset, collate_fn, create_rl_dataset, write_parquet
from hybridflow.protocol import DataProto

SHORT = "the sum is 12"
LONG = " ".join(["the answer is the number of steps"] * 12)


@pytest.fixture
def parquet_file(tmp_path, verl_row):
    rows = [verl_row(i, SHORT if i % 2 == 0 else f"add {i} and {i}", agent_name="single_turn_agent") for i in range(6)]
    return write_parquet(rows, str(tmp_path / "train.parquet"))


def _template_ids(tok, content):
    text = tok.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False)
    return tok.encode(text, add_special_tokens=False)


def test_item_matches_batch_contract(parquet_file, bpe_tokenizer, data_cfg):
    ds = RLHFDataset(parquet_file, bpe_tokenizer, data_cfg)
    assert len(ds) == 6
    item = ds[0]
    expected = _template_ids(bpe_tokenizer, SHORT)
    n = len(expected)
    assert item["input_ids"].shape == (64,)
    assert item["input_ids"][-n:].tolist() == expected  # left padded, content at the end
    assert item["input_ids"][: 64 - n].eq(bpe_tokenizer.pad_token_id).all()
    assert item["attention_mask"].tolist() == [0] * (64 - n) + [1] * n
    assert item["position_ids"].tolist() == [0] * (64 - n) + list(range(n))
    assert item["raw_prompt_ids"] == expected
    assert item["raw_prompt"] == [{"role": "user", "content": SHORT}]
    assert item["data_source"] == "openai/gsm8k" and item["ability"] == "math"
    assert item["reward_model"] == {"style": "rule", "ground_truth": "0"}
    assert item["index"] == 0 and item["agent_name"] == "single_turn_agent"
    assert item["tools_kwargs"] == {"calc": {"x": 0}}
    assert item["interaction_kwargs"] == {"name": "gsm8k"}
    assert "prompt" not in item


def test_collate_to_dataproto(parquet_file, bpe_tokenizer, data_cfg):
    ds = RLHFDataset(parquet_file, bpe_tokenizer, data_cfg)
    batch = DataProto.from_single_dict(collate_fn([ds[i] for i in range(3)]))
    assert len(batch) == 3
    assert batch.batch["input_ids"].shape == (3, 64)
    assert batch.non_tensor_batch["raw_prompt"][1] == [{"role": "user", "content": "add 1 and 1"}]
    assert batch.non_tensor_batch["reward_model"][2]["ground_truth"] == "2"
    assert list(batch.non_tensor_batch["index"]) == [0, 1, 2]


def test_json_and_jsonl_files_and_max_samples(tmp_path, bpe_tokenizer, data_cfg, verl_row):
    rows = [verl_row(i, SHORT) for i in range(5)]
    array_file = tmp_path / "a.json"
    array_file.write_text(json.dumps(rows))
    lines_file = tmp_path / "b.jsonl"
    lines_file.write_text("\n".join(json.dumps(r) for r in rows))
    ds = RLHFDataset([str(array_file), str(lines_file)], bpe_tokenizer, data_cfg)
    assert len(ds) == 10
    data_cfg.val_max_samples = 3
    assert len(create_rl_dataset(str(lines_file), data_cfg, bpe_tokenizer, is_train=False)) == 3
    assert len(create_rl_dataset(str(lines_file), data_cfg, bpe_tokenizer, is_train=True)) == 5


def test_chat_template_kwargs_are_passed(tmp_path, bpe_tokenizer, data_cfg, verl_row):
    tok = bpe_tokenizer.__class__.from_pretrained(bpe_tokenizer.name_or_path)
    tok.chat_template = "{% if shout %}HEY {% endif %}{{ messages[0]['content'] }}"
    path = write_parquet([verl_row(0, "hi")], str(tmp_path / "t.parquet"))
    data_cfg.apply_chat_template_kwargs = {"shout": True}
    item = RLHFDataset(path, tok, data_cfg)[0]
    assert tok.decode(item["raw_prompt_ids"]) == "HEY hi"


@pytest.mark.parametrize("mode", ["left", "right", "middle"])
def test_truncation_modes(tmp_path, bpe_tokenizer, data_cfg, mode, verl_row):
    path = write_parquet([verl_row(0, LONG)], str(tmp_path / "t.parquet"))
    full = _template_ids(bpe_tokenizer, LONG)
    limit = 11
    assert len(full) > limit
    data_cfg.max_prompt_length, data_cfg.truncation = limit, mode
    item = RLHFDataset(path, bpe_tokenizer, data_cfg)[0]
    expected = {"left": full[-11:], "right": full[:11], "middle": full[:5] + full[-6:]}[mode]
    assert item["raw_prompt_ids"] == expected
    assert item["input_ids"].tolist() == expected
    assert item["attention_mask"].sum() == 11


def test_truncation_error_names_row_length_limit_and_fixes_when_the_dataset_is_built(tmp_path, bpe_tokenizer,
                                                                                      data_cfg, verl_row):
    """Issue 34: the overlong prompt was found only when a step drew it (after 8 steps): now at the start."""
    path = write_parquet([verl_row(0, SHORT), verl_row(1, LONG)], str(tmp_path / "t.parquet"))
    data_cfg.max_prompt_length = 30
    n = len(_template_ids(bpe_tokenizer, LONG))
    with pytest.raises(PromptTooLongError) as err:
        RLHFDataset(path, bpe_tokenizer, data_cfg)
    msg = str(err.value)
    assert f"row 1 of '{path}'" in msg and f"{n} tokens" in msg and "data.max_prompt_length=30" in msg
    assert "data.filter_overlong_prompts=true" in msg and "data.truncation" in msg
    data_cfg.truncation = "left"  # truncating modes still take it (and cut it when drawn)
    assert len(RLHFDataset(path, bpe_tokenizer, data_cfg)[1]["raw_prompt_ids"]) == 30


def test_filter_overlong_prompts(tmp_path, bpe_tokenizer, data_cfg, verl_row):
    rows = [verl_row(0, SHORT), verl_row(1, LONG), verl_row(2, SHORT)]
    path = write_parquet(rows, str(tmp_path / "t.parquet"))
    data_cfg.max_prompt_length, data_cfg.filter_overlong_prompts = 30, True
    ds = RLHFDataset(path, bpe_tokenizer, data_cfg)
    assert len(ds) == 2
    assert [ds[i]["index"] for i in range(2)] == [0, 2]
    data_cfg.max_prompt_length = 2
    with pytest.raises(DataFileError, match="removed all 3 rows"):
        RLHFDataset(path, bpe_tokenizer, data_cfg)


def test_misnamed_prompt_column_suggests_closest(tmp_path, bpe_tokenizer, data_cfg, verl_row):
    rows = [verl_row(0, SHORT)]
    rows[0]["prompts"] = rows[0].pop("prompt")
    path = write_parquet(rows, str(tmp_path / "bad.parquet"))
    with pytest.raises(DataFileError) as err:
        RLHFDataset(path, bpe_tokenizer, data_cfg)
    msg = str(err.value)
    assert "bad.parquet" in msg and "no column 'prompt'" in msg and "Did you mean 'prompts'" in msg
    assert "data.prompt_key" in msg


def test_missing_reward_model_column(tmp_path, bpe_tokenizer, data_cfg, verl_row):
    rows = [verl_row(0, SHORT)]
    rows[0]["reward"] = rows[0].pop("reward_model")
    path = write_parquet(rows, str(tmp_path / "bad.parquet"))
    with pytest.raises(DataFileError, match=r"no column 'reward_model'.*Did you mean 'reward'"):
        RLHFDataset(path, bpe_tokenizer, data_cfg)


def test_empty_dataset(tmp_path, bpe_tokenizer, data_cfg):
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    with pytest.raises(DataFileError, match="empty.jsonl' contains no rows"):
        RLHFDataset(str(path), bpe_tokenizer, data_cfg)


def test_missing_and_corrupt_files(tmp_path, bpe_tokenizer, data_cfg, verl_row):
    with pytest.raises(DataFileError, match="does not exist.*data.train_files"):
        RLHFDataset(str(tmp_path / "nope.parquet"), bpe_tokenizer, data_cfg)
    corrupt = tmp_path / "corrupt.parquet"
    corrupt.write_bytes(b"PAR1 this is not really parquet")
    with pytest.raises(DataFileError, match="cannot read parquet file .*corrupt.parquet.*re-run the preprocessing"):
        RLHFDataset(str(corrupt), bpe_tokenizer, data_cfg)
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text(json.dumps(verl_row(0, SHORT)) + "\n{not json\n")
    with pytest.raises(DataFileError, match="bad.jsonl' line 2 is not valid JSON"):
        RLHFDataset(str(bad_json), bpe_tokenizer, data_cfg)


def test_prompt_not_chat_messages(tmp_path, bpe_tokenizer, data_cfg, verl_row):
    rows = [verl_row(0, SHORT), verl_row(1, SHORT)]
    rows[1]["prompt"] = "What is 2+2?"
    path = tmp_path / "plain.json"
    path.write_text(json.dumps(rows))
    with pytest.raises(ValueError) as err:
        RLHFDataset(str(path), bpe_tokenizer, data_cfg)
    msg = str(err.value)
    assert "row 1 of" in msg and "list of chat messages" in msg and "'What is 2+2?'" in msg


def test_bad_truncation_value(parquet_file, bpe_tokenizer, data_cfg):
    data_cfg.truncation = "both"
    with pytest.raises(ValueError, match="data.truncation must be one of error, left, right, middle, got 'both'"):
        RLHFDataset(parquet_file, bpe_tokenizer, data_cfg)


def test_items_are_tensors_of_long(parquet_file, bpe_tokenizer, data_cfg):
    item = RLHFDataset(parquet_file, bpe_tokenizer, data_cfg)[1]
    assert all(item[k].dtype == torch.long for k in ("input_ids", "attention_mask", "position_ids"))


def test_custom_dataset_class(parquet_file, bpe_tokenizer, data_cfg, tmp_path):
    (tmp_path / "my_ds.py").write_text(
        "from hybridflow.data import RLHFDataset\n"
        "class Doubled(RLHFDataset):\n"
        "    def __len__(self):\n"
        "        return 2 * super().__len__()\n"
        "    def __getitem__(self, i):\n"
        "        return super().__getitem__(i % len(self.rows))\n"
    )
    data_cfg.custom_cls.path, data_cfg.custom_cls.name = str(tmp_path / "my_ds.py"), "Doubled"
    ds = create_rl_dataset(parquet_file, data_cfg, bpe_tokenizer)
    assert type(ds).__name__ == "Doubled" and len(ds) == 12 and ds[7]["index"] == 1
    data_cfg.custom_cls.path = str(tmp_path / "nope.py")
    with pytest.raises(FileNotFoundError, match="data.custom_cls.path='.*nope.py' does not exist"):
        create_rl_dataset(parquet_file, data_cfg, bpe_tokenizer)


def test_return_full_prompt_adds_the_templated_text(tmp_path, bpe_tokenizer, data_cfg, verl_row):
    tok = bpe_tokenizer.__class__.from_pretrained(bpe_tokenizer.name_or_path)
    tok.chat_template = "Q: {{ messages[0]['content'] }} A:"
    path = write_parquet([verl_row(0, "hi")], str(tmp_path / "t.parquet"))
    assert "full_prompts" not in RLHFDataset(path, tok, data_cfg)[0]
    data_cfg.return_full_prompt = True
    item = RLHFDataset(path, tok, data_cfg)[0]
    assert item["full_prompts"] == "Q: hi A:" == tok.decode(item["raw_prompt_ids"])


def test_a_huge_row_is_refused_before_it_is_tokenized(tmp_path, bpe_tokenizer, data_cfg, verl_row):
    """Issue 34: one 200 MB row was tokenized and the OOM killer took the trainer (scaled: a 3 MiB row, 1 MiB cap)."""
    path = write_parquet([verl_row(0, SHORT), verl_row(1, "x" * (3 * 2**20))], str(tmp_path / "t.parquet"))
    data_cfg.max_row_bytes = 2**20
    data_cfg.truncation = "left"
    with pytest.raises(DataFileError) as err:
        RLHFDataset(path, bpe_tokenizer, data_cfg)
    msg = str(err.value)
    assert f"row 1 of '{path}' holds 3.0 MiB" in msg and "data.max_row_bytes=1048576" in msg, msg
    data_cfg.max_row_bytes = 4 * 2**20  # raised: the row is read
    assert len(RLHFDataset(path, bpe_tokenizer, data_cfg)) == 2


@pytest.mark.parametrize("depth", [100, 100_000])
def test_deeply_nested_json_is_a_clear_error(tmp_path, bpe_tokenizer, data_cfg, verl_row, depth):
    """Issue 34: JSON nested 100,000 deep ended in a RecursionError traceback."""
    row = verl_row(0, SHORT)
    text = json.dumps(row)[:-1] + ', "deep": ' + "[" * depth + "]" * depth + "}"
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(verl_row(1, SHORT)) + "\n" + text + "\n")
    with pytest.raises(DataFileError) as err:
        RLHFDataset(str(path), bpe_tokenizer, data_cfg)
    msg = str(err.value)
    assert ("line 2" in msg and "deeper than the JSON reader can follow" in msg) if depth > 1000 else \
        (f"row 1 of '{path}' nests lists/objects more than 64 levels deep" in msg), msg
