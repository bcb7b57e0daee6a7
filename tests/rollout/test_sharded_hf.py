"""The hf engine split over ranks (rollout tensor parallelism) and the switch that fills it (issue 39 items 1-2).

* every model family of the family table, split over 2 gloo ranks (heads, MLP, vocabulary, experts over the two
  ranks too), generates the unsharded engine's greedy and seeded tokens, through generate_batch and through the
  served (async) path, with the same prefix reuse, an abort in the middle, and log-probs within 1e-6 (fp32);
* from every training layout (dp, tp, sp x tp, ep x tp, ep, pp x tp, pp x dp on 4 ranks) to rollout tp 1, 2 and 4,
  each rank's rollout shard equals its box of the full weights, and it received exactly what its training shards
  lacked (zero redundancy), which with HybridFlow's grouping is M/t_g - M/(t p d);
* the shard groups, the sender choice and the box arithmetic, without processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from multirank import run_ranks

from hybridflow.engine.shard_switch import Transfer, _assign, intersect
from hybridflow.rollout.hf.lockstep import rollout_shard_groups
from hybridflow.utils.tiny_model import FAMILIES, make_tiny_checkpoint

HERE = Path(__file__).resolve().parent
SCENARIO = HERE / "sharded_hf_scenario.py"


def test_shard_groups_follow_hybridflow_when_training_tp_is_a_multiple():
    assert rollout_shard_groups(4, 2) == [(0, 1), (2, 3)]
    # training tp 4 -> rollout tp 2: rank i of the tp group gets rollout shard i // 2, which holds its own shard
    assert rollout_shard_groups(4, 2, tp_train=4) == [(0, 2), (1, 3)]
    assert rollout_shard_groups(8, 2, tp_train=4) == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert rollout_shard_groups(4, 4, tp_train=2) == [(0, 1, 2, 3)]
    with pytest.raises(ValueError, match="tensor_model_parallel_size=3 must divide the 4 ranks"):
        rollout_shard_groups(4, 3)


def test_boxes_intersect_and_each_receiver_takes_what_it_holds_from_itself():
    assert intersect(((0, 4), (0, 8)), ((2, 6), (4, 8))) == ((2, 4), (4, 8))
    assert intersect(((0, 4),), ((4, 8),)) is None
    # 2 training ranks hold the rows [0, 4) and [4, 8) (both replicated on ranks 2 and 3); the rollout wants rows
    # [0, 8) on rank 0 and on rank 1
    train = [[((0, 4),)], [((4, 8),)], [((0, 4),)], [((4, 8),)]]
    need = [[((0, 8),)], [((0, 8),)], [((0, 4),)], [((4, 8),)]]
    moves = _assign(0, 4, train, need)
    assert Transfer(0, 0, ((0, 4),)) in moves and Transfer(1, 1, ((4, 8),)) in moves  # own pieces: local copies
    assert Transfer(2, 2, ((0, 4),)) in moves and Transfer(3, 3, ((4, 8),)) in moves
    senders_to_0 = {t.sender for t in moves if t.receiver == 0 and t.box == ((4, 8),)}
    assert senders_to_0 <= {1, 3} and len(senders_to_0) == 1
    assert sum(1 for t in moves if t.receiver == 1) == 2


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("sharded_hf_models")
    for family in FAMILIES:
        kv = {} if family == "deepseek-v3" else {"num_key_value_heads": 4}  # rollout tp 4 needs 4 key/value heads
        make_tiny_checkpoint(root / family, size="nano", family=family, **kv)
    return root


def _run(mode: str, world: int, models: Path, tmp: Path, names: list[str] = ()) -> list[dict]:
    out = tmp / f"{mode}.json"
    run_ranks(SCENARIO, world, [mode, models, out, *names], tmp / "logs", timeout=1700)
    return [json.loads(Path(f"{out}.rank{r}").read_text()) for r in range(world)]


@pytest.mark.full
@pytest.mark.timeout(1800)
def test_every_family_split_over_two_ranks_generates_what_the_whole_engine_does(models, tmp_path):
    leader, follower = _run("engine", 2, models, tmp_path)
    for family in FAMILIES:
        res = leader[family]
        assert "error" not in res, res.get("error")
        assert all(res["same_tokens"]), (family, res["same_tokens"])
        assert res["max_logprob_diff"] < 1e-6, (family, res["max_logprob_diff"])
        assert res["prefix_reused_tokens"] == res["ref_prefix_reused_tokens"] > 0, family
        assert res["aborted"] == ["abort"] * 4, family
        if family != "deepseek-v3":  # MLA caches its expanded keys per query head: checked by the tokens only
            assert res["kv_cache_ratio"] == 2.0, (family, res["kv_cache_ratio"])  # each rank caches half the heads
        assert "error" not in follower[family], follower[family].get("error")
        assert follower[family]["followed_steps"] > 0


_LAYOUT_GROUPS = {"dense": ["dp4", "dp2xtp2", "tp4", "sp2xtp2"], "moe-and-pipeline": ["ep2xtp2", "ep4-deepseek",
                                                                                   "pp2xtp2", "pp2xdp2"]}


@pytest.mark.full
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("group", list(_LAYOUT_GROUPS))
def test_the_switch_gives_every_rank_its_shard_and_only_what_it_lacked(group, models, tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("sharded_hf_scenario", SCENARIO)
    scenario = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(scenario)
    names = _LAYOUT_GROUPS[group]
    ranks = _run("switch", 4, models, tmp_path, names)
    for key in ranks[0]:
        for rank, per_rank in enumerate(ranks):
            res = per_rank[key]
            assert "error" not in res, f"{key} rank {rank}:\n{res.get('error')}"
            assert res["max_diff"] == 0.0, (key, rank, res["max_diff"])
            # the checksum check (engine/shard_checksum.py) passes, names a sabotaged value, and drives delta sync
            assert res["check_worst_rel"] < 1e-9 and res["delta_check_worst_rel"] < 1e-9, (key, rank, res)
            assert res["sabotage_caught"] and "does not hold the training weights" in res["sabotage_caught"], \
                (key, rank, res["sabotage_caught"])
            assert res["delta_still_tensors"] == 0, (key, rank)  # nothing changed: nothing moves
            assert res["delta_changed"] == res["delta_expected"] and res["delta_moved_tensors"] == 1, (key, rank)
        # what arrived is exactly what the rank's training shards lacked of its rollout shard, never more
        sent = [per_rank[key]["sent"] for per_rank in ranks]
        assert ranks[0][key]["total_sent"] == sum(sent)
        assert sum(sent) == sum(per_rank[key]["redundancy"] for per_rank in ranks), key
    assert set(ranks[0]) == {f"{name}->tp{t}" for name in names for t in scenario.ROLLOUT_TPS}
    assert set(scenario.SWITCH_LAYOUTS) == {n for g in _LAYOUT_GROUPS.values() for n in g}


def _cfg(*overrides):
    from hybridflow.launch.config import load_config

    return load_config(["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "critic.ppo_micro_batch_size_per_gpu=4",
                        "actor_rollout_ref.rollout.name=hf", *overrides])


def test_the_key_splits_the_hf_engine_or_is_refused_or_noted_at_config_time(models):
    from hybridflow.rollout.hf.checks import device_errors, device_notes, model_errors

    ray = ["trainer.backend=ray", f"actor_rollout_ref.model.path={models / 'qwen2'}"]
    uneven = _cfg(*ray, "trainer.n_gpus_per_node=6", "actor_rollout_ref.rollout.tensor_model_parallel_size=4",
                  "data.train_batch_size=12", "actor_rollout_ref.actor.ppo_mini_batch_size=6",
                  "critic.ppo_mini_batch_size=6")
    assert any("tensor_model_parallel_size=4 must divide the 6 actor/rollout processes" in e
               for e in device_errors(uneven, "cpu"))
    lora = _cfg(*ray, "trainer.n_gpus_per_node=2", "actor_rollout_ref.model.lora_rank=4",
                "actor_rollout_ref.rollout.tensor_model_parallel_size=2")
    assert device_errors(lora, "cpu") == []  # LoRA: the switch merges the adapters piece by piece
    lora_pp = _cfg(*ray, "trainer.n_gpus_per_node=4", "actor_rollout_ref.model.lora_rank=4",
                   "actor_rollout_ref.rollout.tensor_model_parallel_size=2", "actor_rollout_ref.actor.strategy=megatron",
                   "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2")
    assert any("with LoRA and actor.megatron.pipeline_model_parallel_size=2" in e
               for e in device_errors(lora_pp, "cpu"))
    too_many = _cfg(*ray, "trainer.n_gpus_per_node=8", "actor_rollout_ref.rollout.tensor_model_parallel_size=8")
    assert any("must divide the 4 key/value heads" in e or "must divide the 4 attention heads" in e
               for e in model_errors(too_many))
    fits = _cfg(*ray, "trainer.n_gpus_per_node=4", "actor_rollout_ref.rollout.tensor_model_parallel_size=4")
    assert device_errors(fits, "cpu") == [] and model_errors(fits) == []
    one = _cfg("trainer.backend=local", f"actor_rollout_ref.model.path={models / 'qwen2'}",  # one process
               "actor_rollout_ref.rollout.tensor_model_parallel_size=2")
    assert device_errors(one, "cpu") == [] and model_errors(one) == []
    assert any("does not split the hf engine here" in n for n in device_notes(one, "cpu"))
