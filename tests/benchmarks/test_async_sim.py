"""The sync vs separate-async simulator (benchmarks/async_sim.py) on cases with a known answer."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def sim():
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("async_sim_under_test", BENCH / "async_sim.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their annotations through it
    spec.loader.exec_module(module)
    return module


def test_sync_step_without_a_tail_is_the_sum_of_its_phases(sim):
    """Every response 10 tokens, t1 = 0: a sync step is 10 decode steps + the training + the reshard, exactly."""
    costs = sim.Costs(lengths=(10,), t0=0.01, slots=8, train_s_per_sample=0.02, sync_s=0.05)
    r = sim.simulate_sync(costs, devices=4, batch=32, steps=20, warmup=2)
    step = 10 * 0.01 + 32 * 0.02 / 4 + 0.05
    assert r.samples_per_s == pytest.approx(32 / step, rel=1e-9)
    assert r.gen_s == pytest.approx(0.1) and r.train_s == pytest.approx(0.16)


def test_sync_waits_for_the_longest_response(sim):
    """A device's share runs until its longest response ends (continuous batching, no refill within a step);
    more rows than slots run in waves."""
    costs = sim.Costs(lengths=(1,), t0=1.0, slots=2)
    assert sim._device_gen_s([3, 1, 1, 7], costs) == pytest.approx(8.0)  # slots {1,1} -> {3,7}: 1 + 7
    assert sim._device_gen_s([5, 5], costs) == pytest.approx(5.0)
    costs = sim.Costs(lengths=(1,), t0=1.0, t1=0.5, slots=4)
    assert sim._device_gen_s([2, 4], costs) == pytest.approx(2 * 2.0 + 2 * 1.5)  # 2 active, then 1


@pytest.mark.parametrize("gen_tokens,train_per_sample", [(10, 0.02), (20, 0.005), (10, 0.0125)])
def test_async_without_a_tail_reaches_the_overlap_bound_and_no_more(sim, gen_tokens, train_per_sample):
    """No tail, the same devices for each phase (N rollout + N train vs sync's N, slots = batch / N, free weight
    push, staleness 1): async overlaps generation and training, so samples/s is sync's times
    (gen + train) / max(gen, train) -- never more."""
    n, batch = 4, 32
    costs = sim.Costs(lengths=(gen_tokens,), t0=0.01, slots=batch // n, train_s_per_sample=train_per_sample)
    sync = sim.simulate_sync(costs, n, batch, steps=60)
    asy = sim.simulate_async(costs, n, n, batch, max_staleness=1, steps=60)
    gen, train = gen_tokens * 0.01, batch * train_per_sample / n
    bound = (gen + train) / max(gen, train)
    assert asy.samples_per_s / sync.samples_per_s == pytest.approx(bound, rel=0.01)
    assert asy.staleness_max <= 1 and asy.dropped == 0


def test_staleness_zero_cannot_beat_sync(sim):
    """max_staleness 0: nothing is generated ahead of the trainer, the phases alternate; on half the devices each
    that is slower than sync on all of them, with or without a tail."""
    for lengths in ((8,), sim.long_tail_lengths()):
        costs = sim.Costs(lengths=lengths, t0=0.01, slots=16, train_s_per_sample=0.01, sync_s=0.01)
        sync = sim.simulate_sync(costs, 8, 64, steps=60)
        asy = sim.simulate_async(costs, 4, 4, 64, max_staleness=0, steps=60)
        assert asy.samples_per_s < sync.samples_per_s
        assert asy.staleness_max == 0


def test_staleness_never_exceeds_the_bound_and_the_tail_favours_async(sim):
    """With a long tail (1 in 8 responses up to 16x longer) the sync step waits for the longest response on each
    device, async keeps its slots full: async wins; the staleness of every trained sample stays within the bound."""
    costs = sim.Costs(lengths=sim.long_tail_lengths(), t0=0.01, slots=64, train_s_per_sample=0.005, sync_s=0.01)
    sync = sim.simulate_sync(costs, 16, 512, steps=80)
    for bound in (1, 2):
        asy = sim.simulate_async(costs, 8, 8, 512, max_staleness=bound, steps=80)
        assert asy.staleness_max <= bound
        assert asy.samples_per_s > 1.3 * sync.samples_per_s
    no_tail = sim.Costs(lengths=(4,), t0=0.01, slots=64, train_s_per_sample=0.005, sync_s=0.01)
    assert (sim.simulate_async(no_tail, 8, 8, 512, 1, steps=80).samples_per_s
            < 1.3 * sim.simulate_sync(no_tail, 16, 512, steps=80).samples_per_s)
