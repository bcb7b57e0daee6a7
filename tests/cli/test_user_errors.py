"""Every command fed its bad inputs: one message on stderr, exit code 2, no traceback.

A message is one line (``hybridflow CMD: what is wrong and the fix``); a configuration with several problems lists
them under one ``invalid configuration:`` line, one problem per line. The download commands are run without
network: the hub endpoint points at a closed port on this machine (no traffic leaves it).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

NO_NET = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": ""}  # port 9 (discard): nothing listens here


def _cases(tmp):
    empty = tmp / "empty"  # made by the fixture
    dry = ["--dry-run", "algorithm.adv_estimator=grpo", "trainer.n_gpus_per_node=1", "trainer.device=cpu",
           "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
           "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", f"actor_rollout_ref.model.path={tmp}/no_model",
           f"data.train_files={tmp}/no_train.parquet", f"data.val_files={tmp}/no_test.parquet"]
    return {  # name -> (argv, extra env, words the message must hold)
        "unknown command": (["trian"], {}, ["unknown command 'trian'", "did you mean 'train'"]),
        "train unknown key": (["train", "--dry-run", "trainer.nosuch=1"], {}, ["unknown config key 'trainer.nosuch'"]),
        "train unknown option": (["train", "--bogus"], {}, ["unknown option '--bogus'"]),
        "train bad value": (["train", "--dry-run", "data.train_batch_size=many"], {}, ["expects an integer"]),
        "train no config folder": (["train", "--config-path", str(tmp / "no_dir"), "--config-name", "x"], {},
                                   ["is not a directory"]),
        "train missing files": (["train", *dry], {}, ["actor_rollout_ref.model.path", "data.train_files"]),
        "train help of no node": (["train", "--help", "nosuch"], {}, ["no config key or node 'nosuch'"]),
        "sft unknown key": (["sft", "data.nosuch=1"], {}, ["nosuch"]),
        "sft missing model": (["sft", f"model.partial_pretrain={tmp}/no_model"], {}, ["model.partial_pretrain"]),
        "quickstart bad task": (["quickstart", "--task", "chess"], {}, ["invalid choice: 'chess'"]),
        "quickstart bad option": (["quickstart", "--tool-use", "--max-seconds", "5"], {}, ["unrecognized arguments"]),
        "quickstart tool-use with max-seconds": (["quickstart", "--task", "tool-use", "--max-seconds", "5"], {},
                                                 ["--max-seconds does not apply"]),
        "generate unknown key": (["generate", "data.nosuch=1"], {}, ["unknown config key 'data.nosuch'"]),
        "eval missing model": (["eval", *dry[1:]], {}, ["actor_rollout_ref.model.path"]),
        "merge missing folder": (["merge", str(tmp / "no_ckpt"), str(tmp / "out")], {}, ["no checkpoint folder"]),
        "merge folder without shards": (["merge", str(empty), str(tmp / "out")], {}, ["holds no model shards"]),
        "merge no arguments": (["merge"], {}, ["required: local_dir, target_dir"]),
        "data unknown dataset": (["data", "gsm9k"], {}, ["unknown dataset 'gsm9k'", "did you mean 'gsm8k'"]),
        "data gsm8k missing input": (["data", "gsm8k", "--input", str(tmp / "no_dir"), "--local-dir", str(tmp / "o")],
                                     {}, ["no train file"]),
        "data gsm8k without network": (["data", "gsm8k", "--local-dir", str(tmp / "o")], NO_NET,
                                       ["cannot reach the Hugging Face hub", "--input DIR"]),
        "data math without network": (["data", "math", "--local-dir", str(tmp / "o")], NO_NET,
                                      ["cannot reach the Hugging Face hub"]),
        "data bad option": (["data", "countdown", "--rows", "x"], {}, ["unrecognized arguments"]),
        "sandbox unknown sub-command": (["sandbox", "start"], {}, ["unknown sub-command 'start'"]),
        "report missing folder": (["report", str(tmp / "no_run")], {}, ["no run folder"]),
        "report no metrics": (["report", str(empty)], {}, ["metrics.jsonl does not exist"]),
        "report serve outside loopback": (["report", str(empty), "--serve", "--host", "0.0.0.0"], {},
                                          ["loopback addresses only"]),
        "report bad port": (["report", str(empty), "--serve", "--port", "http"], {}, ["invalid int value"]),
    }




@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bad_inputs")
    (tmp / "empty").mkdir()
    return _cases(tmp)


@pytest.mark.parametrize("name", list(_cases(Path("unused"))))
def test_a_bad_input_is_one_message_and_exit_2(name, cases):
    argv, env, words = cases[name]
    run_env = {**os.environ, **env}
    out = subprocess.run([sys.executable, "-m", "hybridflow", *argv], capture_output=True, text=True, timeout=180,
                         env={k: v for k, v in run_env.items() if v != ""})
    assert "Traceback" not in out.stderr and "Traceback" not in out.stdout, out.stderr
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    lines = [line for line in out.stderr.splitlines() if line.strip() and not line.startswith("hybridflow: note:")]
    assert lines and lines[0].startswith("hybridflow"), out.stderr
    if len(lines) > 1:  # several problems of one configuration: listed under one line
        assert lines[0].endswith("invalid configuration:") and all(x.startswith("  - ") for x in lines[1:]), lines
    for word in words:
        assert word in out.stderr, f"{name}: {word!r} not in {out.stderr!r}"
