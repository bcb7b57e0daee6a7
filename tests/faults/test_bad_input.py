"""Bad input through the real ``hybridflow train`` front door: each case fails with a message naming the
field / file / value and the fix (non-zero exit), or is a reported, counted skip. See docs/reliability.md.

The cases run ``hybridflow.cli.main(["train", ...])`` in this process (an interpreter start-up costs ~5 s
per case on 2 cores); ``test_cli_subprocess_*`` run two of them as the real ``python -m`` process, to show
the in-process runs see what a user sees.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from hybridflow.trainer import run_checkpoint as ckpt

from .conftest import A, base_args, invoke_cli, read_metrics, run_cli_subprocess

REWARDS = Path(__file__).with_name("faulty_rewards.py")


# ------------------------------------------------------------------------------------------------ inputs
def _rows(fault_data) -> pd.DataFrame:
    return pd.read_parquet(fault_data / "train.parquet")


def _write(df: pd.DataFrame, path: Path) -> Path:
    df.to_parquet(path)
    return path


def _model_without_template(nano_model_dir, tmp_path) -> Path:
    target = tmp_path / "no_template_model"
    shutil.copytree(nano_model_dir, target)
    (target / "chat_template.jinja").unlink(missing_ok=True)
    cfg_path = target / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("chat_template", None)
    cfg_path.write_text(json.dumps(cfg))
    return target


def _not_causal_lm(nano_model_dir, tmp_path) -> Path:
    """A tokenizer plus an encoder-only DistilBERT (weights included): loads as a tokenizer, not as a causal LM.

    (BERT itself would not do: transformers registers ``BertLMHeadModel`` as a causal LM.)
    """
    from transformers import DistilBertConfig, DistilBertModel

    target = tmp_path / "encoder_model"
    shutil.copytree(nano_model_dir, target)
    for weights in target.glob("*.safetensors"):
        weights.unlink()
    (target / "config.json").unlink()
    DistilBertModel(DistilBertConfig(vocab_size=64, dim=16, n_layers=1, n_heads=2, hidden_dim=32)).save_pretrained(target)
    return target


def _half_written_checkpoint(tmp_path) -> Path:
    """What a crash mid-save would leave if saves were not atomic: a step folder without its manifest."""
    folder = tmp_path / "ckpt" / "global_step_2"
    (folder / "actor").mkdir(parents=True)
    (folder / "actor" / "model.pt").write_bytes(b"\x80partial")
    return folder


def _foreign_checkpoint(tmp_path) -> Path:
    """A folder laid out by another framework (verl-style actor/ + data.pt, no hybridflow manifest)."""
    folder = tmp_path / "verl_ckpt" / "global_step_5"
    (folder / "actor").mkdir(parents=True)
    (folder / "actor" / "model_world_size_1_rank_0.pt").write_bytes(b"")
    (folder / "data.pt").write_bytes(b"")
    return folder


# ------------------------------------------------------------------------------------------------ cases
# Each case: (id, builder(tmp_path, fault_data, nano_model_dir) -> (train_file, extra_args, model_dir), needles)
# needles: substrings (lower-cased) the user-facing message must contain -- the field/file/value and the fix.
def _data_case(transform):
    return lambda tmp, data, model: (_write(transform(_rows(data)), tmp / "bad.parquet"), [], model)


def _args_case(*extra):
    return lambda tmp, data, model: (data / "train.parquet", list(extra), model)


def _long_prompts(df):
    df = df.copy()
    df["prompt"] = [[{"role": "user", "content": "1+1=" * 30}] for _ in range(len(df))]
    return df


FAIL_CASES = [
    ("missing_prompt_column", _data_case(lambda df: df.rename(columns={"prompt": "question"})),
     ["bad.parquet", "'prompt'", "data.prompt_key", "add the column"]),
    ("missing_reward_model_column", _data_case(lambda df: df.drop(columns=["reward_model"])),
     ["bad.parquet", "'reward_model'", "add the column"]),
    ("empty_dataset", _data_case(lambda df: df.iloc[:0]), ["bad.parquet", "no rows", "preprocessing"]),
    ("corrupt_file", lambda tmp, data, model: ((tmp / "bad.parquet").write_bytes(b"not parquet") and tmp / "bad.parquet",
                                               [], model),
     ["bad.parquet", "corrupt", "re-run the preprocessing"]),
    ("prompt_not_chat_list", _data_case(lambda df: df.assign(prompt=[m[0]["content"] for m in df["prompt"]])),
     ["bad.parquet", "'prompt'", "chat messages", "wrap plain text"]),
    ("prompt_too_long_truncation_error", _data_case(_long_prompts),
     ["data.max_prompt_length=32", "data.truncation", "filter_overlong_prompts"]),
    ("model_path_missing", lambda tmp, data, model: (data / "train.parquet", [], tmp / "no_such_model"),
     ["no_such_model", "actor_rollout_ref.model.path"]),
    ("model_not_causal_lm", lambda tmp, data, model: (data / "train.parquet", [], _not_causal_lm(model, tmp)),
     ["distilbert", "actor_rollout_ref.model.path"]),
    ("tokenizer_without_chat_template",
     lambda tmp, data, model: (data / "train.parquet", [], _model_without_template(model, tmp)),
     ["chat template", "custom_chat_template"]),
    ("unknown_config_key", _args_case(f"{A}.actor.ppo_mini_batchsize=2"),
     ["ppo_mini_batchsize", "ppo_mini_batch_size"]),
    ("wrong_type", _args_case("data.train_batch_size=eight"), ["data.train_batch_size", "eight"]),
    ("inconsistent_batch_sizes", _args_case(f"{A}.actor.ppo_mini_batch_size=8"),
     ["ppo_mini_batch_size", "train_batch_size"]),
    ("reward_path_missing", _args_case("custom_reward_function.path=/nonexistent/my_reward.py"),
     ["custom_reward_function.path", "my_reward.py"]),
    ("reward_function_name_missing", _args_case(f"custom_reward_function.path={REWARDS}",
                                                "custom_reward_function.name=compute_score"),
     ["custom_reward_function.name", "compute_score", "faulty_rewards.py"]),
    ("resume_half_written_checkpoint",
     lambda tmp, data, model: (data / "train.parquet", ["trainer.resume_mode=resume_path",
                                                        f"trainer.resume_from_path={_half_written_checkpoint(tmp)}"],
                               model),
     ["global_step_2", "not a complete hybridflow checkpoint", "trainer.resume_mode=disable"]),
    ("resume_foreign_checkpoint",
     lambda tmp, data, model: (data / "train.parquet", ["trainer.resume_mode=resume_path",
                                                        f"trainer.resume_from_path={_foreign_checkpoint(tmp)}"],
                               model),
     ["global_step_5", "verl checkpoint", "trainer.resume_from_path"]),
]

_RESULTS: dict[str, object] = {}


def _run_case(case_id, tmp_path_factory, fault_data, nano_model_dir):
    """Each case runs once per session; the message test and the no-traceback test share the result."""
    if case_id not in _RESULTS:
        builder = dict((c[0], c[1]) for c in FAIL_CASES)[case_id]
        tmp = tmp_path_factory.mktemp(case_id)
        train_file, extra, model = builder(tmp, fault_data, nano_model_dir)
        _RESULTS[case_id] = (invoke_cli(base_args(model, train_file, tmp, extra=extra), tmp), tmp)
    return _RESULTS[case_id]


@pytest.mark.parametrize("case_id,needles", [(c[0], c[2]) for c in FAIL_CASES], ids=[c[0] for c in FAIL_CASES])
def test_bad_input_fails_with_a_message_naming_field_and_fix(case_id, needles, tmp_path_factory, fault_data,
                                                             nano_model_dir):
    result, tmp = _run_case(case_id, tmp_path_factory, fault_data, nano_model_dir)
    assert result.rc != 0, f"{case_id}: training went ahead on bad input; stderr:\n{result.stderr[-2000:]}"
    message = result.message.lower()
    for needle in needles:
        assert needle.lower() in message, f"{case_id}: {needle!r} not in the message: {result.message}"
    # No partial outputs: no checkpoint folder, no metrics were written for a run that never trained.
    assert ckpt.completed_steps(tmp / "ckpt") == [] and read_metrics(tmp) == []


@pytest.mark.parametrize("case_id", [c[0] for c in FAIL_CASES])
def test_bad_input_is_a_message_not_a_traceback(case_id, tmp_path_factory, fault_data, nano_model_dir):
    result, _ = _run_case(case_id, tmp_path_factory, fault_data, nano_model_dir)
    assert result.escaped is None, f"{case_id}: the CLI let {type(result.escaped).__name__} escape (a traceback)"
    assert result.rc == 2 and "Traceback" not in result.stderr


# ------------------------------------------------------------------------------------------------ real process
def test_cli_subprocess_config_error_exits_2_with_one_message(tmp_path, fault_data, nano_model_dir):
    proc = run_cli_subprocess(base_args(nano_model_dir, fault_data / "train.parquet", tmp_path,
                                        extra=[f"{A}.actor.ppo_mini_batchsize=2"]), tmp_path)
    assert proc.returncode == 2
    assert "ppo_mini_batchsize" in proc.stderr and "ppo_mini_batch_size" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_subprocess_data_error_ends_with_the_message(tmp_path, fault_data, nano_model_dir):
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    proc = run_cli_subprocess(base_args(nano_model_dir, tmp_path / "bad.parquet", tmp_path), tmp_path)
    assert proc.returncode != 0
    last = [ln for ln in proc.stderr.splitlines() if ln.strip()][-1]
    assert "bad.parquet" in last and "re-run the preprocessing" in last
    assert read_metrics(tmp_path) == []  # nothing was logged for a run that never started
