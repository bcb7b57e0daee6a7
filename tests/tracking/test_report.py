"""report.html: embedded PNG plots for the metrics that exist, last-metrics table, escaped samples, atomic write."""

from __future__ import annotations

import base64
import json
import re

from hybridflow.tracking.report import PLOT_PANELS, load_history, load_samples, panel_figure, write_report
from hybridflow.tracking.tracking import Tracking
from hybridflow.tracking.units import unit_of


def _history(n: int = 3) -> list[dict]:
    hist = []
    for step in range(1, n + 1):
        hist.append({
            "step": step,
            "critic/score/mean": 0.1 * step,
            "critic/rewards/mean": 0.1 * step,
            "response_length/mean": 10.0 + step,
            "actor/ppo_kl": 0.01 * step,
            "actor/kl_loss": 0.02 * step,
            "actor/entropy": 2.0 - 0.1 * step,
            "perf/throughput": 500.0,
            "timing_s/gen": 1.0,
            "timing_s/step": 3.0,
        })
    hist[-1]["val-core/arith/acc/mean@4"] = 0.5
    return hist


def _images(text: str) -> dict[str, bytes]:
    found = re.findall(r"<img alt='([^']+)' src='data:image/png;base64,([A-Za-z0-9+/=]+)'>", text)
    return {alt: base64.b64decode(data) for alt, data in found}


def test_report_plots_tables_and_escaped_samples(tmp_path):
    samples = [
        {"step": 3, "prompt": "What is 2<3? <script>alert('x')</script>", "response": "yes & <b>sure</b>",
         "score": 1.0},
        {"step": 3, "prompt": "plain", "response": "text", "score": 0.0},
    ]
    path = write_report(tmp_path, _history(), samples, summary={"accuracy after": 0.6, "before": {"accuracy": 0.1}})
    assert path == tmp_path / "report.html"
    text = path.read_text()
    images = _images(text)
    expected = {"Score and reward", "Response length", "KL", "Entropy", "Throughput", "Time per stage", "Validation"}
    assert set(images) == expected
    assert all(png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 1000 for png in images.values())
    assert "<script>alert" not in text and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in text
    assert "yes &amp; &lt;b&gt;sure&lt;/b&gt;" in text
    assert "<td>accuracy after</td><td>0.6</td>" in text
    assert "<td>before / accuracy</td><td>0.1</td>" in text  # nested summaries are flattened
    # last-metrics table: every metric with its last value
    assert "<td>val-core/arith/acc/mean@4</td><td>3</td><td>0.5</td>" in text
    assert "<td>actor/entropy</td><td>3</td><td>1.7</td>" in text
    assert [p.name for p in tmp_path.iterdir()] == ["report.html"]  # no temp file left behind


def test_multi_turn_samples_mark_model_tokens_observations_and_tool_calls(tmp_path):
    call = '<tool_call>{"name":"calculator","arguments":{"expression":"1<2"}}</tool_call><|im_end|>'
    segments = [[call, 1], ["\n<|im_start|>user\n<tool_response>True</tool_response><|im_end|>\n", 0],
                ["<tool_call>{unclosed", 1]]
    samples = [{"step": 2, "prompt": "q", "response": "ignored when segments exist", "score": 1.0,
                "segments": segments},
               {"step": 2, "prompt": "q2", "response": "plain <answer>", "score": 0.0}]
    text = write_report(tmp_path, _history(), samples).read_text()
    assert ("<span class='model' title='model tokens (trained)'><span class='call'>&lt;tool_call&gt;{&quot;name&quot;:"
            "&quot;calculator&quot;,&quot;arguments&quot;:{&quot;expression&quot;:&quot;1&lt;2&quot;}}&lt;/tool_call&gt;"
            "</span>&lt;|im_end|&gt;</span>") in text
    assert ("<span class='obs' title='observation (response_mask 0, not trained)'>\n&lt;|im_start|&gt;user\n"
            "&lt;tool_response&gt;True&lt;/tool_response&gt;&lt;|im_end|&gt;\n</span>") in text
    # an unclosed call is not highlighted (no dangling span), and plain samples render as before
    assert "<span class='model' title='model tokens (trained)'>&lt;tool_call&gt;{unclosed</span>" in text
    assert "<pre>plain &lt;answer&gt;</pre>" in text and "ignored when segments exist" not in text
    assert "class='legend'" in text
    assert text.count("<span") == text.count("</span>")


def test_report_with_one_step_and_missing_metrics(tmp_path):
    path = write_report(tmp_path, [{"step": 5, "critic/score/mean": 0.3}], [])
    text = path.read_text()
    assert set(_images(text)) == {"Score and reward"}
    assert "No sample generations" in text
    # nothing at all still gives a valid page
    empty = write_report(tmp_path / "empty", [], []).read_text()
    assert "No plottable metrics" in empty and empty.rstrip().endswith("</html>")


def test_report_overwrites_atomically(tmp_path):
    write_report(tmp_path, [{"step": 1, "actor/entropy": 1.0}], [])
    write_report(tmp_path, [{"step": 1, "actor/entropy": 1.0}, {"step": 2, "actor/entropy": 0.9}], [])
    assert "steps 1–2" in (tmp_path / "report.html").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]


def test_load_history_merges_steps_and_skips_torn_last_line(tmp_path):
    f = tmp_path / "metrics.jsonl"
    lines = [
        json.dumps({"step": 1, "critic/score/mean": 0.1}),
        json.dumps({"step": 2, "critic/score/mean": 0.2}),
        json.dumps({"step": 2, "val-core/a/acc/mean@1": 0.7}),  # validation logged separately for the same step
        '{"step": 3, "critic/sc',  # a run killed mid-write
    ]
    f.write_text("\n".join(lines))
    hist = load_history(f)
    assert hist == [
        {"step": 1, "critic/score/mean": 0.1},
        {"step": 2, "critic/score/mean": 0.2, "val-core/a/acc/mean@1": 0.7},
    ]


def test_tracking_file_backend_to_report_end_to_end(tmp_path):
    with Tracking("p", "e", ["file"], output_dir=tmp_path) as tr:
        for step in (1, 2):
            tr.log({"critic/score/mean": 0.5 * step, "actor/entropy": 1.0 / step, "lr": 1e-6}, step=step)
        tr.log_generations([{"prompt": "1+2=", "response": "3", "score": 1.0}], step=3)
    hist = load_history(tmp_path / "metrics.jsonl")
    assert hist == tr.history
    samples = load_samples(tmp_path / "generations.jsonl")
    text = write_report(tmp_path, hist, samples).read_text()
    assert "1+2=" in text and set(_images(text)) == {"Score and reward", "Entropy"}


def test_failures_get_a_warning_box_with_counts_and_the_stopping_error(tmp_path):
    hist = _history(3)
    for rec in hist:
        rec.update({"rollout/failed_fraction": 0.0, "reward/error_fraction": 0.0})
    assert "class='failures'" not in write_report(tmp_path, hist, []).read_text()  # nothing failed: no box
    hist[0].update({"reward/error_fraction": 0.25, "reward/error_count": 2.0, "reward/timeout_count": 1.0})
    hist[2].update({"reward/error_fraction": 0.125, "reward/error_count": 1.0, "reward/timeout_count": 0.0})
    text = write_report(tmp_path, hist, [], error="the run stopped: all 8 <trajectories>").read_text()
    box = text[text.index("class='failures'"):text.index("<h2>Curves</h2>")]  # above the curves
    assert "rewards could not be scored (error or timeout)</b>: in 2 step(s) (1, 3), 4 in all, at worst 25%" in box
    assert "trajectories failed" not in box  # only what failed is listed
    assert "The run stopped with an error" in box and "all 8 &lt;trajectories&gt;" in box


def test_time_panels_draw_durations_only():
    """A length logged under ``timing_s/`` (as verl, and earlier hybridflow runs, do for the slowest trajectory)
    stays out of both time panels; stages and agent-loop timings get a panel each."""
    from hybridflow.tracking.report import _panel_keys

    rec = {"step": 1, "timing_s/gen": 1.0, "timing_s/step": 2.0, "timing_s/agent_loop/generate_sequences/mean": 0.5,
           "timing_s/agent_loop/slowest/tool_calls": 0.1, "timing_s/agent_loop/slowest/prompt_length": 31.0,
           "timing_s/agent_loop/slowest/response_length": 12.0, "agent_loop/slowest/prompt_length": 31.0}
    panels = {title: patterns for title, _, patterns in PLOT_PANELS}
    assert _panel_keys([rec], panels["Time per stage"], "Time per stage") == ["timing_s/gen", "timing_s/step"]
    agent = "Agent-loop time per trajectory"
    assert _panel_keys([rec], panels[agent], agent) == ["timing_s/agent_loop/generate_sequences/mean",
                                                        "timing_s/agent_loop/slowest/tool_calls"]


def test_every_panel_label_is_the_unit_of_its_metrics():
    for title, ylabel, patterns in PLOT_PANELS:
        for pattern in patterns:
            unit = unit_of(pattern.rstrip("*"))
            assert unit in (None, ylabel), f"panel {title!r} labels its axis {ylabel!r}, but {pattern} is in {unit}"


def test_the_legend_sits_outside_the_axes():
    keys = ["timing_s/gen", "timing_s/old_log_prob", "timing_s/update_actor", "timing_s/update_weights",
            "timing_s/step"]
    history = [{"step": s, **{k: 0.1 * i * s for i, k in enumerate(keys)}} for s in range(1, 6)]
    fig = panel_figure("Time per stage", "seconds", history, keys)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)  # what savefig(png) renders with: the extents below are the drawn ones
    canvas.draw()
    renderer = canvas.get_renderer()
    ax = fig.axes[0]
    legend, axes_box = ax.get_legend().get_window_extent(renderer), ax.get_window_extent(renderer)
    assert legend.x0 >= axes_box.x1  # right of the plotting area: it covers no line
    assert legend.x1 <= fig.bbox.x1 and legend.y0 >= fig.bbox.y0  # and inside the image, not cut off
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["gen", "old_log_prob", "update_actor", "update_weights", "step"]  # the shared prefix once,
    assert ax.get_legend().get_title().get_text() == "timing_s/"  # as the legend's title
