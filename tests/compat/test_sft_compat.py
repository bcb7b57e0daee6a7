"""verl's SFT command lines (``examples/sft/*.sh`` of its ``fsdp_sft_trainer``, before Feb 2026) with the module
renamed: ``python -m hybridflow.trainer.fsdp_sft_trainer ...``, scaled to a tiny local model and a few rows.

Keys that must act: ``data.prompt_dict_keys`` / ``response_dict_keys`` (columns holding dicts, as verl's GSM8K
parquet's ``extra_info``), ``model.lora_rank`` / ``lora_alpha`` / ``target_modules`` (LoRA SFT),
``trainer.device``, ``trainer.n_gpus_per_node`` / ``nnodes`` (data-parallel ranks).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hybridflow.sft.trainer import SFTTrainer, build_examples, load_sft_config, main, run_sft

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gsm8k_like(tmp_path_factory):
    """Parquet files laid out as verl's GSM8K preprocessing writes them (question/answer in ``extra_info``)."""
    import pandas as pd

    d = tmp_path_factory.mktemp("sft_gsm8k")
    rows = [{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": f"{a}+{b}?"}],
             "extra_info": {"question": f"What is {a} plus {b}?", "answer": f"{a}+{b}={a + b}\n#### {a + b}",
                            "index": i, "split": "train"}}
            for i, (a, b) in enumerate((a, b) for a in range(4) for b in range(4))]
    pd.DataFrame(rows).to_parquet(d / "train.parquet")
    pd.DataFrame(rows[:6]).to_parquet(d / "test.parquet")
    chats = [{"messages": [{"role": "user", "content": f"{a}+{a}?"}, {"role": "assistant", "content": str(2 * a)},
                           {"role": "user", "content": "and times 2?"}, {"role": "assistant", "content": str(4 * a)}]}
             for a in range(8)]
    pd.DataFrame(chats).to_parquet(d / "multiturn.parquet")
    return d


def peft_script(data: Path, model: str, out: Path) -> list[str]:
    """examples/sft/gsm8k/run_qwen_05_peft.sh, scaled: same keys, tiny model, two steps."""
    return [f"data.train_files={data / 'train.parquet'}", f"data.val_files={data / 'test.parquet'}",
            "data.prompt_key=extra_info", "data.response_key=extra_info", "optim.lr=1e-2",
            "data.prompt_dict_keys=['question']", "+data.response_dict_keys=['answer']",
            "data.micro_batch_size_per_gpu=4", f"model.partial_pretrain={model}", f"trainer.default_local_dir={out}",
            "trainer.project_name=gsm8k-sft", "trainer.experiment_name=gsm8k-sft-qwen-2.5-0.5b-instruct",
            "trainer.logger=console", "trainer.total_epochs=1",
            "model.lora_rank=32", "model.lora_alpha=16", "model.target_modules=all-linear",
            # scaled to this machine
            "data.train_batch_size=8", "trainer.total_training_steps=2"]


def test_dict_keys_pick_the_question_and_the_answer(gsm8k_like, bpe_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(bpe_model_dir)
    cfg = load_sft_config(["data.prompt_key=extra_info", "data.response_key=extra_info",
                           "data.prompt_dict_keys=['question']", "+data.response_dict_keys=['answer']"])
    from hybridflow.sft.trainer import read_sft_rows

    (ex,) = build_examples(read_sft_rows(str(gsm8k_like / "train.parquet"))[7:8], tok, cfg.data)
    assert "What is 1 plus 3?" in tok.decode(ex.input_ids)
    assert tok.decode([t for t, m in zip(ex.input_ids, ex.loss_mask) if m]).startswith("1+3=4\n#### 4")
    bad = load_sft_config(["data.prompt_key=extra_info", "data.prompt_dict_keys=['query']",
                           "data.response_key=extra_info", "data.response_dict_keys=[answer]"])
    with pytest.raises(KeyError, match="looks up 'query'.*'answer', 'index', 'question', 'split'"):
        build_examples([{"extra_info": {"question": "q", "answer": "a", "index": 0, "split": "x"}}], tok, bad.data)


def test_verl_peft_script_runs_and_trains_only_adapters(gsm8k_like, bpe_model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    result = main(peft_script(gsm8k_like, bpe_model_dir, tmp_path / "ckpt"))
    losses = [h["train/loss"] for h in result.history]
    assert len(losses) == 2 and "val/loss" in result.history[-1]  # data.val_files acts
    assert "step:2 - train/loss:" in capsys.readouterr().out  # the console logger of trainer.logger=console
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(bpe_model_dir)
    tuned = AutoModelForCausalLM.from_pretrained(result.hf_dir)  # LoRA merged: a plain HF folder
    assert (Path(result.hf_dir) / "lora_adapter" / "adapter_config.json").is_file()
    diff = [n for n, p in tuned.state_dict().items() if not torch.equal(p, base.state_dict()[n])]
    assert diff and all(("proj" in n) for n in diff)  # only linear layers moved (adapters merged into them)


def test_lora_keys_act_in_the_trainer(gsm8k_like, bpe_model_dir, tmp_path):
    cfg = load_sft_config(peft_script(gsm8k_like, bpe_model_dir, tmp_path) + ["model.lora_rank=4",
                                                                               "model.target_modules=[q_proj,v_proj]"])
    from transformers import AutoTokenizer

    from hybridflow.sft.trainer import read_sft_rows

    tok = AutoTokenizer.from_pretrained(bpe_model_dir)
    trainer = SFTTrainer(cfg, tok, build_examples(read_sft_rows(cfg.data.train_files), tok, cfg.data))
    trainable = [n for n, p in trainer.engine.module.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert {n.split(".")[-4] for n in trainable} == {"q_proj", "v_proj"}  # target_modules (...q_proj.lora_A.default.weight)
    lora_a = next(p for n, p in trainer.engine.module.named_parameters() if "lora_A" in n)
    assert lora_a.shape[0] == 4  # lora_rank
    frozen = {n: p.detach().clone() for n, p in trainer.engine.module.named_parameters() if not p.requires_grad}
    batches = trainer._batches()
    for _ in range(2):
        trainer.train_step(next(batches))
    assert all(torch.equal(p, frozen[n]) for n, p in trainer.engine.module.named_parameters() if n in frozen)


def test_verl_full_finetune_scripts_run(gsm8k_like, bpe_model_dir, tmp_path, monkeypatch):
    """examples/sft/gsm8k/run_gemma_2b.sh and run_deepseek_6b7.sh (same keys), scaled."""
    monkeypatch.chdir(tmp_path)
    argv = [a for a in peft_script(gsm8k_like, bpe_model_dir, tmp_path / "ckpt") if not a.startswith("model.")]
    argv += [f"model.partial_pretrain={bpe_model_dir}", "trainer.total_epochs=2", "trainer.logger=['console']",
             "trainer.n_gpus_per_node=1", "trainer.nnodes=1", "trainer.device=cpu"]
    result = main(argv)
    assert len(result.history) == 2 and Path(result.hf_dir, "config.json").is_file()


def test_multiturn_script_and_the_ulysses_refusal(gsm8k_like, bpe_model_dir, tmp_path, monkeypatch):
    """examples/sft/multiturn/run_qwen_05_sp2.sh: Ulysses SP is refused with the fix; without it the run goes
    (``use_remove_padding=true`` packs its micro-batches)."""
    monkeypatch.chdir(tmp_path)
    argv = [f"data.train_files={gsm8k_like / 'multiturn.parquet'}", f"data.val_files={gsm8k_like / 'multiturn.parquet'}",
            "data.multiturn.enable=true", "data.multiturn.messages_key=messages", "data.micro_batch_size=4",
            f"model.partial_pretrain={bpe_model_dir}", f"trainer.default_local_dir={tmp_path / 'ckpt'}",
            "trainer.project_name=multiturn-sft", "trainer.experiment_name=multiturn-sft-qwen-2.5-0.5b-instruct-sp2",
            "trainer.logger=console", "trainer.total_training_steps=1", "data.train_batch_size=4"]
    with pytest.raises(ValueError, match="ulysses_sequence_parallel_size=2: Ulysses sequence parallelism is not "
                                         "implemented.*Drop the key"):
        load_sft_config(argv + ["ulysses_sequence_parallel_size=2", "use_remove_padding=true"])
    with pytest.warns(UserWarning, match="data.micro_batch_size=4 is verl's deprecated spelling"):
        result = main(argv + ["use_remove_padding=true"])
    assert len(result.history) == 1 and 0 < result.history[0]["train/loss"] < 100  # packed rows (trainer/test_sft.py)


def test_trainer_device_is_checked():
    from hybridflow.sft.launch import select_device

    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="trainer.device=cuda but torch sees no GPU"):
            select_device("cuda")
    with pytest.raises(ValueError, match="must be auto, cpu or cuda"):
        load_sft_config(["trainer.device=npu"])


def test_the_world_size_comes_from_torchrun_or_the_config():
    from hybridflow.sft.launch import world_size

    launched = {"WORLD_SIZE": "4", "RANK": "0"}
    assert world_size(load_sft_config([]), launched) == (4, True)  # verl's scripts set neither key
    assert world_size(load_sft_config(["trainer.n_gpus_per_node=2", "trainer.nnodes=2"]), launched) == (4, True)
    with pytest.raises(ValueError, match="started 4 processes but .* = 2 x 1 = 2"):
        world_size(load_sft_config(["trainer.n_gpus_per_node=2"]), launched)
    assert world_size(load_sft_config([]), {}) == (1, False)
    assert world_size(load_sft_config(["trainer.n_gpus_per_node=3"]), {}) == (3, False)
    with pytest.raises(ValueError, match="torchrun --nnodes=2"):
        world_size(load_sft_config(["trainer.nnodes=2"]), {})
    # a local-backend PPO run earlier in the same process (a notebook) wrote RANK=0/WORLD_SIZE=1 for itself
    from hybridflow.controller.worker import ENV_LOCAL_RANKS

    local = {"WORLD_SIZE": "1", "RANK": "0", ENV_LOCAL_RANKS: str(os.getpid())}
    assert world_size(load_sft_config(["trainer.n_gpus_per_node=2"]), local) == (2, False)
    # ... and a process started from that notebook (torchrun's children) inherits the marker but is launched
    inherited = {"WORLD_SIZE": "2", "RANK": "1", ENV_LOCAL_RANKS: str(os.getppid())}
    assert world_size(load_sft_config([]), inherited) == (2, True)


@pytest.mark.slow
def test_two_data_parallel_ranks_give_the_one_rank_losses(gsm8k_like, bpe_model_dir, tmp_path, monkeypatch):
    """trainer.n_gpus_per_node=2 spawns two FSDP ranks (gloo); the loss curve equals the one-rank run's."""
    monkeypatch.chdir(tmp_path)
    argv = [a for a in peft_script(gsm8k_like, bpe_model_dir, tmp_path / "one") if "lora" not in a
            and "target_modules" not in a] + ["trainer.total_training_steps=3", "data.micro_batch_size_per_gpu=2",
                                              "trainer.device=cpu", "optim.lr=3e-3"]
    one = run_sft(load_sft_config(argv + ["trainer.save_hf_model=false"]))
    two = main(argv + ["trainer.n_gpus_per_node=2", f"trainer.default_local_dir={tmp_path / 'two'}"])
    assert [h["train/loss"] for h in two.history] == pytest.approx([h["train/loss"] for h in one.history], rel=1e-4)
    # the gradient itself (Adam and clipping would hide a wrongly scaled one in the losses)
    assert [h["train/grad_norm"] for h in two.history] == pytest.approx([h["train/grad_norm"] for h in one.history],
                                                                        rel=1e-4)
    assert two.history[-1]["val/loss"] == pytest.approx(one.history[-1]["val/loss"], rel=1e-4)
    assert Path(two.hf_dir, "config.json").is_file()


@pytest.mark.slow
def test_the_module_path_runs_as_a_command(gsm8k_like, bpe_model_dir, tmp_path):
    """``python -m hybridflow.trainer.fsdp_sft_trainer`` + the peft script's keys, in a fresh process."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "hybridflow.trainer.fsdp_sft_trainer",
                           *peft_script(gsm8k_like, bpe_model_dir, tmp_path / "ckpt")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "SFT finished" in proc.stdout and (tmp_path / "ckpt" / "huggingface" / "config.json").is_file()


@pytest.mark.slow
def test_verls_torchrun_line_runs(gsm8k_like, bpe_model_dir, tmp_path):
    """``torchrun --standalone --nnodes=1 --nproc_per_node=2 -m hybridflow.trainer.fsdp_sft_trainer ...`` (verl's
    launch line with the module renamed): two gloo ranks, sized by torchrun alone -- also when started from a
    process where a local-backend run wrote its own RANK / WORLD_SIZE (a notebook; this test process, often)."""
    from hybridflow.controller.worker import ENV_LOCAL_RANKS

    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
           "RANK": "0", "WORLD_SIZE": "1", ENV_LOCAL_RANKS: str(os.getpid())}
    proc = subprocess.run([str(torchrun), "--standalone", "--nnodes=1", "--nproc_per_node=2",
                           "-m", "hybridflow.trainer.fsdp_sft_trainer",
                           *peft_script(gsm8k_like, bpe_model_dir, tmp_path / "ckpt"), "trainer.device=cpu"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("SFT finished") == 1  # rank 0 reports
    assert (tmp_path / "ckpt" / "huggingface" / "config.json").is_file()
