"""Delta weight sync to standalone hf replicas, end to end (local backend): a frozen vision tower is sent once and
then never again, and a corrupted bucket is caught, counted and repaired by a full resend."""

from __future__ import annotations

import pytest

from hybridflow.rollout.weights import checkpoint_engine as ce

from .conftest import run, small_overrides

A = "actor_rollout_ref"
VLM = ["data.max_prompt_length=64", "algorithm.adv_estimator=grpo", f"{A}.rollout.calculate_log_probs=true",
       "reward_model.num_workers=0", f"{A}.hybrid_engine=false"]


@pytest.fixture(scope="module")
def vision_data(tmp_path_factory):
    from hybridflow.data.vision_task import write_vision_task

    d = tmp_path_factory.mktemp("vision_task")
    write_vision_task("shape_color", str(d), train_size=16, test_size=8, seed=0, size=32)
    return d


def _vision_bytes(model_dir) -> tuple[int, int, int]:
    """(vision-tower tensors, their bytes, bytes of all tensors) of the checkpoint, as the actor holds them."""
    from hybridflow.engine.model_loader import load_causal_lm

    model = load_causal_lm(model_dir, dtype="fp32")
    tensors = dict(ce.full_tensors(model))
    vision = {k: v for k, v in tensors.items() if ".visual." in f".{k}" or k.startswith("visual.")}
    nbytes = lambda ts: sum(t.numel() * t.element_size() for t in ts)  # noqa: E731
    return len(vision), nbytes(vision.values()), nbytes(tensors.values())


def _syncs(history):
    return [m for m in history.metrics if "timing_s/step" in m and "weight_sync/bytes_sent" in m]


@pytest.mark.slow
@pytest.mark.parametrize("frozen", [True, False])
def test_a_frozen_vision_tower_is_sent_once_then_skipped(frozen, varied_vlm_dir, vision_data, tmp_path):
    history = run(small_overrides(varied_vlm_dir, vision_data, tmp_path, steps=2, n=4, batch=4, extra=[
        *VLM, f"{A}.actor.freeze_vision_tower={str(frozen).lower()}"]), tmp_path)
    syncs = _syncs(history)
    assert len(syncs) == 2
    n_vision, vision_bytes, total = _vision_bytes(varied_vlm_dir)
    assert n_vision > 0
    for m in syncs:  # after each update
        assert m["weight_sync/bytes_total"] == total and m["weight_sync/checksum_mismatch"] == 0
        if frozen:  # the vision tower never changes: only the trained part travels
            assert m["weight_sync/skipped"] >= n_vision
            assert 0 < m["weight_sync/bytes_sent"] <= total - vision_bytes
        else:
            assert m["weight_sync/bytes_sent"] > total - vision_bytes
        assert m["training/rollout_probs_diff_max"] < 1e-5  # the replica samples with the actor's weights


@pytest.mark.slow
def test_a_corrupted_bucket_is_caught_counted_and_resent_in_full(nano_model_dir, addition_data, tmp_path, monkeypatch):
    original = ce.BroadcastCheckpointEngine._post
    corrupted = []

    def post(self, nbytes, slot):  # the transport flips one byte of one bucket of the second sync
        buf, work = original(self, nbytes, slot)
        self._receives = getattr(self, "_receives", 0) + 1
        if self._receives != 3 or corrupted:
            return buf, work

        class Flip:
            def wait(self_inner):
                work.wait()
                buf[nbytes // 3] ^= 0x10
                corrupted.append(nbytes)

        return buf, Flip()

    monkeypatch.setattr(ce.BroadcastCheckpointEngine, "_post", post)
    history = run(small_overrides(nano_model_dir, addition_data, tmp_path, steps=3, extra=[
        "algorithm.adv_estimator=grpo", f"{A}.rollout.calculate_log_probs=true", f"{A}.hybrid_engine=false",
        f"{A}.rollout.checkpoint_engine.update_weights_bucket_megabytes=1"]), tmp_path)
    syncs = _syncs(history)
    assert corrupted and len(syncs) == 3
    assert [m["weight_sync/checksum_mismatch"] for m in syncs].count(1.0) == 1
    assert syncs[-1]["weight_sync/checksum_mismatch_total"] == 1
    resent = next(m for m in syncs if m["weight_sync/checksum_mismatch"] == 1.0)
    assert resent["weight_sync/bytes_sent"] == resent["weight_sync/bytes_total"]  # the repair sent everything
    for m in [m for m in history.metrics if "timing_s/step" in m]:  # and the replica sampled with the right weights
        assert m["training/rollout_probs_diff_max"] < 1e-5
