"""Built-in synthetic visual tasks drawn with Pillow, with exact rule rewards, for tiny vision-language models.

Each row is a verl multimodal row: one small RGB image stored as ``{"bytes": <PNG>, "path": None}`` in the
``images`` column (what ``datasets`` writes for an ``Image`` feature) and a prompt with one ``<image>`` marker.

* ``shape_color`` -- one filled shape (square, disc or triangle) of one of four colours at a random place and
  size on a grey canvas: "What colour is the shape?" -> ``red`` | ``green`` | ``blue`` | ``yellow``.
* ``shape_count`` -- 1 to 4 non-overlapping filled squares of random colours: "How many shapes?" -> ``1``..``4``.

The answer is a function of the pixels only (the question text never varies within a task), so a model that
beats chance must be reading the image. Scored by exact match (``synthetic/vision_*`` in ``rewards/scorers``).
"""

from __future__ import annotations

import io
import os
import random
from dataclasses import dataclass
from typing import Callable

from hybridflow.data.io import write_parquet
from hybridflow.utils.registry import Registry

__all__ = ["VISION_TASKS", "VisionTask", "COLORS", "draw_shape", "make_vision_rows", "write_vision_task"]

COLORS = {"red": (220, 40, 40), "green": (40, 180, 60), "blue": (50, 70, 220), "yellow": (230, 210, 40)}
_BACKGROUND = (128, 128, 128)
VISION_TASKS: Registry["VisionTask"] = Registry("synthetic vision task")


def draw_shape(draw, kind: str, box: tuple[int, int, int, int], fill: tuple[int, int, int]) -> None:
    x0, y0, x1, y1 = box
    if kind == "square":
        draw.rectangle(box, fill=fill)
    elif kind == "disc":
        draw.ellipse(box, fill=fill)
    else:
        draw.polygon([((x0 + x1) // 2, y0), (x1, y1), (x0, y1)], fill=fill)


def _png(img) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _color_example(rng: random.Random, size: int):
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (size, size), _BACKGROUND)
    name = rng.choice(sorted(COLORS))
    side = rng.randint(size // 3, size * 3 // 4)
    x, y = rng.randint(0, size - side), rng.randint(0, size - side)
    draw_shape(ImageDraw.Draw(img), rng.choice(("square", "disc", "triangle")), (x, y, x + side - 1, y + side - 1),
               COLORS[name])
    return img, "What colour is the shape?", name


def _count_example(rng: random.Random, size: int):
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (size, size), _BACKGROUND)
    draw = ImageDraw.Draw(img)
    n = rng.randint(1, 4)
    cell = size // 2  # four quadrants, one shape at most in each: shapes never overlap
    for q in rng.sample(range(4), n):
        side = rng.randint(cell // 2, cell - 2)
        x = (q % 2) * cell + rng.randint(0, cell - side)
        y = (q // 2) * cell + rng.randint(0, cell - side)
        draw.rectangle((x, y, x + side - 1, y + side - 1), fill=COLORS[rng.choice(sorted(COLORS))])
    return img, "How many shapes?", str(n)


@dataclass(frozen=True)
class VisionTask:
    name: str
    example: Callable[[random.Random, int], tuple]

    @property
    def data_source(self) -> str:
        return f"synthetic/vision_{self.name}"

    def make_rows(self, n: int, seed: int, split: str, size: int = 32) -> list[dict]:
        """``n`` verl rows; the same ``(seed, split, size)`` always gives the same rows (and PNG bytes)."""
        if n <= 0:
            raise ValueError(f"number of synthetic rows must be positive, got {n}")
        rng = random.Random(f"vision:{self.name}:{split}:{seed}")
        rows = []
        for i in range(n):
            img, question, answer = self.example(rng, size)
            rows.append({
                "data_source": self.data_source,
                "prompt": [{"role": "user", "content": f"<image>{question}"}],
                "images": [{"bytes": _png(img), "path": None}],
                "ability": "vision",
                "reward_model": {"style": "rule", "ground_truth": answer},
                "extra_info": {"split": split, "index": i},
            })
        return rows


for _task in (VisionTask("shape_color", _color_example), VisionTask("shape_count", _count_example)):
    VISION_TASKS.register(_task.name, _task)


def make_vision_rows(task: str, n: int, seed: int, split: str, size: int = 32) -> list[dict]:
    return VISION_TASKS.get(task).make_rows(n, seed, split, size)


def write_vision_task(task: str, local_dir: str, train_size: int = 1000, test_size: int = 100, seed: int = 0,
                      size: int = 32) -> dict[str, str]:
    """Write ``train.parquet`` / ``test.parquet`` of ``task`` into ``local_dir``; returns the paths."""
    spec = VISION_TASKS.get(task)
    return {split: write_parquet(spec.make_rows(n, seed, split, size), os.path.join(local_dir, f"{split}.parquet"))
            for split, n in (("train", train_size), ("test", test_size))}
