"""``hybridflow quickstart --task judge``: RLAIF on this CPU -- a small judge model, trained by SFT at run time,
scores the policy's answers, and GRPO on the judge's scores raises held-out accuracy measured by an exact rule.

1. the ``addition_fixed`` task of the addition quickstart (``"07+45="`` -> ``"052"``), a tiny char-level policy
   warmed up with a short SFT (``policy_sft_steps``) so it is often but not usually right;
2. a judge of the same size, trained by the project's SFT (``judge_sft_steps``) to grade in two turns, the
   reference-guided way of Zheng et al. 2023 (MT-Bench, section 3.4: the judge answers the question on its own first,
   then grades with its own answer as the reference): (a) given the question alone (``"07+45="``) it writes the sum
   least significant digit first (``"250"``); (b) given the question, that reference and the candidate
   (``"07+45=250=052"``) it replies ``1`` (right) or ``0`` (wrong).  Its negatives are near misses (one digit
   changed, +-1, +-10, two digits swapped, a digit dropped or added, the right answer to another question), balanced
   with the positives.  Its agreement with the rule is measured on held-out questions before RL
   (``judge_heldout_agreement``); below ``min_judge_agreement`` the run stops (:class:`JudgeTooWeak`);
3. GRPO through the framework with the judge on the rollout service (``reward_model.rollout.name=hf``,
   colocated) and this file's :func:`judge_score` as the reward function: every training sample is scored by
   the judge's greedy verdict (``judge.chat``), never by the answer key; the exact rule is computed beside it only
   to log how often the judge agrees (``reward_extra/agree/mean``).  Validation (the held-out prompts, greedy)
   is scored by the exact rule;
   ``judge_mode="direct"`` is the judge that is *not* told the answer and does not work it out first: one turn,
   the question and the candidate written least significant digit first (``"07+45=250"``) -> ``1`` / ``0``
   (:func:`direct_prompt`); it must check the sum digit by digit as it reads the candidate;
4. ``summary.json``: held-out accuracy before / after RL, the judge's held-out agreement and its agreement with the
   rule on the samples it scored during RL, steps, seconds and CPU seconds (warm-ups included).

Why this judge (measured 2026-11-25, seed 1, ``benchmarks/RESULTS.md``): a one-turn judge that read question and
candidate and worked the sum out most significant digit first agreed with the rule on 72-76 % of held-out pairs, and
GRPO on its scores *lowered* held-out accuracy (39 % -> 6 %, 44.5 % -> 29 %).  Working the sum out least
significant digit first made it 96 % accurate, yet the policy still found its blind spot within 40 steps (units
digits off by 2 accepted: the judge, seeing the candidate, drifted towards it) and accuracy fell again after a
+19.5-point rise.  With the candidate hidden while the judge solves the question, nothing pulls its sum towards
the policy's answer.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

TASK = "addition_fixed"
VAL_KEY = f"val-core/synthetic/{TASK}/reward/mean@1"
AGREE_KEY = "reward_extra/agree/mean"
VERDICT_PATTERN = r"^([01])"  # the judge's second turn: 1 right, 0 wrong
JUDGE_MODES = ("reference", "direct")  # solve the question first, then grade | grade at once, told no answer


def solve_prompt(question: str) -> list[dict]:
    """The judge's first turn: the question alone; it answers with the sum, digits reversed (:func:`reversed_sum`)."""
    return [{"role": "user", "content": question}]


def verdict_prompt(question: str, reference: str, candidate: str) -> list[dict]:
    """The judge's second turn: the first turn (question, its own answer ``reference``) and the candidate; with the
    bare-text chat template it reads ``"07+45=250=052"``."""
    return solve_prompt(question) + [{"role": "assistant", "content": reference},
                                     {"role": "user", "content": f"={candidate}"}]


def direct_prompt(question: str, candidate: str) -> list[dict]:
    """The ``direct`` judge's only turn: the question and the candidate, digits reversed (``"07+45=250"``); no
    reference answer anywhere -- neither the key's nor its own."""
    return [{"role": "user", "content": f"{question}{reversed_sum(candidate)}"}]


def reversed_sum(answer: str) -> str:
    """How the judge writes a sum: least significant digit first (``"052"`` -> ``"250"``).  In that order each digit
    depends only on the digits already written and one carry, so the 0.4M-parameter judge learns it almost exactly,
    while the policy writes the most significant digit first and must foresee the carry."""
    return answer[::-1]


_OWN_ANSWERS: dict[str, str] = {}  # question -> the judge's first-turn answer (greedy, and the judge is frozen)


async def judge_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None,
                      judge=None, **kwargs: Any) -> dict[str, float]:
    """Training samples: the judge's verdict (1 right, 0 wrong), asked in two turns (:func:`solve_prompt`, then
    :func:`verdict_prompt`); held-out rows (``split`` test): the exact rule.  ``rule`` and ``agree`` are logged beside
    the judge's score; the answer key is never shown to the judge."""
    info = extra_info or {}
    answer = solution_str.strip()
    rule = float(answer == str(ground_truth))
    if info.get("split") == "test":
        return {"score": rule}
    from hybridflow.rewards.judge import parse_score

    question = info["question"]
    if question not in _OWN_ANSWERS:
        own = await judge.chat(solve_prompt(question), max_tokens=3, temperature=0.0)
        _OWN_ANSWERS[question] = own.strip()
    reply = await judge.chat(verdict_prompt(question, _OWN_ANSWERS[question], answer), max_tokens=1, temperature=0.0)
    verdict = parse_score(reply, VERDICT_PATTERN)
    return {"score": verdict, "rule": rule, "agree": float(verdict == rule)}


async def judge_score_direct(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None,
                             judge=None, **kwargs: Any) -> dict[str, float]:
    """:func:`judge_score` for ``judge_mode="direct"``: one turn (:func:`direct_prompt`), no reference answer."""
    info = extra_info or {}
    answer = solution_str.strip()
    rule = float(answer == str(ground_truth))
    if info.get("split") == "test":
        return {"score": rule}
    from hybridflow.rewards.judge import parse_score

    reply = await judge.chat(direct_prompt(info["question"], answer), max_tokens=1, temperature=0.0)
    verdict = parse_score(reply, VERDICT_PATTERN)
    return {"score": verdict, "rule": rule, "agree": float(verdict == rule)}


def near_misses(answer: str, rng: random.Random, other_answers: list[str] | None = None) -> str:
    """A wrong answer close to ``answer``: one digit changed, +-1, +-10, two digits swapped, a digit dropped or added,
    or (with ``other_answers``) the right answer to a different question."""
    value = int(answer)
    while True:
        kind = rng.randrange(7 if other_answers else 6)
        if kind == 0:
            i = rng.randrange(3)
            wrong = answer[:i] + rng.choice([d for d in "0123456789" if d != answer[i]]) + answer[i + 1:]
        elif kind == 1:
            wrong = f"{max(0, min(999, value + rng.choice((-1, 1)))):03d}"
        elif kind == 2:
            wrong = f"{max(0, min(999, value + rng.choice((-10, 10)))):03d}"
        elif kind == 3:
            i = rng.randrange(2)
            wrong = answer[:i] + answer[i + 1] + answer[i] + answer[i + 2:]
        elif kind == 4:
            i = rng.randrange(3)
            wrong = answer[:i] + answer[i + 1:]
        elif kind == 5:
            i = rng.randrange(4)
            wrong = answer[:i] + rng.choice("0123456789") + answer[i:]
        else:
            wrong = rng.choice(other_answers)
        if wrong != answer:
            return wrong


def judge_rows(rows: list[dict], seed: int, mode: str = "reference") -> list[dict]:
    """Multi-turn SFT rows for the judge, two per question: the question, the reversed sum (first turn), then the right
    answer -> ``1`` or a :func:`near_misses` one -> ``0`` (second turn; balanced classes).  Both turns are learnt.
    ``mode="direct"``: one turn, :func:`direct_prompt` -> the verdict."""
    rng = random.Random(f"judge:{seed}")
    answers = [row["reward_model"]["ground_truth"] for row in rows]
    out = []
    for row in rows:
        question, answer = row["prompt"][0]["content"], row["reward_model"]["ground_truth"]
        reference = reversed_sum(answer)
        for candidate, verdict in ((answer, "1"), (near_misses(answer, rng, answers), "0")):
            prompt = (direct_prompt(question, candidate) if mode == "direct"
                      else verdict_prompt(question, reference, candidate))
            out.append({"messages": prompt + [{"role": "assistant", "content": verdict}]})
    rng.shuffle(out)
    return out


def train_judge(base: str, rows: list[dict], out_dir: Path, steps: int, seed: int, lr: float) -> tuple[str, float]:
    from hybridflow.sft.trainer import load_sft_config, run_sft

    cfg = load_sft_config([
        f"model.partial_pretrain={base}", "data.train_batch_size=128", "data.micro_batch_size_per_gpu=128",
        "data.max_length=32", "data.multiturn.enable=true", "data.multiturn.messages_key=messages", f"optim.lr={lr}",
        "optim.lr_scheduler=constant", "optim.weight_decay=0.0", f"trainer.total_training_steps={steps}",
        f"trainer.default_local_dir={out_dir}", f"trainer.seed={seed}",
    ])

    def show(step: int, m: dict[str, float]) -> None:
        if step % 100 == 0 or step == steps:
            print(f"[judge sft] step {step}/{steps}  loss {m['train/loss']:.3f}", flush=True)

    result = run_sft(cfg, rows=rows, on_step=show)
    return result.hf_dir, result.seconds


def _greedy(model, tok, texts: list[str], max_new_tokens: int) -> list[str]:
    import torch

    replies = []
    with torch.no_grad():
        for start in range(0, len(texts), 256):
            enc = tok(texts[start:start + 256], return_tensors="pt", padding=True, padding_side="left",
                      add_special_tokens=False)
            new = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=tok.pad_token_id)[:, enc["input_ids"].shape[1]:]
            replies += [tok.decode(ids, skip_special_tokens=True).strip() for ids in new.tolist()]
    return replies


def judge_agreement(judge_dir: str, rows: list[dict], seed: int, mode: str = "reference") -> float:
    """How often the judge's two-turn greedy verdict (as :func:`judge_score` asks it) on each of ``rows``' questions
    with its right answer and with a near miss equals the exact rule's."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(judge_dir)
    model = AutoModelForCausalLM.from_pretrained(judge_dir).eval()

    def chat(messages: list[dict]) -> str:
        return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    rng = random.Random(f"judge-check:{seed}")
    answers = [row["reward_model"]["ground_truth"] for row in rows]
    questions = [row["prompt"][0]["content"] for row in rows]
    own = _greedy(model, tok, [chat(solve_prompt(q)) for q in questions], 3) if mode != "direct" else questions
    cases = []  # (question, own answer, candidate, right?)
    for question, answer, ref in zip(questions, answers, own):
        cases += [(question, ref, answer, True), (question, ref, near_misses(answer, rng, answers), False)]
    prompts = [chat(direct_prompt(q, c) if mode == "direct" else verdict_prompt(q, ref, c)) for q, ref, c, _ in cases]
    verdicts = _greedy(model, tok, prompts, 1)
    right = sum(int(v[:1] == ("1" if ok else "0")) for v, (*_, ok) in zip(verdicts, cases))
    return right / max(len(cases), 1)


class JudgeTooWeak(RuntimeError):
    """The judge trained at run time is below the agreement floor; RL is not started."""


def judge_overrides(judge_dir: str, mode: str = "reference") -> list[str]:
    """The judge on the rollout service, asked by :func:`judge_score` (``direct``: :func:`judge_score_direct`), as
    a user would type it."""
    return [
        "reward_model.enable=true", f"reward_model.model.path={judge_dir}", "reward_model.rollout.name=hf",
        "reward_model.rollout.prompt_length=16", "reward_model.rollout.response_length=3",
        "reward_model.rollout.max_num_seqs=256", "reward_model.rollout.temperature=0.0",
        "reward_model.judge.request_timeout_s=60", "reward_model.timeout_s=120", "reward_model.num_workers=1",
        f"custom_reward_function.path={Path(__file__).resolve()}",
        f"custom_reward_function.name={'judge_score_direct' if mode == 'direct' else 'judge_score'}",
    ]


def _with_questions(rows: list[dict]) -> list[dict]:
    """The rows, each with its question in ``extra_info`` (the judge's reward function reads it there)."""
    for row in rows:
        row["extra_info"] = {**row["extra_info"], "question": row["prompt"][0]["content"]}
    return rows


def run_judge_quickstart(output_dir: str = "outputs/quickstart_judge", backend: str = "local", seed: int = 1,
                         policy_sft_steps: int = 250, judge_sft_steps: int = 2500, rl_steps: int = 100,
                         train_size: int = 4000, test_size: int = 200, sft_lr: float = 1e-3, rl_lr: float = 5e-5,
                         test_freq: int = 25, max_seconds: float | None = None, min_judge_agreement: float = 0.9,
                         overrides: tuple[str, ...] = (), judge_mode: str = "reference") -> dict[str, Any]:
    """Run the whole demo; returns the summary written to ``output_dir/summary.json``.

    The judge is checked before RL on held-out (question, candidate answer) pairs; below ``min_judge_agreement``
    with the exact rule the run stops there (:class:`JudgeTooWeak`, the summary says why): GRPO on a judge that
    weak teaches the policy to please it, not to add (measured: held-out accuracy fell 15-33 points with a 72-76 %
    judge)."""
    from hybridflow.launch.config import load_config
    from hybridflow.quickstart.addition import grpo_overrides, held_out_rows, prepare_output

    if judge_mode not in JUDGE_MODES:
        raise ValueError(f"judge_mode={judge_mode!r}: choose one of {', '.join(JUDGE_MODES)}")
    t0, cpu0 = time.perf_counter(), time.process_time()
    train_rows, test_rows = held_out_rows(train_size, test_size, seed)
    out, data_dir = prepare_output(output_dir, _with_questions(train_rows), _with_questions(test_rows))
    policy_dir, policy_sft_s, judge_dir, judge_sft_s = _train_policy_and_judge(
        out, train_rows, seed, policy_sft_steps, judge_sft_steps, sft_lr, judge_mode)
    heldout_agreement = judge_agreement(judge_dir, test_rows, seed, judge_mode)
    print(f"[quickstart] judge agrees with the exact rule on {100 * heldout_agreement:.1f}% of held-out "
          "(question, candidate answer) pairs", flush=True)
    if heldout_agreement < min_judge_agreement:
        _stop_before_rl(out, heldout_agreement, min_judge_agreement, judge_sft_steps, judge_sft_s,
                        time.perf_counter() - t0, seed)
    config = load_config(grpo_overrides(policy_dir, data_dir, out, backend, rl_steps, seed, rl_lr, test_freq)
                         + judge_overrides(judge_dir, judge_mode) + ["trainer.experiment_name=addition_fixed_judge_grpo"]
                         + list(overrides))
    rl_start = time.perf_counter()
    history = _grpo_on_the_judge(config, out, rl_steps, rl_start, max_seconds)
    summary = {
        **_rl_results(history, heldout_agreement),
        "seconds": time.perf_counter() - t0,
        "cpu_seconds": time.process_time() - cpu0,
        "policy_sft_seconds": policy_sft_s,
        "judge_sft_seconds": judge_sft_s,
        "rl_seconds": time.perf_counter() - rl_start,
        "backend": backend,
        "seed": seed,
        "judge_mode": judge_mode,
    }
    _write_results(out, history, summary)
    return summary


def _train_policy_and_judge(out: Path, train_rows: list[dict], seed: int, policy_sft_steps: int,
                            judge_sft_steps: int, sft_lr: float, mode: str) -> tuple[str, float, str, float]:
    """(policy folder, its SFT seconds, judge folder, its SFT seconds): both tiny models built and trained by SFT."""
    from hybridflow.quickstart.addition import build_base_model, warm_up

    base = build_base_model(out / "base_model", seed)
    print(f"[quickstart] tiny policy + judge + addition task ready in {out}", flush=True)
    policy_dir, policy_sft_s = warm_up(base, train_rows, out / "sft", policy_sft_steps, seed, sft_lr)
    judge_base = build_base_model(out / "judge_base", seed + 1000)
    judge_dir, judge_sft_s = train_judge(judge_base, judge_rows(train_rows, seed, mode), out / "judge_sft",
                                         judge_sft_steps, seed, sft_lr)
    return policy_dir, policy_sft_s, judge_dir, judge_sft_s


def _stop_before_rl(out: Path, agreement: float, floor: float, judge_sft_steps: int, judge_sft_s: float,
                    seconds: float, seed: int) -> None:
    """Write why the run stops at the judge's agreement floor to the summary, and raise :class:`JudgeTooWeak`."""
    reason = (f"the judge agrees with the exact rule on {100 * agreement:.1f}% of held-out pairs, below "
              f"min_judge_agreement={floor}: GRPO on its scores would teach the policy to game it. "
              f"Train it longer (judge_sft_steps, now {judge_sft_steps}) or lower the floor")
    summary = {"stopped": reason, "judge_heldout_agreement": agreement, "judge_sft_steps": judge_sft_steps,
               "judge_sft_seconds": judge_sft_s, "seconds": seconds, "seed": seed}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    raise JudgeTooWeak(reason)


def _grpo_on_the_judge(config, out: Path, rl_steps: int, rl_start: float, max_seconds: float | None):
    """The GRPO run on the judge's scores, its progress shown live; its history."""
    from hybridflow.quickstart.addition import LiveLogger
    from hybridflow.tracking import Tracking
    from hybridflow.trainer.main_ppo import train_ppo

    tracking = Tracking("quickstart", "addition_fixed_judge_grpo", default_backend=["file"], output_dir=out,
                        total_steps=rl_steps)
    stop = None if max_seconds is None else (lambda: time.perf_counter() - rl_start > max_seconds)
    return train_ppo(config, logger=LiveLogger(tracking, rl_steps, rl_start, tag="grpo+judge",
                                               extra=((AGREE_KEY, "judge agrees"),)), should_stop=stop)


def _rl_results(history, heldout_agreement: float) -> dict[str, Any]:
    """Held-out accuracy before and after RL, the judge's agreement (held out, and on the RL steps' answers)."""
    vals = [m for m in history.metrics if VAL_KEY in m]
    agree = [m[AGREE_KEY] for m in history.metrics if AGREE_KEY in m]
    return {
        "before": {"accuracy": vals[0][VAL_KEY], "step": vals[0]["step"]},
        "after": {"accuracy": vals[-1][VAL_KEY], "step": vals[-1]["step"]},
        "judge_heldout_agreement": heldout_agreement,
        "judge_agreement_during_rl": sum(agree) / len(agree) if agree else None,
        "steps": int(history.metrics[-1]["step"]) if history.metrics else 0,
    }


def _write_results(out: Path, history, summary: dict[str, Any]) -> None:
    """``summary.json`` and the HTML report, and the before/after line."""
    from hybridflow.tracking.report import write_report

    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    write_report(out, history.metrics, history.samples, summary=summary,
                 title="hybridflow quickstart: GRPO on a judge's scores (RLAIF)")
    print(f"[quickstart] held-out accuracy (greedy, exact rule): before RL {100 * summary['before']['accuracy']:.1f}%"
          f"  ->  after {100 * summary['after']['accuracy']:.1f}%   judge agreement during RL "
          f"{100 * (summary['judge_agreement_during_rl'] or 0):.1f}%   ({summary['seconds']:.0f}s total)", flush=True)


__all__ = ["run_judge_quickstart", "JudgeTooWeak", "reversed_sum", "judge_score", "judge_score_direct", "judge_rows",
           "near_misses", "judge_agreement", "direct_prompt", "JUDGE_MODES"]
