"""A tiny GRPO run on a code task (importable by name from tests): does a policy that learned ``exit()`` get
rewarded?

The task: the prompt ``f`` asks for ``f(x) = x + 1``; the test is ``assert f(1) == 2`` (``data_source``
``codecontests``, scored by the built-in code reward in the sandbox). The policy is a char-level tiny Qwen2
whose tokenizer has the two whole programs as single tokens, warmed up by SFT to answer half the time with a
program that calls ``exit()`` (which scored 1.0 before issue 24) and half the time with the correct one. GRPO
then runs through the real trainer (``train_ppo``: hf rollout, reward manager, sandbox), dumping every
generation and its score per step (``trainer.rollout_data_dir``).
"""

from __future__ import annotations

import json
from pathlib import Path

FENCE_OPEN, FENCE_CLOSE = "```python\n", "\n```"
EXIT_PROGRAM = "exit()"
SOLVE_PROGRAM = "def f(x):return x+1"
TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def _rows(n: int) -> list[dict]:
    gt = json.dumps({"assert": "assert f(41) == 42"})
    return [{"data_source": "codecontests", "prompt": [{"role": "user", "content": "f"}], "ability": "code",
             "reward_model": {"style": "rule", "ground_truth": gt}, "extra_info": {"index": i}} for i in range(n)]


def _model(path: Path, seed: int) -> str:
    from hybridflow.utils.tiny_model import build_char_tokenizer, build_tiny_model

    tok = build_char_tokenizer(alphabet="f", chat_template=TEMPLATE,
                               added_tokens=[FENCE_OPEN, FENCE_CLOSE, EXIT_PROGRAM, SOLVE_PROGRAM])
    model = build_tiny_model(tok, size="nano", seed=seed)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def _warm_up(base: str, out_dir: Path, seed: int) -> str:
    """SFT on 50/50 exit()/correct answers: the sampled policy then writes exit() about half the time."""
    from hybridflow.sft.config import load_sft_config
    from hybridflow.sft.trainer import run_sft

    rows = [{"prompt": [{"role": "user", "content": "f"}],
             "response": FENCE_OPEN + (EXIT_PROGRAM if i % 2 else SOLVE_PROGRAM) + FENCE_CLOSE} for i in range(64)]
    cfg = load_sft_config([
        f"model.partial_pretrain={base}", "data.train_batch_size=64", "data.micro_batch_size_per_gpu=64",
        "data.max_length=16", "optim.lr=3e-3", "optim.lr_scheduler=constant", "optim.weight_decay=0.0",
        "trainer.total_training_steps=60", f"trainer.default_local_dir={out_dir}", f"trainer.seed={seed}",
    ])
    return run_sft(cfg, rows=rows).hf_dir


def run_code_task(tmp_path: Path, steps: int = 8, seed: int = 1) -> dict[int, list[dict]]:
    """Warm up, run GRPO for ``steps`` steps; returns ``{step: [{"output", "score"}, ...]}`` from the dumps."""
    import pandas as pd

    from hybridflow.launch.config import load_config
    from hybridflow.tracking import Tracking
    from hybridflow.trainer.main_ppo import train_ppo

    tmp_path = Path(tmp_path)
    model = _warm_up(_model(tmp_path / "base", seed), tmp_path / "sft", seed)
    data = tmp_path / "data"
    data.mkdir()
    pd.DataFrame(_rows(64)).to_parquet(data / "train.parquet")
    dumps = tmp_path / "dumps"
    a = "actor_rollout_ref"
    cfg = load_config([
        f"{a}.model.path={model}", f"data.train_files={data / 'train.parquet'}", "data.val_files=null",
        "data.train_batch_size=4", "data.max_prompt_length=4", "data.max_response_length=4", f"data.seed={seed}",
        "algorithm.adv_estimator=grpo", f"{a}.rollout.name=hf", f"{a}.rollout.n=8", f"{a}.rollout.temperature=1.0",
        f"{a}.actor.ppo_mini_batch_size=4", f"{a}.actor.ppo_micro_batch_size_per_gpu=32",
        f"{a}.rollout.log_prob_micro_batch_size_per_gpu=32", f"{a}.rollout.calculate_log_probs=true",
        f"{a}.actor.optim.lr=2e-3", f"{a}.actor.optim.weight_decay=0.0", f"{a}.actor.use_kl_loss=false",
        f"{a}.actor.entropy_coeff=0", f"{a}.model.enable_gradient_checkpointing=false",
        "reward_model.num_workers=2", "trainer.backend=local", "trainer.device=cpu", "trainer.nnodes=1",
        "trainer.n_gpus_per_node=1", f"trainer.total_training_steps={steps}", "trainer.test_freq=-1",
        "trainer.val_before_train=false", "trainer.save_freq=-1", "trainer.resume_mode=disable",
        "trainer.logger=[file]", "trainer.report=false", f"trainer.rollout_data_dir={dumps}",
        f"trainer.default_local_dir={tmp_path / 'ckpt'}", "trainer.project_name=code", "trainer.experiment_name=exit",
        f"trainer.seed={seed}",
    ])
    train_ppo(cfg, logger=Tracking("code", "exit", default_backend=["file"], output_dir=tmp_path / "logs"))
    out = {}
    for path in sorted(dumps.glob("*.jsonl")):
        out[int(path.stem)] = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return out


def exit_fraction(rows: list[dict]) -> float:
    return sum(EXIT_PROGRAM in r["output"] for r in rows) / max(1, len(rows))
