"""``hybridflow data geo3k`` on a local copy in hiyouga/geometry3k's layout, then the dataset and the scorer."""

from __future__ import annotations

import io

import pytest
from PIL import Image, ImageDraw

from hybridflow.data.io import DataFileError, read_rows, write_parquet
from hybridflow.rewards.scorers import default_compute_score


def _diagram(seed: int) -> bytes:
    img = Image.new("RGB", (48, 40), "white")
    ImageDraw.Draw(img).polygon([(4, 36), (44, 36), (4 + seed % 30, 4)], outline="black")
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture
def geo3k_source(tmp_path):
    """A 3+2-row local copy of hiyouga/geometry3k (what ``datasets`` writes: images as bytes/path dicts)."""
    src = tmp_path / "geometry3k"
    answers = ["3\\sqrt{3}", "60", "\\frac{2}{3}", "12.5", "8"]
    rows = [{"problem": f"<image>Find x in triangle {i}.", "answer": a, "images": [{"bytes": _diagram(i), "path": None}]}
            for i, a in enumerate(answers)]
    write_parquet(rows[:3], str(src / "train.parquet"))
    write_parquet(rows[3:], str(src / "test.parquet"))
    return src


def test_geo3k_cli_writes_verl_rows_the_vlm_dataset_reads(geo3k_source, tmp_path, tiny_vlm_dir, data_cfg):
    from hybridflow.cli import main as cli_main
    from hybridflow.data.rl_dataset import RLHFDataset
    from hybridflow.utils.hf_processor import load_processor

    out = tmp_path / "geo3k"
    assert cli_main(["data", "geo3k", "--input", str(geo3k_source), "--local-dir", str(out)]) == 0
    rows = read_rows(str(out / "train.parquet"))
    assert len(rows) == 3 and len(read_rows(str(out / "test.parquet"))) == 2
    row = rows[0]
    assert row["data_source"] == "hiyouga/geometry3k" and row["ability"] == "math"
    assert row["prompt"][0]["content"].startswith("<image>Find x in triangle 0. You FIRST think")
    assert row["reward_model"] == {"style": "rule", "ground_truth": "3\\sqrt{3}"}
    assert row["images"][0]["bytes"] == _diagram(0)
    processor = load_processor(tiny_vlm_dir)
    data_cfg.max_prompt_length = 512
    ds = RLHFDataset(str(out / "train.parquet"), processor.tokenizer, data_cfg, processor=processor)
    item = ds[2]
    assert item["multi_modal_inputs"]["image_grid_thw"].tolist() == [[1, 4, 6]]  # 40x48 -> 32x48 in 8-px patches
    assert sum(t == processor.image_token_id for t in item["raw_prompt_ids"]) == 6


def test_geo3k_refuses_rows_whose_markers_and_images_disagree(tmp_path):
    from hybridflow.data.preprocess.geo3k import preprocess_geo3k

    src = tmp_path / "bad"
    row = {"problem": "Find x.", "answer": "1", "images": [{"bytes": _diagram(0), "path": None}]}
    write_parquet([row], str(src / "train.parquet"))
    write_parquet([row], str(src / "test.parquet"))
    with pytest.raises(DataFileError, match="train row 0: the problem has 0 <image> marker\\(s\\) but 1 image"):
        preprocess_geo3k(str(src), str(tmp_path / "out"))


@pytest.mark.parametrize("response,truth,score", [
    ("<think>angles sum to 180</think> so x is \\boxed{60}", "60", 1.0),
    ("<think>r</think> x = \\boxed{3\\sqrt{3}}", "3\\sqrt{3}", 1.0),
    ("<think>r</think> \\boxed{\\dfrac{2}{3}}", "\\frac{2}{3}", 1.0),
    ("x is \\boxed{60}", "60", 0.9),  # right answer, no <think> block
    ("<think>r</think> \\boxed{61}", "60", 0.1),  # format only
    ("60", "60", 0.0),  # no box: not graded
])
def test_geo3k_scorer(response, truth, score):
    assert default_compute_score("hiyouga/geometry3k", response, truth) == pytest.approx(score)


def test_vision_task_scorers_are_exact():
    assert default_compute_score("synthetic/vision_shape_color", " red ", "red") == 1.0
    assert default_compute_score("synthetic/vision_shape_color", "red.", "red") == 0.0
    assert default_compute_score("synthetic/vision_shape_count", "3", "3") == 1.0
