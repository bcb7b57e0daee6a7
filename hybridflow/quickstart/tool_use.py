"""``hybridflow quickstart --task tool-use``: a tiny model learns, with GRPO through ``tool_agent``, to use a
calculator.

The task (``synthetic/multiplication``): ``"423*45"`` -> ``"19035"``, a 3-digit times a 2-digit number with a
5-digit product.  A 0.4M-parameter char-level model cannot multiply in its head (the no-tool arm stays at 0%);
with the ``calculator`` tool it only has to copy: the operands into a hermes tool call, the tool's result into
its answer::

    <|im_start|>user\n423*45<|im_end|>\n<|im_start|>assistant\n
    <tool_call>{"name":"calculator","arguments":{"expression":"423*45"}}</tool_call><|im_end|>    model (trained)
    \n<|im_start|>user\n<tool_response>19035</tool_response><|im_end|>\n<|im_start|>assistant\n   observation (masked)
    19035<|im_end|>                                                                               model (trained)

Two arms with the same model, data, SFT and RL budget:

* **tool**: SFT warm-up on ``demos`` chats in which the demonstrator reached for the calculator mostly on the
  "big" questions -- 90% of those whose first factor is at least ``LARGE_FACTOR`` (about half of them), 10% of
  the others -- and answered the rest directly (``tool_rates``).  The warmed-up model copies well but has learnt
  the demonstrator's habit: greedily it calls the tool on the big questions only (seed 1: on all 103 big held-out
  questions and 2 of the 97 others), so it starts at ~50%.  GRPO through ``tool_agent`` (``multi_turn.enable``)
  rewards the final answer only; the occasional sampled tool call on a small question is right where direct
  answers are wrong, so RL -- not SFT -- makes tool use reliable;
* **no_tool_baseline**: the same number of SFT steps on the same questions answered directly, then single-turn
  GRPO with the same steps, batch and learning rate.

Why this warm-up: copying is learnt abruptly (after ~100-150 steps of this recipe, like an induction-head phase
change), so a warm-up cut short to leave room for RL gives a start that depends on luck; a warm-up with the tool
on a random half of the chats makes greedy decoding call it nearly always (the tool token beats each single
digit).  Tying the demonstrator's tool use to a visible feature gives a stable, genuinely imperfect start.
Answers have 5 digits so that copying the result is one fixed offset (with 4- and 5-digit results the warm-up
copied 4-digit ones at 5% and RL plateaued near 75%).

Measured 2026-11-23 on the shared 2-core CPU (1-minute load 2.3-4.6), defaults, seeds 1, 2, 3: held-out greedy
accuracy after the warm-up 52.5 / 55.5 / 51.5% -- equal to the tool-call rate: every call's result is copied
right, every direct answer is wrong -- and 100% in all three from the first validation after RL starts (step 20),
tool calls 100%; the no-tool baseline stays at 0% (its sampled reward is 0 at every step, so GRPO has nothing to
work with).  265 / 341 / 308 s wall for both arms (219-249 CPU s): the tool arm's warm-up 79-106 s, its GRPO
134-200 s, the whole no-tool arm 33-63 s.

Both validate greedily (``val_kwargs``) on held-out prompts through the agent-loop path.  ``summary.json``
holds ``before`` (after the warm-up, before RL) / ``after`` accuracy and tool-call rate of the tool arm and the
baseline's accuracy; ``report.html`` shows the curves and held-out trajectories with the tool call, the
observation (masked) and the answer marked.

The tokenizer is the char-level one of ``hybridflow.utils.tiny_model`` with Qwen2.5's ``<tool_call>``-style
tags as whole (non-special) tokens, and the chat template is ChatML with tool results wrapped in
``<tool_response>`` inside a user turn as Qwen2.5's template does; it does not render the tool schemas into a
system turn (hundreds of characters a 0.4M model cannot read -- it learns the one tool from demonstrations).
"""

from __future__ import annotations

import json
import random
import resource
import time
from pathlib import Path
from typing import Any

from hybridflow.quickstart.addition import LiveLogger, grpo_overrides, held_out_rows, prepare_output

TASK = "multiplication"
VAL_KEY = f"val-core/synthetic/{TASK}/reward/mean@1"
VAL_TOOL_RATE = "val-aux/agent/tool_call_rate"
TRAIN_TOOL_RATE = "agent/tool_call_rate"
TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
TOOL_CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'tool' %}<|im_start|>user\n<tool_response>{{ m['content'] }}</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LARGE_FACTOR = 600  # the warm-up demonstrates the calculator mostly on questions whose first factor is this or more
TOOL_CONFIG = "tools:\n  - class_name: calculator\n    config: {type: native}\n"


def tool_call_text(expression: str) -> str:
    """The hermes call the demonstrations teach (compact JSON: fewer characters to generate)."""
    body = json.dumps({"name": "calculator", "arguments": {"expression": expression}}, separators=(",", ":"))
    return f"<tool_call>{body}</tool_call>"


def build_tool_model(path: Path, seed: int, size: str = "tiny") -> str:
    """Random-init char model whose tokenizer knows the tool tags and the tool chat template."""
    from hybridflow.utils.tiny_model import build_char_tokenizer, build_tiny_model

    tok = build_char_tokenizer(chat_template=TOOL_CHAT_TEMPLATE, added_tokens=TOOL_TOKENS)
    model = build_tiny_model(tok, size=size, seed=seed)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def demonstrations(rows: list[dict], n: int, tool_rates: tuple[float, float], seed: int) -> list[dict]:
    """``n`` warm-up chats from the first training rows.  ``tool_rates = (small, large)``: the chance that a
    question whose first factor is below / at least ``LARGE_FACTOR`` demonstrates the calculator (call, result,
    answer copied from it); the other chats answer directly, as the no-tool baseline's (``(0, 0)``) all do."""
    rng = random.Random(f"tool-demos:{seed}")
    chats = []
    for row in rows[:n]:
        question, answer = row["prompt"][0]["content"], row["reward_model"]["ground_truth"]
        rate = tool_rates[int(question.split("*")[0]) >= LARGE_FACTOR]
        messages = [{"role": "user", "content": question}]
        if rng.random() < rate:
            messages += [{"role": "assistant", "content": tool_call_text(question)},
                         {"role": "tool", "content": answer}]
        messages.append({"role": "assistant", "content": answer})
        chats.append({"messages": messages})
    return chats


def warm_up(base: str, chats: list[dict], out_dir: Path, steps: int, seed: int, lr: float, tag: str):
    """Multi-turn SFT (loss on assistant turns only; tool results are never trained on)."""
    from hybridflow.sft.trainer import load_sft_config, run_sft

    cfg = load_sft_config([
        f"model.partial_pretrain={base}", "data.multiturn.enable=true", "data.train_batch_size=64",
        "data.micro_batch_size_per_gpu=64", "data.max_length=128", f"optim.lr={lr}", "optim.lr_scheduler=constant",
        "optim.weight_decay=0.0", f"trainer.total_training_steps={steps}", f"trainer.default_local_dir={out_dir}",
        f"trainer.seed={seed}",
    ])

    def show(step: int, m: dict[str, float]) -> None:
        if step % 50 == 0 or step == steps:
            print(f"[{tag} sft] step {step}/{steps}  loss {m['train/loss']:.3f}", flush=True)

    result = run_sft(cfg, rows=chats, on_step=show)
    return result.hf_dir, result.seconds


def arm_overrides(model: str, data_dir: Path, out_dir: Path, backend: str, steps: int, seed: int, lr: float,
                  test_freq: int, batch_size: int, n: int, use_tool: bool) -> list[str]:
    """The quickstart's GRPO overrides sized for this task, plus the tool agent for the tool arm."""
    a = "actor_rollout_ref"
    overrides = grpo_overrides(model, data_dir, out_dir, backend, steps, seed, lr, test_freq) + [
        "data.max_prompt_length=32", f"data.max_response_length={96 if use_tool else 8}",
        f"data.train_batch_size={batch_size}", f"{a}.actor.ppo_mini_batch_size={batch_size}",
        f"{a}.rollout.n={n}", f"{a}.actor.ppo_micro_batch_size_per_gpu={batch_size * n}",
        f"{a}.rollout.log_prob_micro_batch_size_per_gpu={batch_size * n}",
        f"trainer.experiment_name={TASK}_{'tool' if use_tool else 'no_tool'}_grpo",
        "trainer.log_val_generations=6", f"{a}.rollout.agent.num_workers=1",
        "trainer.report=false",  # one report for both arms, written at the end
    ]
    if use_tool:
        tools = out_dir / "tools.yaml"
        tools.parent.mkdir(parents=True, exist_ok=True)
        tools.write_text(TOOL_CONFIG)
        m = f"{a}.rollout.multi_turn"
        overrides += [f"{m}.enable=true", f"{m}.tool_config_path={tools}", f"{m}.format=hermes",
                      f"{m}.max_assistant_turns=2", f"{m}.max_parallel_calls=1", f"{m}.max_tool_response_length=32"]
    return overrides


def run_arm(name: str, base: str, chats: list[dict], data_dir: Path, out: Path, backend: str, sft_steps: int,
            sft_lr: float, rl_steps: int, rl_lr: float, test_freq: int, batch_size: int, n: int, seed: int,
            use_tool: bool, overrides: tuple[str, ...] = ()) -> dict[str, Any]:
    """Warm-up + GRPO of one arm in ``out``; returns its validation history, samples and times."""
    from hybridflow.launch.config import load_config
    from hybridflow.tracking import Tracking
    from hybridflow.trainer.main_ppo import train_ppo

    cpu0 = cpu_seconds()
    sft_dir, sft_seconds = warm_up(base, chats, out / "sft", sft_steps, seed, sft_lr, name)
    cpu1 = cpu_seconds()
    config = load_config(arm_overrides(sft_dir, data_dir, out, backend, rl_steps, seed, rl_lr, test_freq,
                                       batch_size, n, use_tool) + list(overrides))
    start = time.perf_counter()
    tracking = Tracking("quickstart", f"{TASK}_{name}", default_backend=["file"], output_dir=out, total_steps=rl_steps)
    extra = ((TRAIN_TOOL_RATE, "tool calls"), (VAL_TOOL_RATE, "held-out tool calls")) if use_tool else ()
    history = train_ppo(config, logger=LiveLogger(tracking, rl_steps, start, VAL_KEY, name, extra))
    vals = [m for m in history.metrics if VAL_KEY in m]
    return {"history": history, "vals": vals, "sft_seconds": sft_seconds, "rl_seconds": time.perf_counter() - start,
            "sft_cpu_seconds": cpu1 - cpu0, "rl_cpu_seconds": cpu_seconds() - cpu1}


_TIMES = ("sft_seconds", "rl_seconds", "sft_cpu_seconds", "rl_cpu_seconds")


def _point(record: dict[str, Any], use_tool: bool) -> dict[str, Any]:
    point = {"accuracy": record[VAL_KEY], "step": int(record["step"])}
    if use_tool:
        point["tool_call_rate"] = record.get(VAL_TOOL_RATE, 0.0)
    return point


def cpu_seconds() -> float:
    """CPU time of this process and its finished children (what the neighbours on a shared machine cannot inflate)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def run_tool_use_quickstart(output_dir: str = "outputs/quickstart_tool_use", backend: str = "local", seed: int = 1,
                            model_size: str = "tiny", train_size: int = 4000, test_size: int = 200, demos: int = 512,
                            tool_rates: tuple[float, float] = (0.1, 0.9), sft_steps: int = 200, sft_lr: float = 2e-3,
                            rl_steps: int = 60, rl_lr: float = 3e-4, test_freq: int = 20, batch_size: int = 16,
                            n: int = 8, baseline: bool = True, overrides: tuple[str, ...] = ()) -> dict[str, Any]:
    """Run both arms and return the summary written to ``output_dir/summary.json`` (see the module doc)."""
    from hybridflow.tracking.report import write_report

    t0, cpu0 = time.perf_counter(), cpu_seconds()
    train_rows, test_rows = held_out_rows(train_size, test_size, seed, task=TASK)
    out, data_dir = prepare_output(output_dir, train_rows, test_rows)
    base = build_tool_model(out / "base_model", seed, model_size)
    print(f"[quickstart] tiny model + multiplication task + calculator tool ready in {out}", flush=True)
    common = dict(data_dir=data_dir, backend=backend, sft_steps=sft_steps, sft_lr=sft_lr, rl_steps=rl_steps,
                  rl_lr=rl_lr, test_freq=test_freq, batch_size=batch_size, n=n, seed=seed, overrides=overrides)
    tool = run_arm("tool", base, demonstrations(train_rows, demos, tool_rates, seed), out=out / "tool",
                   use_tool=True, **common)
    summary: dict[str, Any] = {
        "task": f"synthetic/{TASK}: 3-digit x 2-digit products, calculator tool via tool_agent",
        "before": _point(tool["vals"][0], True),
        "after": _point(tool["vals"][-1], True),
    }
    if baseline:
        plain = run_arm("no_tool", base, demonstrations(train_rows, demos, (0.0, 0.0), seed), out=out / "no_tool",
                        use_tool=False, **common)
        summary["no_tool_baseline"] = {"before_accuracy": plain["vals"][0][VAL_KEY], **_point(plain["vals"][-1], False),
                                       **{k: plain[k] for k in _TIMES}}
    summary.update({
        "steps": int(tool["vals"][-1]["step"]), "seconds": time.perf_counter() - t0,
        "cpu_seconds": cpu_seconds() - cpu0,
        **{k: tool[k] for k in _TIMES}, "seed": seed, "backend": backend,
        "recipe": {"model_size": model_size, "demos": demos, "tool_rates": list(tool_rates), "sft_steps": sft_steps,
                   "sft_lr": sft_lr, "rl_steps": rl_steps, "rl_lr": rl_lr, "batch_size": batch_size, "n": n},
    })
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    history = tool["history"]
    write_report(out, history.metrics, history.samples, summary=summary,
                 title="hybridflow quickstart: GRPO teaches a tiny model to use a calculator")
    b, a = summary["before"], summary["after"]
    line = (f"[quickstart] held-out accuracy (greedy) with the tool: before RL {100 * b['accuracy']:.1f}% -> after "
            f"{100 * a['accuracy']:.1f}%; tool calls {100 * b['tool_call_rate']:.0f}% -> "
            f"{100 * a['tool_call_rate']:.0f}%")
    if baseline:
        line += f"; no-tool baseline {100 * summary['no_tool_baseline']['accuracy']:.1f}%"
    print(line + f"   ({summary['seconds']:.0f}s total, {summary['cpu_seconds']:.0f} CPU s)", flush=True)
    print(f"[quickstart] report: {out / 'report.html'}", flush=True)
    return summary


__all__ = ["run_tool_use_quickstart", "demonstrations", "tool_call_text", "build_tool_model", "TOOL_CHAT_TEMPLATE"]
