"""The rollout log: its file survives a torn write, its records read back exactly, and a streaming run that crashes
between checkpoints resumes without losing a generated sample or training one twice (fake worker groups)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hybridflow.agents.base import AgentLoopOutput
from hybridflow.protocol import DataProto
from hybridflow.trainer.asynchronous.sample_queue import Sample
from hybridflow.trainer.durable.codec import Unencodable, decode, decode_sample, encode, encode_sample
from hybridflow.trainer.durable.wal import WriteAheadLog, read_records
from hybridflow.trainer import run_checkpoint as ckpt
from fake_groups import FakeActor, FakeLoader, FakeStreamManager, Recorder, config_overrides, prompts
from fake_groups import TOKENIZER, reward_first_token_zero


# ---------------------------------------------------------------------------------------------- the file
def test_a_torn_last_record_is_cut_off_and_the_rest_reads_back(tmp_path):
    path = tmp_path / "x.log"
    wal = WriteAheadLog(path, max_bytes=1 << 20)
    for i in range(3):
        assert wal.append({"i": i})
    wal.close()
    whole = path.read_bytes()
    for cut in range(1, 19):  # a kill at any byte of the last frame (12 bytes of head, 7 of payload)
        path.write_bytes(whole[:-cut])
        assert read_records(path) == [{"i": 0}, {"i": 1}]
        reopened = WriteAheadLog(path, max_bytes=1 << 20)
        assert reopened.torn_bytes > 0 and reopened.records_at_open == [{"i": 0}, {"i": 1}]
        reopened.append({"i": 9})
        reopened.close()
        assert read_records(path) == [{"i": 0}, {"i": 1}, {"i": 9}]
    # a flipped byte inside a record's payload ends the log there (the checksum)
    damaged = bytearray(whole)
    damaged[len(whole) - 3] ^= 0xFF
    path.write_bytes(bytes(damaged))
    assert read_records(path) == [{"i": 0}, {"i": 1}]


def test_the_bound_refuses_payloads_but_never_bookkeeping(tmp_path):
    wal = WriteAheadLog(tmp_path / "x.log", max_bytes=200)
    assert wal.append({"blob": "a" * 100})
    assert not wal.append({"blob": "b" * 100})
    assert wal.append({"blob": "c" * 100}, force=True)
    assert [r["blob"][0] for r in read_records(tmp_path / "x.log")] == ["a", "c"]
    wal.rewrite([{"blob": "d"}])
    assert read_records(tmp_path / "x.log") == [{"blob": "d"}] and wal.size == (tmp_path / "x.log").stat().st_size


# ---------------------------------------------------------------------------------------------- the records
def test_samples_and_batches_read_back_bit_for_bit():
    logprobs = torch.randn(5, dtype=torch.float32).tolist()
    output = AgentLoopOutput(prompt_ids=[1, 2], response_ids=[3, 4, 5, 6, 7], response_mask=[1] * 5,
                             response_logprobs=logprobs, num_turns=2, extra_fields={"agent_error": None})
    prompt = DataProto.from_dict({"input_ids": torch.tensor([[1, 2]]), "m": torch.tensor([[0.1, float("nan")]])},
                                 {"uid": np.array(["sample-3"], dtype=object),
                                  "reward_model": np.array([{"ground_truth": "12", "style": ("a", 1)}], dtype=object),
                                  "index": np.array([3])}, {"global_steps": 2})
    sample = Sample(ordinal=3, prompt=prompt, version_start=1, version_end=2, outputs=[output],
                    trajectory_metrics=[{"model_tokens": 5.0}], submit_step=2)
    back = decode_sample(encode_sample(sample))
    assert back.outputs[0].response_logprobs == logprobs  # floats exact
    assert back.outputs[0].model_dump(exclude_unset=True) == output.model_dump(exclude_unset=True)
    assert back.outputs[0].as_dict().keys() == output.as_dict().keys()  # the unset fields stay unset
    assert (back.version_start, back.version_end, back.submit_step) == (1, 2, 2)
    assert torch.equal(back.prompt.batch["input_ids"], prompt.batch["input_ids"])
    assert torch.equal(back.prompt.batch["m"].isnan(), prompt.batch["m"].isnan())
    assert back.prompt.non_tensor_batch["reward_model"][0] == {"ground_truth": "12", "style": ("a", 1)}
    assert back.prompt.non_tensor_batch["index"].dtype == prompt.non_tensor_batch["index"].dtype
    assert back.prompt.meta_info == {"global_steps": 2}
    bf16 = torch.tensor([1.5, -2.25], dtype=torch.bfloat16)
    assert torch.equal(decode(encode(bf16)), bf16) and decode(encode(bf16)).dtype == torch.bfloat16
    with pytest.raises(Unencodable):
        encode({"image": object()})


# ---------------------------------------------------------------------------------------------- a crash, resumed
A = "actor_rollout_ref"
FULLY = [f"{A}.hybrid_engine=false", "rollout.nnodes=1", "rollout.n_gpus_per_node=1",
         f"{A}.rollout.free_cache_engine=false", "async_training.mode=fully_async",
         f"{A}.rollout.calculate_log_probs=true", "async_training.require_batches=1",
         "async_training.staleness_threshold=1", "async_training.trigger_parameter_sync_step=1",
         "trainer.save_freq=2"]


class Killed(BaseException):
    """Stands for a kill: not an Exception, so nothing on the way out mistakes it for a step failure."""


class CrashingActor(FakeActor):
    def __init__(self, rec, crash_at: int | None):
        super().__init__(rec)
        self.crash_at, self.updates = crash_at, 0

    def update_actor(self, batch):
        self.updates += 1
        if self.updates == self.crash_at:
            raise Killed()
        return super().update_actor(batch)


def _run(tmp_path, steps, crash_at=None, extra=(), keys=FULLY):
    from hybridflow.launch.config import load_config
    from hybridflow.trainer.controller import RLController
    from hybridflow.trainer.stages import WorkerGroups

    cfg = load_config([*config_overrides(tmp_path, n=2, b=2, steps=steps, mini=2), "algorithm.adv_estimator=grpo",
                       *keys, *extra])
    rec = Recorder()
    actor = CrashingActor(rec, crash_at)
    rollout = FakeStreamManager(rec, cfg.actor_rollout_ref.rollout)
    rollout.fleet.replicas = []
    loader = FakeLoader([prompts(2, start=100 * i) for i in range(8)], batch_size=2)
    run = RLController(cfg, TOKENIZER, WorkerGroups(actor_rollout=actor, ref=actor, rollout=rollout), loader, None,
                       reward_first_token_zero, reward_first_token_zero)
    return run


def _lineage(root) -> list[int]:
    """The ordinals trained in the final checkpoint's history, from each checkpoint's record of its steps."""
    return _lineage_until(root, 1 << 30)


def _lineage_until(root, last: int) -> list[int]:
    out = []
    for step in [s for s in ckpt.completed_steps(root) if s <= last]:
        for _, _, ids, _ in ckpt.load_data_state(ckpt.step_dir(root, step))["rollout_log"]["trained"]:
            out.extend(ids)
    return out


def _queue(run):
    return run.mode.queue if hasattr(run.mode, "queue") else run.mode.stream.queue


def _generated(run) -> set[int]:
    """Ordinals the run generated (request ids are train-<stream batch + 1>-<row>-<trajectory>)."""
    return {(int(rid.split("-")[1]) - 1) * 2 + int(rid.split("-")[2]) for rid, _ in run.groups.rollout.generated}


MODES = {
    "fully_async": FULLY,
    "v1_colocate_async": ["trainer.use_v1=true", "trainer.v1.trainer_mode=colocate_async", "trainer.save_freq=2"],
    "v1_separate_async": ["trainer.use_v1=true", "trainer.v1.trainer_mode=separate_async", *FULLY[:4],
                          "trainer.v1.separate_async.parameter_sync_step=2", f"{A}.actor.ppo_mini_batch_size=1",
                          "trainer.save_freq=2"],
}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_a_crash_between_checkpoints_loses_nothing_and_trains_nothing_twice(mode, tmp_path):
    straight = _run(tmp_path / "straight", steps=8, keys=MODES[mode])
    straight.fit()
    crash_update = 5 if mode != "v1_separate_async" else 9  # step 5's (first) update; step 4 is the last checkpoint
    crashed = _run(tmp_path / "crashed", steps=8, crash_at=crash_update, keys=MODES[mode])
    with pytest.raises(Killed):
        crashed.fit()
    taken_at_5 = [t["ordinal"] for t in crashed.history.trained if t["step"] == 5]
    finished_then = {t["ordinal"] for t in crashed.history.trained} | set(_queue(crashed).pending())
    resumed = _run(tmp_path / "crashed", steps=8, keys=MODES[mode])
    history = resumed.fit()
    assert [t["ordinal"] for t in history.trained if t["step"] == 5][:len(taken_at_5)] == taken_at_5  # replayed
    steps = [m for m in history.metrics if "training/global_step" in m]
    assert steps[0]["rollout_wal/restored_samples"] > 0 and steps[0]["rollout_wal/replayed_steps"] >= 1
    lineage = _lineage(tmp_path / "crashed" / "ckpt")
    assert len(lineage) == len(set(lineage))  # nothing trained twice
    assert sorted(lineage) == sorted(_lineage(tmp_path / "straight" / "ckpt"))  # the uninterrupted run's samples
    restored = {t["ordinal"] for t in history.trained} - _generated(resumed)
    assert restored and restored <= finished_then  # restored ones were not generated again
    before = _lineage_until(tmp_path / "crashed" / "ckpt", 4)
    assert not _generated(resumed) & set(before)  # nothing the checkpoint covered was generated again
    # the log is compacted to the last checkpoint: what is left are samples generated ahead and never trained
    from hybridflow.trainer.durable.wal import read_records

    records = read_records(tmp_path / "crashed" / "ckpt" / "rollout_wal" / f"{mode}.log")
    assert records[0]["kind"] == "header" and records[0]["base_step"] == 8
    assert {r["kind"] for r in records[1:]} <= {"sample"}
    assert not {r["ordinal"] for r in records[1:]} & set(lineage)


def test_without_the_log_the_crashed_runs_samples_are_generated_again(tmp_path):
    """The control: trainer.rollout_wal.enable=false restores nothing (what the log saves is real)."""
    off = ["trainer.rollout_wal.enable=false"]
    with pytest.raises(Killed):
        _run(tmp_path, steps=8, crash_at=5, extra=off).fit()
    resumed = _run(tmp_path, steps=8, extra=off)
    history = resumed.fit()
    assert {t["ordinal"] for t in history.trained} <= _generated(resumed)
    assert not (tmp_path / "ckpt" / "rollout_wal").exists()


def test_the_resume_replays_the_crashed_steps_samples_and_drops_samples_no_replay_reaches(tmp_path):
    """A log written by hand: base checkpoint 4; step 5 took samples 10 and 11 (not the oldest), step 6 took 8 and 9,
    sample 14's first token came from version 9 (no replayed version reaches it): the resumed run's first two steps
    take exactly 10, 11 then 8, 9, and 14 is generated again."""
    from types import SimpleNamespace

    from hybridflow.launch.config import load_config
    from hybridflow.trainer.asynchronous.sample_queue import SampleQueue
    from hybridflow.trainer.durable.rollout_log import RolloutLog
    from hybridflow.trainer.modes.durable_stream import DurableSamples
    from hybridflow.trainer.modes.sample_ledger import SampleLedger

    cfg = load_config([*config_overrides(tmp_path, n=2, b=2, steps=8, mini=2), "algorithm.adv_estimator=grpo", *FULLY])
    log = RolloutLog.open(cfg, "fully_async")
    log.base_step = 4
    row = DataProto.from_dict({"input_ids": torch.tensor([[1, 2, 3]])})

    def sample(o, v):
        return Sample(ordinal=o, prompt=row, version_start=v, version_end=v,
                      outputs=[AgentLoopOutput(prompt_ids=[1], response_ids=[o], response_mask=[1])])

    log.wal.rewrite([log._header()])
    for o, v in [(8, 3), (9, 3), (10, 4), (11, 4), (12, 5), (13, 5), (14, 9)]:
        log.log_samples([sample(o, v)])
    log.log_taken(5, 0, [10, 11], ["d"] * 2)
    log.log_taken(6, 0, [8, 9], ["d"] * 2)
    log.close()

    ledger, queue = SampleLedger(2, 2), SampleQueue()
    ledger.mark_done(range(8))  # the checkpoint of step 4 trained 0..7
    durable = DurableSamples()
    weights = SimpleNamespace(version=4, local_step=0, every=1)
    run = SimpleNamespace(config=cfg, global_steps=4)
    restored = durable.open(run, "fully_async", ledger, queue, weights)
    assert restored == {8, 9, 10, 11, 12, 13}  # 14 needs version 9; the replay reaches version 6
    assert [s.ordinal for s in durable.take(queue, 5, 0)] == [10, 11]
    assert [s.ordinal for s in durable.take(queue, 6, 0)] == [8, 9]
    assert durable.take(queue, 7, 0) is None  # replay over: the queue's own order from here
    assert [s.ordinal for s in queue.take(2)] == [12, 13]
    assert durable.log.metrics()["rollout_wal/replayed_steps"] == 2


def test_one_step_off_trains_the_batches_its_crashed_run_generated(tmp_path):
    """Killed in step 5 (checkpoint 4): batches 5 and 6 were generated (6 ahead, during step 5); the resumed run
    trains them as they were and generates only 7 and 8."""
    from hybridflow.launch.config import load_config
    from hybridflow.trainer.controller import RLController
    from hybridflow.trainer.stages import WorkerGroups
    from fake_groups import FakeRollout

    def run(folder, crash_at=None):
        cfg = load_config([*config_overrides(folder, n=2, b=2, steps=8, mini=2), "algorithm.adv_estimator=grpo",
                           *FULLY[:4], "async_training.mode=one_step_off", "trainer.save_freq=2"])
        rec = Recorder()
        actor = CrashingActor(rec, crash_at)
        loader = FakeLoader([prompts(2, start=100 * i) for i in range(8)], batch_size=2)
        return RLController(cfg, TOKENIZER, WorkerGroups(actor_rollout=actor, ref=actor,
                                                         rollout=FakeRollout(rec, 2, moves=True)),
                            loader, None, reward_first_token_zero, reward_first_token_zero), rec

    straight, _ = run(tmp_path / "straight")
    straight.fit()
    crashed, _ = run(tmp_path / "crashed", crash_at=5)
    with pytest.raises(Killed):
        crashed.fit()
    resumed, rec = run(tmp_path / "crashed")
    history = resumed.fit()
    assert rec.calls.count("generate") == 2  # steps 7 and 8 only
    assert [m["rollout_wal/restored_samples"] for m in history.metrics if "training/global_step" in m][0] == 8
    assert [int(t["index"]) for t in history.trained] == [400, 401, 500, 501, 600, 601, 700, 701]
    assert [t["staleness"] for t in history.trained][:2] == [1, 1]  # generated ahead, as in the straight run
    lineage = _lineage(tmp_path / "crashed" / "ckpt")
    assert lineage == _lineage(tmp_path / "straight" / "ckpt") == [100 * s + r for s in range(8) for r in range(2)]


def test_a_kill_between_the_tracker_and_the_rename_resumes_from_the_last_complete_checkpoint(tmp_path, monkeypatch):
    """Found by the kill -9 test: the tracker used to be written after the step folder's rename, so a kill between
    them left a complete global_step_N behind a tracker naming N-1, and the resume refused to start (it would
    replace global_step_N). Now the tracker goes first: the resume passes over the missing folder."""
    import os

    def save(step, fail_rename=False):
        with ckpt.CheckpointWriter(tmp_path, step) as w:
            (w.tmp_dir / "actor").mkdir()
            (w.tmp_dir / "actor" / "model.pt").write_bytes(b"w")
            w.save_trainer_state(ckpt.TrainerState(global_step=step, epoch=0, rng=ckpt.capture_rng_state()))
            if fail_rename:  # the kill lands on the second of the two moves (tracker, rename), whichever it is
                real_replace, real_write, moves = os.replace, ckpt.atomic_write_text, []

                def move(name):
                    moves.append(name)
                    if len(moves) == 2:
                        raise Killed()

                def replace(src, dst):
                    if str(dst).endswith(f"global_step_{step}"):
                        move("rename")
                    return real_replace(src, dst)

                def write(path, text):
                    if str(path).endswith(ckpt.LATEST_FILE):
                        move("tracker")
                    return real_write(path, text)

                monkeypatch.setattr(ckpt.os, "replace", replace)
                monkeypatch.setattr(ckpt, "atomic_write_text", write)
            w.commit(["actor"])

    save(5)
    with pytest.raises(Killed):
        save(10, fail_rename=True)
    monkeypatch.undo()
    folder = ckpt.find_resume_dir(tmp_path, "auto", None)
    assert folder == ckpt.step_dir(tmp_path, 5)
    ckpt.check_overwrite(tmp_path, folder, saves=True, allowed=False)  # nothing newer to replace: no refusal


def test_samples_reach_the_trainer_only_once_on_disk_many_per_fsync(tmp_path):
    """The group commit: the queue hands out a sample only after the writer fsync'd it; a burst shares fsyncs."""
    from hybridflow.launch.config import load_config
    from hybridflow.trainer.asynchronous.sample_queue import SampleQueue
    from hybridflow.trainer.durable.rollout_log import RolloutLog
    from hybridflow.trainer.durable.wal import read_records

    cfg = load_config([*config_overrides(tmp_path, n=2, b=2, steps=8, mini=2), "algorithm.adv_estimator=grpo", *FULLY])
    log = RolloutLog.open(cfg, "fully_async")
    log.restore(0, lambda o: False, fresh=False)
    queue = SampleQueue()
    queue.on_finished = log.submit_sample
    row = DataProto.from_dict({"input_ids": torch.tensor([[1, 2, 3]])})
    on_disk_when_taken = []
    for o in range(40):
        s = Sample(ordinal=o, prompt=row, version_start=0, version_end=0,
                   outputs=[AgentLoopOutput(prompt_ids=[1], response_ids=[o], response_mask=[1])])
        queue.started(s)
        queue.finished(s)
    for _ in range(20):
        taken = queue.take(2, timeout=30)
        logged = {r["ordinal"] for r in read_records(log.wal.path) if r["kind"] == "sample"}
        on_disk_when_taken.append(all(s.ordinal in logged for s in taken))
    assert all(on_disk_when_taken)
    metrics = log.metrics()
    log.close()
    assert metrics["rollout_wal/samples_per_fsync"] > 1  # 40 samples arrived at once: fewer fsyncs than samples
