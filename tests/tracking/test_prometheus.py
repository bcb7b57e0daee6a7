"""``trainer.logger=[...,prometheus]``: the driver's /metrics endpoint, read back with prometheus_client's parser.

The unit tests drive the logger through ``Tracking`` on a free loopback port; the run test scrapes a real 3-step
GRPO run between its steps."""

from __future__ import annotations

import urllib.request

import pytest

pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from hybridflow.tracking import Tracking  # noqa: E402

CONFIG = {"trainer": {"prometheus": {"host": "127.0.0.1", "port": 0, "drift_threshold": 0.1}},
          "data": {"train_batch_size": 4}, "actor_rollout_ref": {"rollout": {"n": 2}}}


def scrape(url: str) -> dict[str, list]:
    """name -> [(labels, value)] of every hybridflow sample on the page."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("hybridflow_") and not s.name.endswith("_created"):
                out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def value(page, metric, **labels) -> float:
    hits = [v for lab, v in page[metric] if all(lab.get(k) == w for k, w in labels.items())]
    assert len(hits) == 1, (metric, labels, page.get(metric))
    return hits[0]


def test_counters_accumulate_gauges_show_the_latest_step_with_run_step_worker_labels(tmp_path):
    with Tracking("proj", "exp", ["prometheus"], config=CONFIG, output_dir=tmp_path) as tr:
        prom = tr.loggers["prometheus"]
        assert prom.server.server_address[0] == "127.0.0.1"  # loopback unless trainer.prometheus.host says otherwise
        tr.log({"timing_s/step": 1.5, "perf/total_num_tokens": 100, "agent/error_count": 1.0,
                "training/rollout_probs_diff_max": 0.3, "training/rollout_probs_diff_mean": 0.01,
                "perf/cpu_memory_used_gb": 1.25, "critic/score/mean": 0.5}, step=1)
        page = scrape(prom.url)
        assert value(page, "hybridflow_metric", name="critic/score/mean", step="1") == 0.5
        tr.log({"timing_s/step": 1.4, "perf/total_num_tokens": 120, "reward/timeout_count": 2.0,
                "agent/tool_errors/timeout": 3.0, "training/rollout_probs_diff_max": 0.05,
                "training/staleness/mean": 0.5, "training/staleness/max": 1.0, "perf/cpu_memory_used_gb": 1.5,
                "critic/score/mean": 0.75}, step=2)
        tr.log({"val-core/addition/acc/mean@1": 0.4}, step=2)  # validation of the same step: kept beside it
        page = scrape(prom.url)
    run = {"run": "proj/exp", "worker": "driver"}
    assert value(page, "hybridflow_samples_total", **run) == 2 * 4 * 2
    assert value(page, "hybridflow_tokens_total", **run) == 220
    assert {lab["kind"]: v for lab, v in page["hybridflow_failures_total"]} == {
        "agent_loop": 1, "reward_error": 0, "reward_timeout": 2, "tool": 3}
    assert value(page, "hybridflow_drift_steps_total", **run) == 1  # 0.3 > 0.1 counted, 0.05 not
    assert value(page, "hybridflow_step", **run) == 2
    assert value(page, "hybridflow_memory_gib", kind="cpu_rss", step="2", **run) == 1.5
    assert value(page, "hybridflow_staleness", stat="max", step="2", **run) == 1.0
    assert value(page, "hybridflow_logprob_drift", stat="max", step="2", **run) == 0.05
    assert value(page, "hybridflow_metric", name="val-core/addition/acc/mean@1", step="2", **run) == 0.4
    assert value(page, "hybridflow_metric", name="critic/score/mean", step="2", **run) == 0.75
    steps = {lab["step"] for name in ("hybridflow_metric", "hybridflow_memory_gib") for lab, _ in page[name]}
    assert steps == {"2"}  # step 1's gauge series are gone
    with pytest.raises(OSError):  # finish() closed the endpoint
        urllib.request.urlopen(prom.url, timeout=5)


def test_a_port_in_use_names_the_key(tmp_path):
    with Tracking("p", "a", ["prometheus"], config=CONFIG, output_dir=tmp_path) as first:
        taken = {**CONFIG, "trainer": {"prometheus": {**CONFIG["trainer"]["prometheus"],
                                                      "port": first.loggers["prometheus"].port}}}
        with pytest.raises(RuntimeError, match="trainer.prometheus.port"):
            Tracking("p", "b", ["prometheus"], config=taken, output_dir=tmp_path)


def test_prometheus_keys_without_the_logger_are_refused_at_config_time():
    from hybridflow.config import ConfigError
    from hybridflow.launch.config import load_config

    base = ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8", "critic.ppo_micro_batch_size_per_gpu=8"]
    with pytest.raises(ConfigError, match="trainer.logger has no 'prometheus'"):
        load_config([*base, "trainer.prometheus.port=9500"])
    with pytest.raises(ConfigError, match="trainer.prometheus.port=70000"):
        load_config([*base, "trainer.logger=[prometheus]", "trainer.prometheus.port=70000"])
    assert load_config([*base, "trainer.logger=[console,prometheus]", "trainer.prometheus.port=0"]).trainer.prometheus.port == 0
