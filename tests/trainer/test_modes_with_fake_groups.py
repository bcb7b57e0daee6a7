"""Every controller mode with fake worker groups (``tests/fake_groups.py``): no model, no process, no engine.

The same controller runs each mode's batch source; the fakes record the stage calls, the weight pushes and the
weight version each trajectory was generated with, so a mode's logic -- stage order, where pi_old comes from,
staleness and its bound, the replay buffer's refills, the generation window -- is proven in seconds. The real
workers' side of the same contract is checked end to end by tests/integration/test_async_training.py and
test_v1_trainer.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hybridflow.config import ConfigError
from hybridflow.config.modes import MODE_TABLE, run_mode
from hybridflow.launch.config import load_config
from hybridflow.trainer.controller import RLController
from hybridflow.trainer.modes import MODE_CLASSES, mode_for
from hybridflow.trainer.stages import WorkerGroups
from fake_groups import (
    TOKENIZER,
    FakeActor,
    FakeLoader,
    FakeRollout,
    FakeStreamManager,
    Recorder,
    config_overrides,
    prompts,
    reward_first_token_zero,
)

A = "actor_rollout_ref"
SPLIT = [f"{A}.hybrid_engine=false", "rollout.nnodes=1", "rollout.n_gpus_per_node=1", f"{A}.rollout.free_cache_engine=false"]
ONE_STEP_OFF = SPLIT + ["async_training.mode=one_step_off"]
FULLY = SPLIT + ["async_training.mode=fully_async", f"{A}.rollout.calculate_log_probs=true",
                 f"{A}.rollout.free_cache_engine=false", "async_training.require_batches=1"]
V1 = ["trainer.use_v1=true"]


def build(tmp_path, extra, *, n=2, b=2, steps=3, mini=2, stream=False, batches=6):
    """A controller over fakes: the streaming manager for the async modes, the batch rollout otherwise."""
    cfg = load_config([*config_overrides(tmp_path, n=n, b=b, steps=steps, mini=mini), "algorithm.adv_estimator=grpo",
                       *extra])
    rec = Recorder()
    actor = FakeActor(rec)
    rollout = FakeStreamManager(rec, cfg.actor_rollout_ref.rollout) if stream else FakeRollout(rec, n, moves=True)
    loader = FakeLoader([prompts(b, start=100 * i) for i in range(batches)], batch_size=b)
    groups = WorkerGroups(actor_rollout=actor, ref=actor, rollout=rollout)
    run = RLController(cfg, TOKENIZER, groups, loader, None, reward_first_token_zero, reward_first_token_zero)
    return run, rec


# ---------------------------------------------------------------------------------------------- the mode table
@pytest.mark.parametrize("keys,mode", [
    ([], "sync"),
    (ONE_STEP_OFF, "one_step_off"),
    (FULLY, "fully_async"),
    (V1, "v1_sync"),
    (V1 + ["trainer.v1.trainer_mode=colocate_async"], "v1_colocate_async"),
    (V1 + ["trainer.v1.trainer_mode=separate_async", "trainer.v1.separate_async.parameter_sync_step=1", *SPLIT],
     "v1_separate_async"),
])
def test_one_table_maps_verls_keys_to_a_mode_and_its_file(tmp_path, keys, mode):
    cfg = load_config([*config_overrides(tmp_path, n=2, b=2, steps=1, mini=2), "algorithm.adv_estimator=grpo", *keys])
    assert run_mode(cfg) == mode
    assert type(mode_for(cfg, FakeLoader([], 2))) is MODE_CLASSES[mode]
    assert set(MODE_TABLE.values()) == set(MODE_CLASSES)


@pytest.mark.parametrize("keys,message", [
    (V1 + ONE_STEP_OFF, "async_training.mode=one_step_off with trainer.use_v1=true"),
    (ONE_STEP_OFF + ["trainer.recipe=spin", f"{A}.rollout.n=2"], "trainer.recipe=spin runs its own stages on the "
                                                                 "synchronous step"),
])
def test_contradictory_mode_keys_are_refused_at_config_time(tmp_path, keys, message):
    with pytest.raises(ConfigError, match=message):
        load_config([*config_overrides(tmp_path, n=2, b=2, steps=1, mini=2), "algorithm.adv_estimator=grpo", *keys])


# ---------------------------------------------------------------------------------------------- one-step-off
def test_one_step_off_generates_ahead_and_lags_one_update(tmp_path):
    run, rec = build(tmp_path, ONE_STEP_OFF, steps=3)
    history = run.fit()
    # step 1: batch 1 on the spot, batch 2 ahead; step 2 pushes update 1 before generating batch 3 ahead
    gens = [i for i, c in enumerate(rec.calls) if c == "generate"]
    pushes = [i for i, c in enumerate(rec.calls) if c == "update_weights"]
    updates = [i for i, c in enumerate(rec.calls) if c == "update_actor"]
    assert len(gens) == 3 and len(updates) == 3
    assert len(pushes) == 1 + 2  # the start (replicas of their own), updates 1 and 2; the last one is never pushed
    assert updates[0] < pushes[1] < gens[2]  # the weights of update 1 before batch 3 is generated
    assert [t["staleness"] for t in history.trained] == [0, 0, 1, 1, 1, 1]  # one prompt each, 2 per step
    steps = [m for m in history.metrics if "training/global_step" in m]
    assert [m["training/staleness/max"] for m in steps] == [0.0, 1.0, 1.0]
    assert all(0.0 <= m["trainer/idle_ratio"] <= 1.0 for m in steps)
    # one update per batch: pi_old is the update's own pass with the current weights (the recomputation), not the
    # rollout's log-probs of the older weights
    assert "compute_log_prob" not in rec.calls


def test_one_step_off_checkpoint_keeps_the_batch_generated_ahead_for_the_next_run(tmp_path):
    run, _ = build(tmp_path, ONE_STEP_OFF + ["trainer.save_freq=1"], steps=2)
    run.fit()
    resumed, rec = build(tmp_path, ONE_STEP_OFF + ["trainer.save_freq=1", "trainer.total_training_steps=3"], steps=3)
    resumed.fit()
    # the resumed run regenerates the batch that was generated ahead (the third loader batch), not the fourth
    assert [int(t["index"]) for t in resumed.history.trained] == [200, 201]
    assert resumed.mode.weights.updates == 3


# ---------------------------------------------------------------------------------------------- fully async
def test_fully_async_versions_bound_staleness_and_push_every_k_steps(tmp_path):
    run, rec = build(tmp_path, FULLY + ["async_training.trigger_parameter_sync_step=2",
                                        "async_training.staleness_threshold=0.5"], steps=4, stream=True)
    history = run.fit()
    fleet = run.groups.rollout.fleet
    assert fleet.pushes == 1 + 2  # the start, then after steps 2 and 4
    # partial rollout: in-flight requests interrupted for a push and resumed after it (the last push finds the
    # stream ended: nothing in flight)
    assert rec.calls.count("interrupt") == rec.calls.count("resume") >= 1
    per_version = 2 * 2  # prompts per step x steps per version
    max_staleness = -(-(int(per_version * 1.5) - per_version) // per_version)
    assert max(t["staleness"] for t in history.trained) <= max_staleness == 1
    assert sorted(t["ordinal"] for t in history.trained) == list(range(8))  # every sample of the stream, once
    assert all(t["version_start"] <= t["version_end"] for t in history.trained)
    steps = [m for m in history.metrics if "training/global_step" in m]
    assert [m["fully_async/count/current_param_version"] for m in steps] == [0.0, 0.0, 1.0, 1.0]


def test_fully_async_with_no_staleness_trains_what_the_current_weights_generated(tmp_path):
    run, _ = build(tmp_path, FULLY + ["async_training.staleness_threshold=0", "async_training.trigger_parameter_sync_step=1"],
                   steps=3, stream=True)
    history = run.fit()
    assert {t["staleness"] for t in history.trained} == {0}
    # every trajectory started after the pushes of all the updates before the step that trained it
    started = dict(run.groups.rollout.generated)
    for t in history.trained:
        assert started[f"train-{t['ordinal'] // 2 + 1}-{t['ordinal'] % 2}-0"] == t["step"]


# ---------------------------------------------------------------------------------------------- V1
def test_v1_sync_refills_a_failed_group(tmp_path):
    run, rec = build(tmp_path, V1 + ["trainer.v1.sampler.sync_refill_failed_groups=true",
                                     "trainer.tolerated_failure_fraction=0.5"], steps=1, b=2)
    rollout = run.groups.rollout
    generate = rollout.generate_sequences
    calls = []

    def first_group_fails(batch):
        out = generate(batch)
        calls.append(len(out))
        errors = np.full(len(out), None, dtype=object)
        if len(calls) == 1:
            errors[:2] = "Traceback: the agent loop raised"
            out.batch["response_mask"][:2] = 0
        out.non_tensor_batch["agent_error"] = errors
        return out

    rollout.generate_sequences = first_group_fails
    history = run.fit()
    assert calls == [4, 2]  # the round, then one refill prompt (its n=2 samples)
    assert [e["reason"] for e in history.evicted] == ["failed"]
    trained = rec.seen["update_actor"]
    assert len(trained) == 4 and all(e is None for e in trained.non_tensor_batch["agent_error"])
    assert history.metrics[-1]["train/num_gen_batches"] == 2.0


def test_v1_colocate_async_opens_and_closes_the_window_around_each_wait(tmp_path):
    run, rec = build(tmp_path, V1 + ["trainer.v1.trainer_mode=colocate_async",
                                     "trainer.v1.colocate_async.num_warmup_batches=1"], steps=2, stream=True)
    history = run.fit()
    window = [c for c in rec.calls if c in ("wake_up", "sleep", "update_actor")]
    assert window[:3] == ["wake_up", "sleep", "update_actor"]  # generation never runs beside the update
    assert window.count("wake_up") == window.count("sleep")
    assert run.mode.weights.version == 2  # one version per step, nothing pushed (the hf engine shares the module)
    assert run.groups.rollout.fleet.pushes == 2  # the fleet asked, it moved nothing (moves=True: counted)
    steps = [m for m in history.metrics if "training/global_step" in m]
    assert [m["training/global_step"] for m in steps] == [1.0, 2.0]
    assert "training/off_policy/sample_age/max" in steps[-1]


def test_v1_separate_async_shares_one_pi_old_per_version(tmp_path):
    run, rec = build(tmp_path, V1 + SPLIT + ["trainer.v1.trainer_mode=separate_async",
                                             "trainer.v1.separate_async.parameter_sync_step=2",
                                             "trainer.v1.separate_async.num_warmup_batches=0"],
                     b=4, mini=2, steps=2, stream=True)
    history = run.fit()
    saves = [c for c in rec.calls if c.startswith(("save_actor_weights", "drop_actor_weights", "update_actor"))]
    # per version: the starting weights kept, two mini-batch updates, then dropped after the push
    assert saves[:4] == ["save_actor_weights:v1_version_start", "update_actor", "update_actor",
                         "drop_actor_weights:v1_version_start"]
    assert run.groups.rollout.fleet.pushes == 1 + 2  # the start, then one per step (= per version)
    assert run.mode.weights.version == 2
    steps = [m for m in history.metrics if "training/global_step" in m]
    assert len(steps) == 2 and all(m["timing_s/step"] > 0 for m in steps)


def test_every_mode_never_trains_a_sample_twice(tmp_path):
    for i, keys in enumerate([ONE_STEP_OFF, FULLY, V1 + ["trainer.v1.trainer_mode=colocate_async"]]):
        run, _ = build(tmp_path / str(i), keys, steps=3, stream=keys is not ONE_STEP_OFF)
        history = run.fit()
        key = "index" if keys is ONE_STEP_OFF else "ordinal"
        ids = [int(t[key]) for t in history.trained]
        assert len(ids) == len(set(ids)), (keys, ids)
        assert torch.isfinite(torch.tensor([m.get("actor/pg_loss", 0.0) for m in history.metrics])).all()
