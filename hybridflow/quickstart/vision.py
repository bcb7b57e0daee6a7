"""``hybridflow quickstart --task vision``: a tiny vision-language model learns, with GRPO, to name a shape's colour.

The task (``synthetic/vision_shape_color``, :mod:`hybridflow.data.vision_task`): a 32x32 picture of one filled
square, disc or triangle in red, green, blue or yellow at a random place and size on a grey canvas, and the
fixed question "What colour is the shape?". The text never varies, so only the pixels tell the answer
(chance: 25%).

1. builds a tiny Qwen2-VL-architecture model from a config (:mod:`hybridflow.utils.tiny_vlm`: the char-level
   ``tiny`` language model, a 2-block vision tower, 8x8 patches merged 2x2 -- a 32x32 image is 4 prompt
   tokens) with its processor, and a bare chat template (image, question, newline) so prompts are ~32 tokens;
2. writes the task as verl multimodal parquet (PNG bytes in the ``images`` column, ``<image>`` in the prompt);
3. warms it up with a short supervised run (:func:`warm_up_vision`) whose answers are *shuffled* across the
   pictures: the model learns to answer with a colour word and EOS, and nothing about the pictures (it starts
   near chance). A warm-up on the true answers reaches 100% in ~60 steps, leaving RL nothing to do;
4. runs GRPO through the real framework (``main_ppo.train_ppo``: the dataset renders prompts with the
   processor, the hf rollout prefills the pixels with M-RoPE positions, the actor recomputes log-probs with
   the same pixels), validating greedily on held-out pictures;
5. writes ``summary.json`` (``before`` / ``after`` held-out accuracy, seconds) and ``report.html`` with the
   curves and a gallery of held-out pictures with the answers of the warmed-up and the trained model.

Measured numbers are in docs/vision.md.
"""

from __future__ import annotations

import base64
import json
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from hybridflow.quickstart.addition import LiveLogger, grpo_overrides, prepare_output

TASK = "shape_color"
DATA_SOURCE = f"synthetic/vision_{TASK}"
VAL_KEY = f"val-core/{DATA_SOURCE}/reward/mean@1"
VISION_TEMPLATE = (
    "{% for m in messages %}{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{% endfor %}{% if add_generation_prompt %}\n{% endif %}"
)


def build_vision_model(path: Path, seed: int, size: str = "tiny") -> str:
    """Random-init tiny Qwen2-VL + processor (image processor, char tokenizer, the bare template) in ``path``."""
    from hybridflow.utils.hf_processor import save_processor
    from hybridflow.utils.tiny_vlm import build_tiny_processor, build_tiny_vlm, build_vl_tokenizer

    tok = build_vl_tokenizer(chat_template=VISION_TEMPLATE)
    processor = build_tiny_processor(tok, chat_template=VISION_TEMPLATE)
    model = build_tiny_vlm(tok, size=size, seed=seed)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    save_processor(processor, str(path))
    return str(path)


def vision_rows(train_size: int, test_size: int, seed: int) -> tuple[list[dict], list[dict]]:
    """Train and held-out rows (different random pictures: each split has its own generator)."""
    from hybridflow.data.vision_task import make_vision_rows

    return make_vision_rows(TASK, train_size, seed, "train"), make_vision_rows(TASK, test_size, seed, "test")


def _row_image(row: dict):
    from hybridflow.data.multimodal import load_image

    return load_image(row["images"][0], "quickstart row", "images[0]")


def _prompt_text(processor, row: dict, image) -> str:
    from hybridflow.data.multimodal import build_messages

    return processor.apply_chat_template(build_messages(row["prompt"], [image], []), add_generation_prompt=True,
                                         tokenize=False)


def warm_up_answers(rows: list[dict], rng: random.Random, shuffle: bool = True) -> list[str]:
    """The warm-up's answer for each row: its own, or (``shuffle``) a permutation of all rows' answers."""
    truths = [row["reward_model"]["ground_truth"] for row in rows]
    return rng.sample(truths, len(truths)) if shuffle else truths


def warm_up_vision(base: str, rows: list[dict], out_dir: Path, steps: int, seed: int, lr: float,
                   batch_size: int = 32, shuffle_answers: bool = True) -> tuple[str, float]:
    """Supervised warm-up on (picture, question) -> answer + EOS, loss on the answer tokens only.

    ``shuffle_answers``: pair each picture with the answer of a random other row, so the warm-up teaches the
    answer *format* (a colour word, then EOS) and nothing about the pictures -- reading them is left to GRPO.

    A plain AdamW loop over the HF model (the SFT trainer is text-only): each batch is right-padded, with the
    pixel inputs concatenated in row order and M-RoPE positions from :mod:`hybridflow.data.mrope`.
    Returns the saved model folder (with its processor) and the seconds it took.
    """
    import torch
    from transformers import AutoModelForImageTextToText

    from hybridflow.data.mrope import spec_from_processor
    from hybridflow.utils.hf_processor import load_processor, save_processor

    start = time.perf_counter()
    torch.manual_seed(seed)
    processor = load_processor(base)
    model = AutoModelForImageTextToText.from_pretrained(base, dtype=torch.float32)
    spec = spec_from_processor(processor)
    rng = random.Random(f"vision-sft:{seed}")
    examples = _warm_up_examples(processor, rows, warm_up_answers(rows, rng, shuffle_answers))
    optim = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    model.train()
    for step in range(1, steps + 1):
        batch = rng.sample(examples, min(batch_size, len(examples)))
        loss = model(**_warm_up_inputs(batch, processor.tokenizer.pad_token_id, spec)).loss
        optim.zero_grad()
        loss.backward()
        optim.step()
        if step % 50 == 0 or step == steps:
            print(f"[sft] step {step}/{steps}  loss {loss.item():.3f}", flush=True)
    hf_dir = out_dir / "huggingface"
    model.save_pretrained(hf_dir)
    save_processor(processor, str(hf_dir))
    return str(hf_dir), time.perf_counter() - start


def _warm_up_examples(processor, rows: list[dict], answers: list[str]) -> list[tuple]:
    """(prompt ids, answer ids + EOS, pixel values, image grid) of each row: its picture and question rendered
    by the processor, answered with ``answers``."""
    tok = processor.tokenizer
    examples = []
    for row, truth in zip(rows, answers):
        image = _row_image(row)
        prompt = processor(text=[_prompt_text(processor, row, image)], images=[image], return_tensors="pt")
        answer = tok.encode(truth, add_special_tokens=False) + [tok.eos_token_id]
        examples.append((prompt["input_ids"][0].tolist(), answer, prompt["pixel_values"], prompt["image_grid_thw"]))
    return examples


def _warm_up_inputs(batch: list[tuple], pad_token_id: int, spec) -> dict:
    """The model's keyword arguments for a batch of examples: right-padded ids, labels on the answer tokens only,
    M-RoPE positions, and the pixel inputs concatenated in row order."""
    import torch

    from hybridflow.data.mrope import model_position_ids, vlm_position_ids

    width = max(len(p) + len(a) for p, a, _, _ in batch)
    ids = torch.full((len(batch), width), pad_token_id, dtype=torch.long)
    labels = torch.full_like(ids, -100)
    mask = torch.zeros_like(ids)
    for i, (p, a, _, _) in enumerate(batch):
        ids[i, : len(p) + len(a)] = torch.tensor(p + a)
        labels[i, len(p): len(p) + len(a)] = torch.tensor(a)
        mask[i, : len(p) + len(a)] = 1
    positions = torch.stack([vlm_position_ids(ids[i], mask[i], spec, batch[i][3]) for i in range(len(batch))])
    return {"input_ids": ids, "attention_mask": mask, "position_ids": model_position_ids(positions), "labels": labels,
            "pixel_values": torch.cat([x for _, _, x, _ in batch]),
            "image_grid_thw": torch.cat([g for _, _, _, g in batch])}


def vision_overrides(model: str, data_dir: Path, out_dir: Path, backend: str, steps: int, seed: int, lr: float,
                     test_freq: int, batch_size: int, n: int) -> list[str]:
    """The quickstart's GRPO overrides (:func:`~hybridflow.quickstart.addition.grpo_overrides`) sized for pictures,
    with a final checkpoint for the gallery."""
    a = "actor_rollout_ref"
    return grpo_overrides(model, data_dir, out_dir, backend, steps, seed, lr, test_freq) + [
        "data.max_prompt_length=40", "data.max_response_length=8", f"data.train_batch_size={batch_size}",
        f"{a}.rollout.temperature=1.0",  # exploration over the four colours (the text quickstart samples cooler)
        f"{a}.actor.ppo_mini_batch_size={batch_size}", f"{a}.rollout.n={n}",
        f"{a}.actor.ppo_micro_batch_size_per_gpu={batch_size * n}",
        f"{a}.rollout.log_prob_micro_batch_size_per_gpu={batch_size * n}",
        f"trainer.experiment_name=vision_{TASK}_grpo", f"trainer.save_freq={steps}",
        f"{a}.actor.checkpoint.save_contents=[hf_model]", "trainer.report=false",
    ]


def greedy_answers(model_dir: str, rows: list[dict]) -> list[str]:
    """The model's greedy answers to ``rows`` through the hf rollout engine (pixels + M-RoPE, as in training)."""
    import torch
    from transformers import AutoModelForImageTextToText

    from hybridflow.rollout.hf.engine import HFRolloutEngine
    from hybridflow.rollout.sampling_params import SamplingParams
    from hybridflow.utils.hf_processor import load_processor

    processor = load_processor(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()
    engine = HFRolloutEngine(model, processor.tokenizer, processor=processor)
    images = [_row_image(r) for r in rows]
    prompts = [processor(text=[_prompt_text(processor, r, im)], images=[im])["input_ids"][0] for r, im in
               zip(rows, images)]
    outs = engine.generate_batch([list(p) for p in prompts], SamplingParams(do_sample=False, max_tokens=8),
                                 [{"image": [im]} for im in images])
    return [processor.tokenizer.decode(o.token_ids, skip_special_tokens=True).strip() for o in outs]


def gallery_html(rows: list[dict], before: list[str], after: list[str]) -> str:
    """A table of held-out pictures (PNG, shown 3x) with the truth and both models' answers."""
    import html

    cells = []
    for row, b, a in zip(rows, before, after):
        png = base64.b64encode(bytes(row["images"][0]["bytes"])).decode()
        truth = row["reward_model"]["ground_truth"]
        mark = lambda s: f"<b style='color:{'#080' if s == truth else '#b00'}'>{html.escape(s) or '(empty)'}</b>"  # noqa: E731
        cells.append(f"<td style='text-align:center;padding:6px'><img width='96' height='96' "
                     f"style='image-rendering:pixelated' src='data:image/png;base64,{png}'><br>truth "
                     f"<b>{html.escape(truth)}</b><br>warm-up {mark(b)}<br>after GRPO {mark(a)}</td>")
    rows_html = "".join("<tr>" + "".join(cells[i: i + 6]) + "</tr>" for i in range(0, len(cells), 6))
    return ("<h2>Held-out pictures: greedy answers before and after GRPO</h2>"
            f"<table class='gallery'>{rows_html}</table>")


def add_report_section(report: Path, section: str) -> None:
    """Insert ``section`` (HTML) at the end of ``report``'s body, atomically."""
    text = report.read_text(encoding="utf-8")
    text = text.replace("</body></html>", section + "\n</body></html>")
    fd, tmp = tempfile.mkstemp(prefix=".report.", suffix=".html.tmp", dir=report.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, report)


def run_vision_quickstart(output_dir: str = "outputs/quickstart_vision", backend: str = "local", seed: int = 1,
                          train_size: int = 2000, test_size: int = 200, sft_steps: int = 100, sft_lr: float = 2e-3,
                          rl_steps: int = 120, rl_lr: float = 3e-4, test_freq: int = 20, batch_size: int = 16,
                          n: int = 8, gallery: int = 24, max_seconds: float | None = None,
                          overrides: tuple[str, ...] = ()) -> dict[str, Any]:
    """Run the whole demo and return the summary written to ``output_dir/summary.json`` (see the module doc)."""
    from hybridflow.launch.config import load_config
    from hybridflow.tracking import Tracking
    from hybridflow.tracking.report import write_report
    from hybridflow.trainer.main_ppo import train_ppo

    t0 = time.perf_counter()
    train_rows, test_rows = vision_rows(train_size, test_size, seed)
    out, data_dir = prepare_output(output_dir, train_rows, test_rows)
    base = build_vision_model(out / "base_model", seed)
    print(f"[quickstart] tiny vision-language model + shape-colour pictures ready in {out}", flush=True)
    sft_dir, sft_seconds = warm_up_vision(base, train_rows, out / "sft", sft_steps, seed, sft_lr)

    config = load_config(vision_overrides(sft_dir, data_dir, out, backend, rl_steps, seed, rl_lr, test_freq,
                                          batch_size, n) + list(overrides))
    rl_start = time.perf_counter()
    tracking = Tracking("quickstart", f"vision_{TASK}_grpo", default_backend=["file"], output_dir=out,
                        total_steps=rl_steps)
    stop = None if max_seconds is None else (lambda: time.perf_counter() - rl_start > max_seconds)
    history = train_ppo(config, logger=LiveLogger(tracking, rl_steps, rl_start, VAL_KEY, "grpo"), should_stop=stop)
    rl_seconds = time.perf_counter() - rl_start
    vals = [m for m in history.metrics if VAL_KEY in m]
    summary = {
        "task": f"{DATA_SOURCE}: name the colour of the shape in a 32x32 picture (chance 25%)",
        "before": {"accuracy": vals[0][VAL_KEY], "step": vals[0]["step"]},
        "after": {"accuracy": vals[-1][VAL_KEY], "step": vals[-1]["step"]},
        "steps": int(vals[-1]["step"]),
        "seconds": time.perf_counter() - t0,
        "sft_seconds": sft_seconds,
        "rl_seconds": rl_seconds,
        "seed": seed,
        "backend": backend,
        "load_average": os.getloadavg()[0],
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    report = write_report(out, history.metrics, history.samples, summary=summary,
                          title="hybridflow quickstart: GRPO teaches a tiny vision-language model to see colours")
    trained = out / "checkpoints" / f"global_step_{summary['steps']}" / "actor" / "huggingface"
    if gallery and trained.is_dir():
        shown = test_rows[:gallery]
        add_report_section(report, gallery_html(shown, greedy_answers(sft_dir, shown), greedy_answers(str(trained), shown)))
    print(f"[quickstart] held-out accuracy (greedy): before RL {100 * summary['before']['accuracy']:.1f}%  ->  "
          f"after {100 * summary['after']['accuracy']:.1f}%   ({summary['seconds']:.0f}s total)", flush=True)
    print(f"[quickstart] report: {report}", flush=True)
    return summary


__all__ = ["run_vision_quickstart", "build_vision_model", "warm_up_vision", "warm_up_answers", "vision_overrides", "VISION_TEMPLATE"]
