"""One rank of the GRPO step through the trainer's stages with the hf rollout split over ranks (issue 39 item 4), run
by test_sharded_rollout.py on 2 and on 4 ranks.

Per case (actor layout, rollout tensor_model_parallel_size, family): the worker is built as the trainer builds it;
rank 0 drives the generation through the hybrid fleet and the agent-loop manager (with the rollout split, the other
ranks of its rollout group follow its engine; unsplit, rank 0's engine serves every prompt and the others stay idle),
every other rank wakes up and sleeps with it; the batch goes to every rank, rewards and GRPO advantages are computed on it, each rank updates the actor on
its data-parallel share, and the switch runs again (sync_rollout_weights).  Rank 0 writes the generated tokens, the
trained weights and the sync's metrics of each case.

usage: python sharded_rollout_scenario.py RANK WORLD PORT DATA_DIR MODELS_DIR OUT_DIR REWARD_FILE CASE...
(MODELS_DIR holds one checkpoint per family, named after it.)
"""

import json
import os
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

A = "actor_rollout_ref"
# case -> (the actor's Megatron layout, rollout tensor_model_parallel_size, model family); the "dp" cases train
# with FSDP over every rank. Two ranks: test_sharded_rollout.py's fast cases; four ranks: the layouts of issue 39
# item 4 (dp x tp, ep x tp, Ulysses sp x tp, pp x dp, each against the dp4 step of the same family).
CASES = {
    "dp2-rollout1": ({}, 1, "qwen3"), "dp2-rollout2": ({}, 2, "qwen3"),
    "tp2-rollout1": ({"tp": 2}, 1, "qwen3"), "tp2-rollout2": ({"tp": 2}, 2, "qwen3"),
    "dp4-rollout1": ({}, 1, "qwen3"), "dp2xtp2-rollout2": ({"tp": 2}, 2, "qwen3"),
    "sp2xtp2-rollout2": ({"tp": 2, "cp": 2}, 2, "qwen3"), "pp2xdp2-rollout2": ({"pp": 2}, 2, "qwen3"),
    "moe-dp4-rollout1": ({}, 1, "qwen3-moe"), "moe-ep2xtp2-rollout2": ({"tp": 2, "ep": 2}, 2, "qwen3-moe"),
    "dp2-rollout2-keep": ({}, 2, "qwen3"),  # rollout.free_weights_on_sleep=false: the shard stays between generations
    # LoRA (lora_rank 4): the whole engine generates with the actor's module and adapters; the split one gets the
    # adapters merged piece by piece (engine/lora_pieces.py), from FSDP (dp2) and from tp2 (switched, not in place)
    "lora-dp2-rollout1": ({}, 1, "qwen3"), "lora-dp2-rollout2": ({}, 2, "qwen3"),
    "lora-tp2-rollout2": ({"tp": 2}, 2, "qwen3"),
}
_MEGATRON_KEYS = {"tp": "tensor_model_parallel_size", "ep": "expert_model_parallel_size",
                  "cp": "context_parallel_size", "pp": "pipeline_model_parallel_size"}


def _config(model_dir: str, data_dir: str, reward_file: str, layout: dict, k: int, world: int, keep: bool = False,
            lora: bool = False):
    from hybridflow.launch.config import load_config

    megatron = [f"{A}.actor.strategy=megatron"] if layout else []
    megatron += [f"{A}.actor.megatron.{_MEGATRON_KEYS[key]}={size}" for key, size in layout.items()]
    if layout.get("tp", 1) > 1 or k > 1 or layout.get("pp", 1) > 1:  # the switch moves the weights (acts only then)
        megatron.append(f"{A}.rollout.checkpoint_engine.update_weights_bucket_megabytes=1")
    return load_config([
        f"{A}.model.path={model_dir}", f"critic.model.path={model_dir}",
        f"data.train_files={data_dir}/train.parquet", f"data.val_files={data_dir}/test.parquet",
        "data.train_batch_size=4", "data.max_prompt_length=32", "data.max_response_length=6", "data.seed=1",
        "algorithm.adv_estimator=grpo", f"{A}.rollout.name=hf", f"{A}.rollout.n=2",
        f"{A}.rollout.tensor_model_parallel_size={k}",
        f"{A}.actor.ppo_mini_batch_size=4", f"{A}.actor.ppo_micro_batch_size_per_gpu=2",
        f"{A}.rollout.log_prob_micro_batch_size_per_gpu=4",
        f"{A}.actor.optim.lr=1e-4",  # Adam turns a gradient of ~eps into a step of ~lr: keep layouts comparable
        f"custom_reward_function.path={reward_file}", "custom_reward_function.name=compute_score_spread",
        "trainer.device=cpu", f"trainer.n_gpus_per_node={world}", *megatron,
        *([f"{A}.rollout.free_weights_on_sleep=false"] if keep else []),
        *([f"{A}.model.lora_rank=4", f"{A}.model.lora_alpha=8", f"{A}.actor.optim.lr=3e-3"] if lora else []),
    ])


def _generate_on_rank0(cfg, worker, rank, tokenizer, reward_fn, prompts):
    from hybridflow.agents import AgentLoopManager
    from hybridflow.rollout.service.fleet import HybridFleet
    from hybridflow.trainer.stages import WorkerGroups, generate

    from engine.batches import OneRankGroup  # tests/engine/batches.py (tests/ is on the path: tests/multirank.py)

    box = [None]
    if rank == 0:
        fleet = HybridFleet(OneRankGroup(worker))
        manager = AgentLoopManager(cfg, fleet, "local", tokenizer=tokenizer, reward_manager=reward_fn)
        box[0] = generate(WorkerGroups(actor_rollout=worker, rollout=manager), prompts, meta={"global_steps": 1})
    else:  # the generation is a collective of the group: wake up and sleep with rank 0
        worker.wake_up_rollout(1)
        worker.sleep_rollout()
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _shard_vs_actor(worker, state) -> float:
    """Largest difference between this rank's rollout shard (after the last switch) and the same box of the
    actor's full weights (a LoRA actor's merged as peft merges them): 0 when the switch refilled every element (a
    freed shard included)."""
    from hybridflow.engine.reshard import _named_full_tensors
    from hybridflow.engine.shard_switch import _local, _state_tensors, local_box

    if hasattr(worker.actor_engine.module, "peft_config"):  # a collective: every rank gathers the merged weights
        state = dict(_named_full_tensors(worker.actor_engine.module, "merged"))
    worst = 0.0
    for name, tensor in _state_tensors(worker.rollout.engine.model).items():
        if name not in state:
            continue
        box = local_box(tensor)
        whole = state[name][tuple(slice(lo, hi) for lo, hi in box)]
        worst = max(worst, float((_local(tensor).detach().float() - whole.float()).abs().max()))
    return worst


def _stale_shard_is_named(worker, rank: int) -> str | None:
    """Rank 1 changes one value of its kept shard; the wake-up check (local to each rank) must name it there."""
    from hybridflow.engine.shard_switch import _local, _state_tensors

    tensor = _local(next(iter(_state_tensors(worker.rollout.engine.model).values())))
    before = tensor.clone()
    if rank == 1:
        with torch.no_grad():
            tensor.view(-1)[0] += 1.0
    try:
        worker.rollout._check_after_wake()
        return None
    except Exception as exc:  # noqa: BLE001 - the error is the result
        return f"{type(exc).__name__}: {exc}"
    finally:
        with torch.no_grad():
            tensor.copy_(before)


def run_case(case: str, rank: int, world: int, data_dir: str, models_dir: str, reward_file: str) -> dict:
    from hybridflow.launch.inputs import build_data, build_reward_fns, load_tokenizer_for
    from hybridflow.trainer.stages import (StepPlan, WorkerGroups, compute_advantages, compute_old_log_prob,
                                           compute_reward, prompts_from_loader, update_actor)
    from hybridflow.workers.actor_rollout_ref import ActorRolloutRefWorker

    layout, k, family = CASES[case]
    cfg = _config(os.path.join(models_dir, family), data_dir, reward_file, layout, k, world, case.endswith("-keep"),
                  case.startswith("lora-"))
    worker = ActorRolloutRefWorker(cfg.actor_rollout_ref, "actor_rollout_ref")
    worker.init_model()
    tokenizer = load_tokenizer_for(cfg)
    reward_fn, _ = build_reward_fns(cfg, tokenizer)
    prompts = prompts_from_loader(next(iter(build_data(cfg, tokenizer)[0])))
    batch = _generate_on_rank0(cfg, worker, rank, tokenizer, reward_fn, prompts)
    split = hasattr(worker.rollout, "held_weight_bytes")
    held_asleep = worker.rollout.held_weight_bytes() if split else None  # the rollout shard while training runs
    groups = WorkerGroups(actor_rollout=worker, rollout=None)
    plan = StepPlan.from_config(cfg)
    compute_reward(groups, batch, reward_fn, use_rm=False)
    batch, _ = compute_advantages(batch, cfg.algorithm, plan, None)
    dims = worker.actor_engine.parallel_dims
    share = batch.chunk(dims.dp)[dims.dp_rank(rank)]
    metrics = compute_old_log_prob(groups, share, plan, cfg.actor_rollout_ref.actor.loss_agg_mode)
    metrics.update(update_actor(groups, share, float(cfg.actor_rollout_ref.rollout.temperature)))
    sync = worker.sync_rollout_weights()  # the switch after the update, as the trainer's weight-sync policy runs it
    state = worker.actor_engine.full_state_dict()
    result = {"held_asleep": held_asleep, "held_synced": worker.rollout.held_weight_bytes() if split else None,
              "shard_vs_actor": _shard_vs_actor(worker, state) if split else None,
              "sync": sync if isinstance(sync, dict) else {"seconds": sync},
              "replica": worker.rollout_replica() is not None,
              "update": {k: float(v) for k, v in metrics.items() if k.startswith("actor/") and
                         isinstance(v, (int, float))}}
    if split and case.endswith("-keep"):  # a kept shard changed behind the switch's back is named at wake-up
        result["wake_check"] = _stale_shard_is_named(worker, rank)
    if rank == 0:
        torch.save({"responses": batch.batch["responses"], "state": state}, os.path.join(OUT, f"{case}.pt"))
    worker.release()
    return result


def main(rank, world, port, data_dir, models_dir, out_dir, reward_file, cases):
    global OUT
    OUT = out_dir
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), HYBRIDFLOW_DEVICE="cpu")
    torch.set_num_threads(1)
    results = {}
    for case in cases:
        try:
            results[case] = run_case(case, rank, world, data_dir, models_dir, reward_file)
        except Exception:  # noqa: BLE001 - reported per case; the other rank fails alike or times out
            results[case] = {"error": traceback.format_exc()}
            print(results[case]["error"], file=sys.stderr, flush=True)
            break
    Path(out_dir, f"results_rank{rank}.json").write_text(json.dumps(results, indent=1))
    if dist.is_initialized():
        dist.destroy_process_group()


OUT = "."

if __name__ == "__main__":
    r, w, p, d, m, o, rf = sys.argv[1:8]
    main(int(r), int(w), int(p), d, m, o, rf, sys.argv[8:])
