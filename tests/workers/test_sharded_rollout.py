"""One GRPO step through the trainer's stages with the hf rollout split over ranks equals the step with one engine per
rank (issue 39 item 4): the same tokens, parameters within 1e-5. On two ranks, from an actor laid out as data
parallel (the rollout shard filled by the switch) and as tensor parallel 2 (the actor's module reused in place); on
four ranks, from dp2 x tp2, Ulysses sp2 x tp2, pp2 x dp2 (Qwen3) and ep2 x tp2 (Qwen3-MoE) against the dp4 step of
the same model. A rank that is not its rollout group's first serves no replica, and every sync reports the switch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from multirank import run_ranks

HERE = Path(__file__).resolve().parent
REWARD = HERE.parent / "integration" / "reward_fns.py"

pytestmark = pytest.mark.full

TWO_RANKS = ["dp2-rollout1", "dp2-rollout2", "tp2-rollout1", "tp2-rollout2", "dp2-rollout2-keep", "lora-dp2-rollout1",
             "lora-dp2-rollout2", "lora-tp2-rollout2"]
FOUR_RANKS = ["dp4-rollout1", "dp2xtp2-rollout2", "sp2xtp2-rollout2", "pp2xdp2-rollout2", "moe-dp4-rollout1",
              "moe-ep2xtp2-rollout2"]
# case -> the case whose step it must equal
REFERENCE = {"dp2-rollout2": "dp2-rollout1", "dp2-rollout2-keep": "dp2-rollout1",
             "lora-dp2-rollout2": "lora-dp2-rollout1", "lora-tp2-rollout2": "lora-dp2-rollout1", "tp2-rollout1": "dp2-rollout1", "tp2-rollout2": "dp2-rollout1",
             "dp2xtp2-rollout2": "dp4-rollout1", "sp2xtp2-rollout2": "dp4-rollout1",
             "pp2xdp2-rollout2": "dp4-rollout1", "moe-ep2xtp2-rollout2": "moe-dp4-rollout1"}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    from hybridflow.data.synthetic import write_synthetic
    from hybridflow.utils.tiny_model import make_tiny_checkpoint

    root = tmp_path_factory.mktemp("sharded_rollout")
    write_synthetic("addition", str(root / "data"), train_size=16, test_size=4, seed=0)
    for family in ("qwen3", "qwen3-moe"):
        make_tiny_checkpoint(root / "models" / family, size="nano", family=family)
    return root


def _run(root: Path, world: int, cases: list[str]):
    out = root / f"out{world}"
    out.mkdir()
    run_ranks(HERE / "sharded_rollout_scenario.py", world, [root / "data", root / "models", out, REWARD, *cases],
              root / f"logs{world}", timeout=1500)
    results = [json.loads((out / f"results_rank{r}.json").read_text()) for r in range(world)]
    for rank, res in enumerate(results):
        for case in cases:
            assert "error" not in res[case], f"rank {rank} {case}:\n{res[case].get('error')}"
    saved = {case: torch.load(out / f"{case}.pt") for case in cases}
    for case in cases:  # the gradient norm as the trainer logs it: from the ranks that compute the loss
        saved[case]["grad_norm"] = max(res[case]["update"]["actor/grad_norm"] for res in results)
    return saved, results


@pytest.fixture(scope="module")
def two_ranks(inputs):
    return _run(inputs, 2, TWO_RANKS)


@pytest.fixture(scope="module")
def four_ranks(inputs):
    return _run(inputs, 4, FOUR_RANKS)


def _assert_same_step(saved, case):
    ref, got = saved[REFERENCE[case]], saved[case]
    assert torch.equal(ref["responses"], got["responses"])
    assert set(got["state"]) == set(ref["state"])
    worst = max(float((ref["state"][k] - v).abs().max()) for k, v in got["state"].items())
    print(f"\n{case} vs {REFERENCE[case]}: max parameter difference {worst:.3g}, gradient norm "
          f"{got['grad_norm']:.7g} vs {ref['grad_norm']:.7g}")
    assert worst < 1e-5, worst
    # Adam's first step is nearly blind to the gradient's scale: the norm (reported by the last stage) is not
    assert got["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-5)


@pytest.mark.parametrize("case", ["dp2-rollout2", "tp2-rollout1", "tp2-rollout2", "dp2-rollout2-keep",
                                  "lora-dp2-rollout2", "lora-tp2-rollout2"])
def test_the_step_equals_the_one_engine_per_rank_step(case, two_ranks):
    _assert_same_step(two_ranks[0], case)


@pytest.mark.parametrize("case", ["dp2xtp2-rollout2", "sp2xtp2-rollout2", "pp2xdp2-rollout2",
                                  "moe-ep2xtp2-rollout2"])
def test_four_rank_layouts_with_a_split_rollout_equal_the_dp4_step(case, four_ranks):
    _assert_same_step(four_ranks[0], case)


def test_the_step_moved_the_weights(two_ranks, inputs):
    """The comparisons above mean something: the trained parameters differ from the checkpoint's."""
    from hybridflow.engine.model_loader import load_causal_lm

    start = load_causal_lm(str(inputs / "models" / "qwen3")).state_dict()
    trained = two_ranks[0]["dp2-rollout1"]["state"]
    assert max(float((trained[k] - start[k]).abs().max()) for k in trained if k in start) > 1e-5


def test_a_split_rollout_has_one_replica_and_reports_the_switch(two_ranks):
    _, results = two_ranks
    rank0, rank1 = results
    assert rank0["dp2-rollout2"]["replica"] and not rank1["dp2-rollout2"]["replica"]
    assert rank0["dp2-rollout1"]["replica"] and rank1["dp2-rollout1"]["replica"]
    switched, in_place = rank0["dp2-rollout2"]["sync"], rank0["tp2-rollout2"]["sync"]
    assert switched["update_weights/in_place"] == 0.0 and switched["update_weights/received_bytes"] > 0
    assert switched["perf/max_memory_rss_update_weights_gb"] > 0 and switched["seconds"] > 0
    assert switched["weight_sync/checksum_worst_rel"] < 1e-9  # every rollout group checked against the training
    assert "weight_sync/checksum_worst_rel" not in in_place  # in place: the shard is the actor's own module
    assert in_place["update_weights/in_place"] == 1.0 and in_place["update_weights/received_bytes"] == 0


def test_a_switched_shard_is_freed_while_training_and_refilled_whole(two_ranks):
    """``rollout.free_weights_on_sleep`` (null = true): after the generation's sleep a switched shard holds no
    storage on any rank while the actor trains; the next switch allocates it again and fills every element (equal to
    the actor's weights). With false it stays allocated. An in-place shard (tp2 -> tp2) has nothing of its own."""
    for res in two_ranks[1]:
        freed, kept, in_place = res["dp2-rollout2"], res["dp2-rollout2-keep"], res["tp2-rollout2"]
        assert freed["held_asleep"] == 0, freed
        assert kept["held_asleep"] == kept["held_synced"] == freed["held_synced"] > 0, (kept, freed)
        assert freed["held_synced"] == freed["sync"]["update_weights/shard_bytes"]
        assert freed["shard_vs_actor"] == 0.0 and kept["shard_vs_actor"] == 0.0
        assert in_place["held_asleep"] == in_place["held_synced"] == 0
    rank0, rank1 = (res["dp2-rollout2-keep"]["wake_check"] for res in two_ranks[1])
    assert rank0 is None  # its shard is what the switch verified
    assert rank1.startswith("WeightMismatchError") and "changed since the last switch verified it" in rank1


def test_a_lora_actor_reaches_the_split_rollout_merged(two_ranks):
    """LoRA with the split rollout: after the update (the adapters' B no longer 0) every rank's shard holds its box
    of the merged weights, as peft merges them; the switch checked it (checksums) and the step equals the one with
    the whole engine generating through the adapters."""
    for res in two_ranks[1]:
        for case in ("lora-dp2-rollout2", "lora-tp2-rollout2"):
            assert res[case]["shard_vs_actor"] < 1e-6, (case, res[case]["shard_vs_actor"])
            assert res[case]["sync"]["update_weights/in_place"] == 0.0
            assert res[case]["sync"]["weight_sync/checksum_worst_rel"] < 1e-9
    trained = two_ranks[0]["lora-dp2-rollout1"]["state"]
    assert any("lora_B" in k and float(v.abs().max()) > 0 for k, v in trained.items())  # the adapters moved


def test_four_ranks_with_rollout_tp2_serve_two_replicas(four_ranks):
    _, results = four_ranks
    served = [res["dp2xtp2-rollout2"]["replica"] for res in results]
    assert served == [True, False, True, False], served
    assert all(res["dp4-rollout1"]["replica"] for res in results)
