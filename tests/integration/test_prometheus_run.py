"""A real 4-step GRPO run with ``trainer.logger=[file,prometheus]``, its /metrics scraped between steps and parsed
with prometheus_client's parser: the counters grow with the steps, the gauges show the latest one."""

from __future__ import annotations

import urllib.request

import pytest

from run_helpers import small_overrides

pytest.importorskip("prometheus_client")


@pytest.mark.slow
def test_a_running_trainer_serves_its_metrics(nano_model_dir, addition_data, tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    from hybridflow.config import config_to_dict
    from hybridflow.launch.config import load_config
    from hybridflow.tracking import Tracking
    from hybridflow.trainer.main_ppo import train_ppo

    cfg = load_config(small_overrides(nano_model_dir, addition_data, tmp_path, steps=4, extra=[
        "algorithm.adv_estimator=grpo", "trainer.logger=[file,prometheus]", "trainer.prometheus.port=0"]))
    tracking = Tracking("it", "prom", ["file", "prometheus"], config=config_to_dict(cfg), output_dir=tmp_path)
    url = tracking.loggers["prometheus"].url
    pages = []

    def scrape() -> bool:  # called after each step, before the step is logged: the page shows the one before
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        page = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name.startswith("hybridflow_"):
                    page.setdefault(s.name, []).append((s.labels, s.value))
        pages.append(page)
        return False

    history = train_ppo(cfg, logger=tracking, should_stop=scrape)
    # should_stop is asked after every step, the last included (a stop there is a stop on purpose)
    assert len(pages) == 4 and len([m for m in history.metrics if "timing_s/step" in m]) == 4
    first, last = pages[0], pages[2]
    assert "hybridflow_step" not in first or first["hybridflow_step"][0][1] == 0  # nothing logged before step 1
    samples = {lab["run"]: v for lab, v in last["hybridflow_samples_total"]}
    assert samples == {"it/prom": 2 * 8 * 4}  # steps 1 and 2 logged: 8 prompts x rollout.n=4 each
    tokens = last["hybridflow_tokens_total"][0][1]
    logged = [m for m in history.metrics if "perf/total_num_tokens" in m][:2]
    assert tokens == sum(m["perf/total_num_tokens"] for m in logged) > 0
    assert last["hybridflow_step"] == [({"run": "it/prom", "worker": "driver"}, 2.0)]
    score = [v for lab, v in last["hybridflow_metric"] if lab["name"] == "critic/score/mean"]
    assert score == [logged[1]["critic/score/mean"]]
    assert {lab["step"] for lab, _ in last["hybridflow_metric"]} == {"2"}
    assert [lab["kind"] for lab, _ in last["hybridflow_memory_gib"]] == ["cpu_rss"]
    assert {lab["kind"] for lab, _ in last["hybridflow_failures_total"]} == {"agent_loop", "reward_error",
                                                                            "reward_timeout", "tool"}
