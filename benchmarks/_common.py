"""Shared helpers of the performance benchmarks (spec S15): fixtures, run recording, tables, machine state.

Every benchmark measures side by side in one invocation and reports ratios, because absolute numbers on a
shared 2-core machine move with the load; ``machine_state()`` records that load next to each table so a
reader can judge how quiet the machine was.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

REPO = Path(__file__).resolve().parents[1]
# This checkout's package first, as in the children (``single_thread_env``): a venv whose editable install
# points at another checkout would otherwise build fixtures with that checkout's code.
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
# Bare-text chat template: the prompt is the question itself, as in the quickstart.
BARE_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
DEFAULT_WORKDIR = Path(os.environ.get("HYBRIDFLOW_BENCH_DIR", "/tmp/hybridflow_bench"))


def single_thread_env(threads: int | None = None) -> dict[str, str]:
    """Environment for child processes: one torch thread (``threads`` to give it more), no tokenizer threads,
    offline hub.  Without ``threads`` an ``OMP_NUM_THREADS`` already set by the caller is kept."""
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(threads) if threads else env.get("OMP_NUM_THREADS", "1"),
               TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1",
               PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""))
    return env


def machine_state() -> dict[str, str]:
    """Date (UTC), 1/5/15-minute load, git commit and core count, printed with every table."""
    load = os.getloadavg()
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load": "%.2f %.2f %.2f" % load,
            "commit": commit, "cpus": str(os.cpu_count())}


def print_state(title: str) -> dict[str, str]:
    state = machine_state()
    print(f"== {title}  [{state['date']}, load {state['load']}, commit {state['commit']}, {state['cpus']} cpus]",
          flush=True)
    return state


def peak_rss_mb() -> float:
    """Peak resident set of this process (MiB); Linux reports ``ru_maxrss`` in KiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def current_rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def median(xs: Sequence[float]) -> float:
    if not xs:
        raise ValueError("median of an empty sequence: the run recorded no measured steps (raise --steps)")
    return float(statistics.median(xs))


def slope(ys: Sequence[float]) -> float:
    """Least-squares slope of ``ys`` against their index (units of y per step)."""
    n = len(ys)
    if n < 2:
        return 0.0
    mx = (n - 1) / 2.0
    my = sum(ys) / n
    num = sum((i - mx) * (y - my) for i, y in enumerate(ys))
    den = sum((i - mx) ** 2 for i in range(n))
    return num / den


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Markdown table (pasted as is into RESULTS.md); floats get 3 significant digits."""
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1e4 else f"{v:.3e}"
        return str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    text = "\n".join(lines)
    print(text, flush=True)
    return text


# ------------------------------------------------------------------------------------------------ fixtures
def base_model(workdir: Path, size: str, seed: int = 0) -> str:
    """Random-init char-level Qwen2 of ``MODEL_SIZES[size]`` with the bare template (cached on disk)."""
    from hybridflow.utils.tiny_model import build_char_tokenizer, build_tiny_model

    path = workdir / "models" / f"{size}_s{seed}"
    if not (path / "config.json").exists():
        tok = build_char_tokenizer(chat_template=BARE_TEMPLATE)
        model = build_tiny_model(tok, size=size, seed=seed)
        path.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(path)
        tok.save_pretrained(path)
    return str(path)


def task_data(workdir: Path, task: str = "addition", n_train: int = 4000, n_test: int = 200) -> Path:
    """verl parquet files of a built-in synthetic task (cached on disk)."""
    from hybridflow.data.synthetic import write_synthetic

    out = workdir / "data" / f"{task}_{n_train}_{n_test}"
    if not (out / "test.parquet").exists():
        write_synthetic(task, str(out), n_train, n_test)
    return out


def warm_model(workdir: Path, size: str, sft_steps: int, seed: int = 0) -> str:
    """Base model after ``sft_steps`` of hybridflow SFT on addition, so RL starts from a non-zero reward.

    From a random init neither framework reaches a non-zero accuracy in a benchmark's budget, which would
    make the accuracy column meaningless; both frameworks then start from this same checkpoint.
    """
    out = workdir / "models" / f"{size}_sft{sft_steps}_s{seed}"
    hf_dir = out / "huggingface"
    if (hf_dir / "config.json").exists():
        return str(hf_dir)
    from hybridflow.data.synthetic import make_rows
    from hybridflow.sft.trainer import load_sft_config, run_sft

    rows = [{"prompt": r["prompt"], "response": r["reward_model"]["ground_truth"]}
            for r in make_rows("addition", 4000, seed, "train")]
    cfg = load_sft_config([
        f"model.partial_pretrain={base_model(workdir, size, seed)}", "data.train_batch_size=128",
        "data.micro_batch_size_per_gpu=128", "data.max_length=32", "optim.lr=3e-3", "optim.lr_scheduler=constant",
        "optim.weight_decay=0.0", f"trainer.total_training_steps={sft_steps}", f"trainer.default_local_dir={out}",
        f"trainer.seed={seed}",
    ])
    result = run_sft(cfg, rows=rows)
    if result.hf_dir is None:
        raise RuntimeError(f"SFT warm-up wrote no HF model under {out}")
    return result.hf_dir


# --------------------------------------------------------------------- long-tail addition (variable lengths)
# 2-digit addition ("07+45=" -> "052") where an SFT warm-up taught the model to answer in 4 tokens (3 digits
# and EOS) most of the time and, for a share of the rows, to run on with a filler after the answer -- most
# responses short, a few long: the length spread that a real GRPO batch has and that a rollout retiring
# finished rows (or an update trimming padding) turns into time saved. Used by bench_async and by the
# generation shape of bench_vs_trl.
LONG_TAIL_ALPHABET = "0123456789+=."
LONG_TAIL_FILLER = "."
LONG_TAIL_SOURCE = "bench/long_tail_addition"
LONG_TAIL_VAL_KEY = f"val-core/{LONG_TAIL_SOURCE}/reward/mean@1"
LONG_TAIL_REWARD_FILE = Path(__file__).resolve().parent / "long_tail_reward.py"  # long_tail_score, the reward


def long_tail_rows(n: int, seed: int, split: str, long_share: float) -> list[dict]:
    """verl rows of the task; ``extra_info.long`` marks the rows whose SFT target runs on with the filler."""
    import random

    rng = random.Random(f"long_tail:{split}:{seed}")
    rows = []
    for i in range(n):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        rows.append({
            "data_source": LONG_TAIL_SOURCE, "prompt": [{"role": "user", "content": f"{a:02d}+{b:02d}="}],
            "ability": "math", "reward_model": {"style": "rule", "ground_truth": f"{a + b:03d}"},
            "extra_info": {"split": split, "index": i, "long": rng.random() < long_share},
        })
    return rows


def long_tail_task(workdir: Path, sft_steps: int, *, size: str = "tiny", response_length: int = 64,
                   long_share: float = 0.125, varied: bool = False, train_size: int = 4000, lr: float = 1e-3,
                   batch: int = 64, micro: int | None = None, answer_steps: int = 0,
                   seed: int = 0) -> tuple[str, Path]:
    """Data (train / held-out test parquet) and the SFT-warmed model with the long-tail habit (both cached).

    A long row's SFT target is the answer, then the filler: up to the response limit (``varied=False``, as
    bench_async), or of a length drawn uniformly in ``[1, response_length - 4]`` (``varied=True``), so that
    the lengths the model samples spread over the whole range.  With ``micro`` the SFT batches are fixed
    (no shuffle: the rows are dealt into batches of ``batch`` once) and sorted by length inside, so that
    micro-batches of ``micro`` rows pad the few long rows among themselves and not into every short one --
    the same gradients (the SFT loss is a token mean over the whole batch), a fraction of the padded tokens.
    ``answer_steps`` (with ``micro``) first trains that many steps on the answers alone (a few tokens a row,
    one micro-batch a step: cheap steps that teach the addition), then ``sft_steps`` on the long-tail mix from
    that checkpoint (the length habit; a fresh optimizer).
    The default arguments reproduce bench_async's fixture (and its cache folders).
    """
    import random

    from hybridflow.data.io import write_parquet

    default = (size, response_length, long_share, varied, micro) == ("tiny", 64, 0.125, False, None)
    tag = "" if default else f"_{size}_r{response_length}_l{long_share:g}{'_v' if varied else ''}"
    data = workdir / "data" / f"long_tail_{train_size}{tag}"
    test = long_tail_rows(400, seed, "test", 0.0)
    seen = {r["prompt"][0]["content"] for r in test}
    test = list({r["prompt"][0]["content"]: r for r in test}.values())[:200]
    train = [r for r in long_tail_rows(train_size, seed, "train", long_share) if r["prompt"][0]["content"] not in seen]
    if not (data / "test.parquet").exists():
        write_parquet(train, str(data / "train.parquet"))
        write_parquet(test, str(data / "test.parquet"))
    steps = f"{answer_steps}+{sft_steps}" if answer_steps else f"{sft_steps}"
    name = f"long_tail{tag}_sft{steps}_lr{lr:g}_s{seed}" if tag else f"long_tail_sft{sft_steps}_s{seed}"
    out = workdir / "models" / name
    if not (out / "huggingface" / "config.json").exists():
        from hybridflow.sft.trainer import load_sft_config, run_sft
        from hybridflow.utils.tiny_model import build_char_tokenizer, build_tiny_model

        base = workdir / "models" / f"long_tail_base{'' if default else '_' + size}_s{seed}"
        tok = build_char_tokenizer(alphabet=LONG_TAIL_ALPHABET, chat_template=BARE_TEMPLATE)
        build_tiny_model(tok, size=size, seed=seed).save_pretrained(base)
        tok.save_pretrained(base)
        fill = random.Random(f"long_tail_fill:{seed}")
        rows = []
        for r in train:
            n = 0
            if r["extra_info"]["long"]:
                n = fill.randint(1, response_length - 4) if varied else response_length - 4
            rows.append({"prompt": r["prompt"], "response": r["reward_model"]["ground_truth"] + LONG_TAIL_FILLER * n})

        def sft(start: Path, rows: list[dict], steps: int, micro: int, shuffle: bool, folder: Path) -> str:
            def progress(step: int, metrics: dict[str, float]) -> None:
                if step % 50 == 0 or step == steps:
                    print(f"  [long_tail SFT {size} -> {folder.name}] step {step}/{steps} loss "
                          f"{metrics['train/loss']:.4f}", flush=True)

            cfg = load_sft_config([
                f"model.partial_pretrain={start}", f"data.train_batch_size={batch}",
                f"data.micro_batch_size_per_gpu={micro}", f"data.max_length={response_length + 16}",
                f"data.shuffle={shuffle}", f"optim.lr={lr}", "optim.lr_scheduler=constant", "optim.weight_decay=0.0",
                f"trainer.total_training_steps={steps}", f"trainer.default_local_dir={folder}", f"trainer.seed={seed}"])
            return run_sft(cfg, rows=rows, on_step=progress if not default else None).hf_dir

        if micro is None:
            sft(base, rows, sft_steps, batch, True, out)
        else:  # fixed batches, long rows together inside each (see the docstring)
            shuffle = random.Random(seed)
            if answer_steps:  # answers alone: a few tokens a row, one micro-batch a step
                answers = [{"prompt": r["prompt"], "response": r["reward_model"]["ground_truth"]} for r in train]
                base = Path(sft(base, answers, answer_steps, batch, True,
                                out.with_name(out.name + "_answers")))
            mixed = []
            while len(mixed) < sft_steps * batch:
                shuffle.shuffle(rows)
                mixed += rows
            by_length = [row for i in range(0, sft_steps * batch, batch)
                         for row in sorted(mixed[i:i + batch], key=lambda x: len(x["response"]))]
            sft(base, by_length, sft_steps, micro, False, out)
    return str(out / "huggingface"), data


@dataclass(frozen=True)
class GRPOJob:
    """One GRPO job, described once and run by every framework compared."""

    model: str
    data_dir: str
    prompts: int = 8  # prompts per step
    group: int = 4  # completions per prompt (rollout.n / num_generations)
    response_length: int = 4
    prompt_length: int = 8
    lr: float = 5e-5
    steps: int = 10
    seed: int = 0
    kl_coef: float = 0.0  # 0: no KL (beta=0 in TRL, use_kl_loss=false here)
    backend: str = "local"
    extra: tuple[str, ...] = ()

    def overrides(self, test_freq: int = -1) -> list[str]:
        """The job as verl command-line overrides (one optimizer step per rollout, as TRL's default)."""
        a = "actor_rollout_ref"
        kl = ([f"{a}.actor.use_kl_loss=true", f"{a}.actor.kl_loss_coef={self.kl_coef}",
               f"{a}.actor.kl_loss_type=low_var_kl"] if self.kl_coef > 0 else [f"{a}.actor.use_kl_loss=false"])
        micro = self.prompts * self.group
        return [
            f"{a}.model.path={self.model}", f"data.train_files={self.data_dir}/train.parquet",
            f"data.val_files={self.data_dir}/test.parquet", f"data.train_batch_size={self.prompts}",
            f"data.max_prompt_length={self.prompt_length}", f"data.max_response_length={self.response_length}",
            f"data.seed={self.seed}", "algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=false",
            f"{a}.rollout.name=hf", f"{a}.rollout.n={self.group}", f"{a}.rollout.temperature=1.0",
            f"{a}.actor.ppo_mini_batch_size={self.prompts}", f"{a}.actor.ppo_micro_batch_size_per_gpu={micro}",
            f"{a}.rollout.log_prob_micro_batch_size_per_gpu={micro}",
            f"{a}.ref.log_prob_micro_batch_size_per_gpu={micro}", f"{a}.actor.optim.lr={self.lr}",
            f"{a}.actor.optim.weight_decay=0.0", f"{a}.actor.entropy_coeff=0", f"{a}.actor.loss_agg_mode=token-mean",
            f"{a}.model.enable_gradient_checkpointing=false", "reward_model.num_workers=0",
            f"trainer.backend={self.backend}", "trainer.device=cpu", "trainer.nnodes=1", "trainer.n_gpus_per_node=1",
            f"trainer.total_training_steps={self.steps}", f"trainer.test_freq={test_freq}",
            "trainer.val_before_train=false", "trainer.save_freq=-1", "trainer.resume_mode=disable",
            "trainer.logger=[console]", "trainer.project_name=bench", "trainer.experiment_name=bench",
            f"trainer.seed={self.seed}", *kl, *self.extra,
        ]


@dataclass
class RecordingLogger:
    """Trainer logger that keeps each step's metrics and the wall-clock second it arrived."""

    start: float = field(default_factory=time.perf_counter)
    records: list[tuple[float, int, dict[str, float]]] = field(default_factory=list)
    cpu_marks: list[float] = field(default_factory=list)  # this process's CPU seconds at each log
    output_dir: None = None  # no folder: the trainer writes no report

    def log(self, data: dict[str, float], step: int) -> None:
        self.records.append((time.perf_counter() - self.start, step, dict(data)))
        self.cpu_marks.append(time.process_time())

    def cpu_per_step(self) -> list[float]:
        """Process CPU seconds between consecutive logs (the first step has no start mark and is left out)."""
        return [b - a for a, b in zip(self.cpu_marks, self.cpu_marks[1:])]

    def log_generations(self, samples, step: int) -> None:
        pass

    def finish(self) -> None:
        pass


def run_hybridflow(overrides: list[str], budget_s: float | None = None) -> RecordingLogger:
    """One in-process ``train_ppo`` run; ``budget_s`` stops it after the step that crosses the budget."""
    from hybridflow.launch.config import load_config
    from hybridflow.trainer.main_ppo import train_ppo

    config = load_config(overrides)
    logger = RecordingLogger()
    stop = None
    if budget_s is not None:
        def stop() -> bool:
            return time.perf_counter() - logger.start >= budget_s
    train_ppo(config, logger=logger, should_stop=stop)
    return logger


def run_child(script: Path, args: list[str], timeout: float = 900, threads: int | None = None,
              env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``script args`` in a fresh interpreter and parse the JSON line it prints last (``RESULT {...}``).

    Each measured run gets its own process so its peak RSS is its own and no state leaks between runs.
    The child gets one torch thread unless ``threads`` says otherwise (``single_thread_env``), or exactly ``env``.
    """
    proc = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=timeout,
                          env=env if env is not None else single_thread_env(threads), cwd=REPO)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"{script.name} {' '.join(args)} failed (rc={proc.returncode}):\n"
                       f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


def job_from_json(text: str) -> GRPOJob:
    """The ``GRPOJob`` a parent passed to its child as ``json.dumps(asdict(job))``."""
    data = json.loads(text)
    data["extra"] = tuple(data["extra"])
    return GRPOJob(**data)


def emit_result(result: dict[str, Any]) -> None:
    """The child's side of ``run_child``."""
    print("RESULT " + json.dumps(result), flush=True)
