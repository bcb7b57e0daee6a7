"""One rank of the two-rank FSDP2 run over every model family (run as a script by test_families_distributed.py).

The process group starts once; then, per family: the actor is built and sharded over both ranks, its
log-probs are compared with an unsharded HF forward, and one GRPO step runs through the trainer's own stages
(generate with the hf engine on the sharded module -> reward -> GRPO advantages -> update), the rollout's
log-probs compared with the actor's recomputation on the way; the checkpoint is saved for the parent to merge.

usage: python two_rank_families_scenario.py RANK WORLD PORT DATA_DIR MODELS_DIR OUT_DIR REWARD_FILE FAMILY...
"""

import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch

A = "actor_rollout_ref"


def _config(model_dir: str, data_dir: str, reward_file: str):
    from hybridflow.launch.config import load_config

    return load_config([
        f"{A}.model.path={model_dir}", f"critic.model.path={model_dir}",
        f"data.train_files={data_dir}/train.parquet", f"data.val_files={data_dir}/test.parquet",
        "data.train_batch_size=4", "data.max_prompt_length=32", "data.max_response_length=6", "data.seed=1",
        "algorithm.adv_estimator=grpo", f"{A}.rollout.name=hf", f"{A}.rollout.n=2",
        f"{A}.rollout.tensor_model_parallel_size=1",  # one engine per rank: each rank generates its own prompts
        f"{A}.rollout.calculate_log_probs=true", f"{A}.actor.ppo_mini_batch_size=4",
        f"{A}.actor.ppo_micro_batch_size_per_gpu=2", f"{A}.rollout.log_prob_micro_batch_size_per_gpu=4",
        f"{A}.actor.optim.lr=1e-2", f"{A}.model.enable_gradient_checkpointing=true",
        f"custom_reward_function.path={reward_file}", "custom_reward_function.name=compute_score_spread",
        "reward_model.num_workers=0", "trainer.device=cpu", "trainer.nnodes=1", "trainer.n_gpus_per_node=2",
    ])


def _masked_max(x: torch.Tensor, mask: torch.Tensor) -> float:
    return float((x.abs() * mask).max())


def run_family(family: str, rank: int, world: int, data_dir: str, models_dir: str, out_dir: str,
               reward_file: str) -> dict:
    from hybridflow.agents import AgentLoopManager
    from hybridflow.engine.model_loader import load_causal_lm
    from hybridflow.rollout.service.fleet import HybridFleet
    from hybridflow.launch.inputs import build_data, build_reward_fns, load_tokenizer_for
    from hybridflow.trainer.stages import (
        StepPlan, WorkerGroups, compute_advantages, compute_old_log_prob, compute_reward, generate,
        prompts_from_loader, update_actor,
    )
    from hybridflow.workers.actor_rollout_ref import ActorRolloutRefWorker

    from engine.batches import OneRankGroup  # tests/engine/batches.py (tests/ is on the path: tests/multirank.py)

    started = time.time()
    model_dir = os.path.join(models_dir, family)
    cfg = _config(model_dir, data_dir, reward_file)
    worker = ActorRolloutRefWorker(cfg.actor_rollout_ref, "actor_rollout_ref")
    worker.init_model()
    module = worker.actor_engine.module
    sharded = sum(1 for p in module.parameters() if hasattr(p, "placements"))  # FSDP2 DTensor parameters
    tokenizer = load_tokenizer_for(cfg)
    reward_fn, _ = build_reward_fns(cfg, tokenizer)
    train_loader, _ = build_data(cfg, tokenizer)
    prompts = prompts_from_loader(next(iter(train_loader))).chunk(world)[rank]  # this rank's 2 prompts

    # 1. one GRPO step through the trainer's stages, each rank on its share (the gradient all-reduce is FSDP's)
    group = OneRankGroup(worker)
    manager = AgentLoopManager(cfg, HybridFleet(group), "local", tokenizer=tokenizer, reward_manager=reward_fn)
    groups = WorkerGroups(actor_rollout=worker, rollout=manager)  # stage calls on the worker return its result
    plan = StepPlan.from_config(cfg)
    batch = generate(groups, prompts, meta={"global_steps": 1})
    compute_reward(groups, batch, reward_fn, use_rm=False)
    mask = batch.batch["response_mask"].float()

    # 2. the rollout's log-probs (engine over the unsharded module) against the sharded actor's recomputation,
    #    and that recomputation against a plain HF forward of the unsharded checkpoint
    actor = worker.compute_log_prob(batch).batch["old_log_probs"]
    rollout_vs_actor = _masked_max(actor - batch.batch["rollout_log_probs"], mask)
    hf = load_causal_lm(model_dir).eval()
    b = batch.batch
    R = b["responses"].shape[1]
    with torch.no_grad():
        logits = hf(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]).logits
        ref = torch.log_softmax(logits[:, -R - 1: -1].float(), -1).gather(-1, b["responses"][..., None])[..., 0]
    actor_vs_hf = _masked_max(actor - ref, mask)

    step_metrics = compute_old_log_prob(groups, batch, plan, cfg.actor_rollout_ref.actor.loss_agg_mode)
    batch, _ = compute_advantages(batch, cfg.algorithm, plan, None)
    before = {k: v.clone() for k, v in worker.actor_engine.full_state_dict().items()}
    step_metrics.update(update_actor(groups, batch, float(cfg.actor_rollout_ref.rollout.temperature)))
    after = worker.actor_engine.full_state_dict()
    changed = sum(not torch.equal(before[k], after[k]) for k in before)
    worker.save_checkpoint(os.path.join(out_dir, family, "global_step_1", "actor"), global_step=1)
    if rank == 0:
        torch.save(after, os.path.join(out_dir, family, "trained_state.pt"))
    return {
        "sharded_params": sharded, "rollout_vs_actor": rollout_vs_actor, "actor_vs_hf": actor_vs_hf,
        "changed_tensors": changed, "tensors": len(before),
        "advantage_abs_sum": float(batch.batch["advantages"].abs().sum()),
        "metrics": {k: v for k, v in step_metrics.items() if isinstance(v, float)},
        "seconds": time.time() - started,
    }


def main(rank: int, world: int, port: int, data_dir: str, models_dir: str, out_dir: str, reward_file: str,
         families: list[str]) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), HYBRIDFLOW_DEVICE="cpu")
    torch.set_num_threads(1)
    results = {}
    for family in families:
        try:
            results[family] = run_family(family, rank, world, data_dir, models_dir, out_dir, reward_file)
        except Exception:  # noqa: BLE001 - reported per family; the other rank fails the same way or times out
            results[family] = {"error": traceback.format_exc()}
            print(results[family]["error"], file=sys.stderr, flush=True)
            break
    Path(out_dir, f"results_rank{rank}.json").write_text(json.dumps(results, indent=1))
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    r, w, p, d, m, o, rf = sys.argv[1:8]
    main(int(r), int(w), int(p), d, m, o, rf, sys.argv[8:])
