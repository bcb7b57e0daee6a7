"""One rank of the sharded-hf-engine checks (run by test_sharded_hf.py through tests/multirank.run_ranks).

``switch`` (4 ranks): for each training layout (dp x pp x tp x ep x sp, TrainEngine as the trainer builds it) and
each rollout tp, the rollout shard is built on the meta device and filled by engine/shard_switch; every rank's
shard must equal its box of the full weights, and what it received must be exactly what it lacked.

``engine`` (2 ranks): for each model family, the model split over both ranks (rollout tp 2, experts over both)
generates greedily in lockstep (leader: generate_batch and the async server path; follower: follow()) and must give
the unsharded engine's tokens and log-probs; then a sampled batch with seeds, prefix reuse and an abort.

usage: python sharded_hf_scenario.py RANK WORLD PORT MODE MODELS_DIR OUT_JSON [NAMES...]
"""

import json
import os
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
from multirank import exit_rank  # tests/ is on a scenario's path (tests/multirank.py)

# name -> (layout kwargs of ParallelDims, family)
SWITCH_LAYOUTS = {
    "dp4": (dict(), "qwen2"),
    "dp2xtp2": (dict(tp=2), "qwen2"),
    "tp4": (dict(tp=4), "llama3.1"),
    "sp2xtp2": (dict(sp=2, tp=2), "qwen3"),
    "ep2xtp2": (dict(tp=2, ep=2), "qwen3-moe"),
    "ep4-deepseek": (dict(ep=4), "deepseek-v3"),
    "pp2xtp2": (dict(pp=2, tp=2), "mistral"),
    "pp2xdp2": (dict(pp=2), "gemma2"),  # the last stage lacks the embeddings' embed_scale buffer: a peer sends it
}
ROLLOUT_TPS = (1, 2, 4)


def _fsdp():
    from hybridflow.config.schema import FSDPConfig, WrapPolicy

    return FSDPConfig(wrap_policy=WrapPolicy(min_num_params=0), param_offload=False, grad_offload=False,
                      optimizer_offload=False, offload_policy=False, reshard_after_forward=True, fsdp_size=-1,
                      forward_prefetch=False, model_dtype="fp32", dtype="fp32", use_orig_params=False, seed=0,
                      full_determinism=False)


def _mesh(groups, rank):
    from torch.distributed.device_mesh import DeviceMesh

    mesh = DeviceMesh("cpu", torch.tensor(groups), mesh_dim_names=("rdp", "rtp"))
    return mesh["rtp"]


def check_switch(models: Path, rank: int, world: int, only: list[str]) -> dict:
    from hybridflow.engine.model_loader import load_causal_lm
    from hybridflow.engine.parallel_dims import ParallelDims
    from hybridflow.engine.shard_switch import local_box, plan_switch, switch_to_rollout
    from hybridflow.engine.train_engine import TrainEngine
    from hybridflow.rollout.hf.lockstep import rollout_shard_groups
    from hybridflow.rollout.hf.shard_model import build_model_shard

    results = {}
    for name, (layout, family) in SWITCH_LAYOUTS.items():
        if only and name not in only:
            continue
        full = load_causal_lm(str(models / family))
        want = {k: v.clone() for k, v in full.state_dict().items()}
        engine = TrainEngine(full, _fsdp(), None, role="rollout", parallel_dims=ParallelDims(world, **layout))
        for tp_r in ROLLOUT_TPS:
            key = f"{name}->tp{tp_r}"
            # a failing case raises: its peers' collectives then fail at once instead of waiting for it
            groups = rollout_shard_groups(world, tp_r, layout.get("tp", 1))
            shard = build_model_shard(load_causal_lm(str(models / family)).config, _mesh(groups, rank), "cpu",
                                      torch.float32, engine.module)
            plan = plan_switch(engine.module, shard)
            stats = switch_to_rollout(engine.module, shard, plan, bucket_bytes=64 << 10)
            worst = 0.0
            for n, t in shard.state_dict().items():
                box = local_box(t)
                local = t.to_local() if hasattr(t, "to_local") else t
                ref = want[n][tuple(slice(a, b) for a, b in box)]
                worst = max(worst, float((local - ref).abs().max()) if local.numel() else 0.0)
            received = torch.tensor([stats.bytes], dtype=torch.float64)
            dist.all_reduce(received)
            results[key] = {"max_diff": worst, "sent": stats.bytes, "total_sent": float(received),
                            "shard_bytes": stats.bytes_total, "redundancy": plan.redundancy(rank),
                            "buckets": stats.buckets, "groups": groups,
                            **_checksums_and_delta(engine.module, shard, plan, groups, rank, world)}
            del shard
        del engine
    return results


def _checksums_and_delta(train_module, shard, plan, groups, rank, world) -> dict:
    """engine/shard_checksum on a filled shard: the check passes; one value changed on the last rank's shard is
    named; a second switch with nothing changed moves no tensor (delta); one training tensor changed moves it
    alone, and the check passes again."""
    from hybridflow.engine import shard_checksum as checks
    from hybridflow.engine.shard_switch import _local, _state_tensors, switch_to_rollout

    train, rollout = _state_tensors(train_module), _state_tensors(shard)
    totals = checks.training_totals(plan, train, rank)
    fact = checks.verify(plan, totals, checks.rollout_sums(plan, rollout, rank), groups)
    out = {"check_worst_rel": fact["worst_rel"]}
    # sabotage: one element of the last rank's largest rollout piece
    i = max(range(len(plan.names)), key=lambda k: _local(rollout[plan.names[k]]).numel())
    piece = _local(rollout[plan.names[i]])
    with torch.no_grad():
        if rank == world - 1 and piece.numel():
            piece.view(-1)[0] += 0.5
        try:
            checks.verify(plan, totals, checks.rollout_sums(plan, rollout, rank), groups)
            out["sabotage_caught"] = None
        except checks.ShardMismatchError as exc:
            out["sabotage_caught"] = str(exc)
        if rank == world - 1 and piece.numel():
            piece.view(-1)[0] -= 0.5
    again = checks.training_totals(plan, train, rank)
    none_changed = checks.changed(again, totals)
    still = switch_to_rollout(train_module, shard, plan, bucket_bytes=64 << 10, indices=none_changed)
    # change one training tensor everywhere it is held, then only it travels
    j = 0
    name = plan.names[j]
    held = name in train and plan.train_boxes[rank][j] is not None and _local(train[name]).numel() > 0
    original = _local(train[name]).clone() if held else None
    with torch.no_grad():
        if held:
            _local(train[name]).add_(0.25)
    moved = checks.training_totals(plan, train, rank)
    delta = checks.changed(moved, totals)
    stats = switch_to_rollout(train_module, shard, plan, bucket_bytes=64 << 10, indices=delta)
    after = checks.verify(plan, moved, checks.rollout_sums(plan, rollout, rank), groups)
    with torch.no_grad():
        if held:
            _local(train[name]).copy_(original)  # the next layouts start from the checkpoint's values again
    out.update(delta_none_changed=len(none_changed), delta_still_tensors=still.tensors, delta_changed=delta,
               delta_expected=[j], delta_moved_tensors=stats.tensors, delta_check_worst_rel=after["worst_rel"])
    return out


def _engines(full, family_dir, rank, world):
    from hybridflow.engine.parallel_dims import ParallelDims
    from hybridflow.engine.shard_switch import plan_switch, switch_to_rollout
    from hybridflow.engine.model_loader import load_causal_lm
    from hybridflow.engine.train_engine import TrainEngine
    from hybridflow.rollout.hf.lockstep import LockstepChannel, rollout_shard_groups
    from hybridflow.rollout.hf.shard_model import build_model_shard
    from hybridflow.rollout.hf.sharded_engine import ShardedHFRolloutEngine

    train = TrainEngine(load_causal_lm(family_dir), _fsdp(), None, role="rollout", parallel_dims=ParallelDims(world))
    groups = rollout_shard_groups(world, world)
    shard = build_model_shard(full.config, _mesh(groups, rank), "cpu", torch.float32, train.module)
    switch_to_rollout(train.module, shard, plan_switch(train.module, shard), bucket_bytes=1 << 20)
    channel = LockstepChannel.create(groups, rank, timeout_s=120, keepalive_s=0.5)
    return ShardedHFRolloutEngine(shard, None, channel=channel, seed=3, eos_token_ids=[],
                                  max_num_seqs=8, pad_token_id=0)


async def _abort_midway(engine, prompts) -> list[str]:
    """Requests cut short by abort_all() after a few decode steps: their finish reasons."""
    import asyncio

    from hybridflow.rollout.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=60, temperature=1.0, logprobs=True, seed=5)
    start = engine.stats()["decode_steps"]
    tasks = [asyncio.ensure_future(engine.generate(p, params, f"a{i}")) for i, p in enumerate(prompts)]
    while engine.stats()["decode_steps"] < start + 3:
        await asyncio.sleep(0.01)
    await asyncio.get_running_loop().run_in_executor(None, engine.abort_all)
    return [out.finish_reason for out in await asyncio.gather(*tasks)]


def check_engine(models: Path, rank: int, world: int, only: list[str]) -> dict:
    import asyncio

    from hybridflow.engine.model_loader import load_causal_lm
    from hybridflow.rollout.hf.engine import HFRolloutEngine
    from hybridflow.rollout.sampling_params import SamplingParams
    from hybridflow.utils.tiny_model import FAMILIES

    prompts = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23], [5, 6, 7, 8]]
    greedy = SamplingParams(max_tokens=10, temperature=0.0, logprobs=True)
    sampled = [SamplingParams(max_tokens=8, temperature=1.0, logprobs=True, seed=11 + i) for i in range(4)]
    results = {}
    for family in FAMILIES:
        if only and family not in only:
            continue
        try:
            full = load_causal_lm(str(models / family)).eval()
            ref = HFRolloutEngine(full, None, eos_token_ids=[], max_num_seqs=8, pad_token_id=0, seed=3)
            engine = _engines(full, str(models / family), rank, world)
            engine.wake_up()
            if engine.is_leader:
                want = ref.generate_batch(prompts, greedy)
                got = engine.generate_batch(prompts, greedy)
                # the next turn extends a finished row: its K/V are reused (prefix caching), on every shard alike
                turns = [prompts[0] + want[0].token_ids + [30, 31], prompts[1] + want[1].token_ids + [32]]
                want += ref.generate_batch(turns, greedy)
                got += engine.generate_batch(turns, greedy)
                want += ref.generate_batch(prompts, sampled)
                cache_ratio = ref.kv_cache_bytes / max(1, engine.kv_cache_bytes)

                async def served():  # the replica's path: concurrent generate() calls on an event loop
                    return await asyncio.gather(*(engine.generate(p, s, f"r{i}") for i, (p, s) in
                                                  enumerate(zip(prompts, sampled))))

                got += asyncio.run(served())
                aborted = asyncio.run(_abort_midway(engine, prompts))
                want += ref.generate_batch(prompts, greedy)  # the group is still in step after the abort
                got += engine.generate_batch(prompts, greedy)
                stats = engine.stats()
                engine.sleep()
                diffs = [abs(a - b) for w, g in zip(want, got) for a, b in zip(w.log_probs, g.log_probs)]
                results[family] = {"same_tokens": [w.token_ids == g.token_ids for w, g in zip(want, got)],
                                   "max_logprob_diff": max(diffs), "aborted": aborted,
                                   "prefix_reused_tokens": stats["prefix_reused_tokens"],
                                   "ref_prefix_reused_tokens": ref.stats()["prefix_reused_tokens"],
                                   "kv_cache_ratio": cache_ratio}
            else:
                engine.follow()
                results[family] = {"followed_steps": engine.stats()["decode_steps"]}
        except Exception:  # noqa: BLE001
            results[family] = {"error": traceback.format_exc()}
    return results


def main(rank: int, world: int, port: str, mode: str, models: str, out: str, only: list[str]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), HYBRIDFLOW_DEVICE="cpu")
    import logging

    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    check = check_switch if mode == "switch" else check_engine
    results = check(Path(models), rank, world, only)
    Path(f"{out}.rank{rank}").write_text(json.dumps(results, indent=1))
    exit_rank()  # barrier, destroy, and an exit that skips interpreter finalisation (tests/multirank.py)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6], sys.argv[7:])
