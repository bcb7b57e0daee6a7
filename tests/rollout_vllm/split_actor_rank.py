"""One rank of the split-actor -> vLLM sync scenario (run as a script by test_vllm_split_actor.py).

usage: python split_actor_rank.py RANK PORT MODEL_DIR OUT_DIR

Two gloo ranks hold a tensor-parallel (tp 2) actor and take one AdamW step with it.  Rank 0 serves a vLLM engine,
rank 1 an hf engine with its own copy; both are refilled through ``RolloutHost.sync_weights`` -- the bucketed
resharding, each rank gathering one bucket of the split weights at a time, never a full state dict.  Then the
actor is saved as an HF folder (``export_hf_model``) and rank 0 starts a second vLLM engine from that folder.
Rank 0 writes ``result.json``: the greedy outputs of the synced engine before and after the sync and those of the
engine loaded from disk; rank 1 the hf engine's greedy outputs against HF ``generate`` on the saved folder.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import warnings
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

HERE = Path(__file__).resolve().parent
ENGINE_ARGS = {"dtype": "float32", "enforce_eager": True, "max_model_len": 256, "max_num_seqs": 16,
               "max_num_batched_tokens": 1024, "kv_cache_memory_bytes": 64 << 20, "load_format": "auto"}
PROMPTS = ["1+2=", "what is 17*3?", "hello there, how are you", "The answer is"]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _train_one_step(engine, vocab: int) -> None:
    from hybridflow.engine.forward import response_log_probs

    batches = _load("hf_test_batches", HERE.parent / "engine" / "batches.py")
    data = batches.make_update_batch(vocab, seed=3, rows=4, prompt_len=8, response_len=6)
    mine = data.chunk(engine.dp_size)[engine.dp_rank].batch
    lp, _ = response_log_probs(engine.module, dict(mine), 1.0, packed=False)
    mask = mine["response_mask"].float()
    (-(lp * mine["advantages"] * mask).sum() / mask.sum()).backward()
    engine.optimizer_step(grad_clip=1.0)


def main(rank: int, port: int, model_dir: str, out_dir: str) -> None:
    from hybridflow.launch.config import load_config
    from hybridflow.engine.engine_checkpoint import export_hf_model
    from hybridflow.engine.model_loader import load_causal_lm, load_tokenizer
    from hybridflow.engine.parallel_dims import ParallelDims
    from hybridflow.engine.train_engine import TrainEngine
    from hybridflow.rollout import SamplingParams
    from hybridflow.rollout.base import create_rollout_engine
    from hybridflow.workers.rollout_host import RolloutHost

    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), HYBRIDFLOW_DEVICE="cpu")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=300))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = load_config([f"actor_rollout_ref.model.path={model_dir}", "trainer.device=cpu",
                           "trainer.n_gpus_per_node=1", "actor_rollout_ref.actor.optim.lr=0.02",
                           "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1", "critic.ppo_micro_batch_size_per_gpu=1"])
    actor = cfg.actor_rollout_ref.actor
    engine = TrainEngine(load_causal_lm(model_dir), actor.fsdp_config, actor.optim, role="actor",
                         parallel_dims=ParallelDims(2, tp=2))
    tokenizer = load_tokenizer(model_dir)
    prompts = [tokenizer.encode(t) for t in PROMPTS]
    greedy = SamplingParams(do_sample=False, max_tokens=12, ignore_eos=True)
    if rank == 0:
        from hybridflow.rollout.vllm.engine import VLLMRolloutEngine

        rollout = VLLMRolloutEngine(model_dir, engine_args=ENGINE_ARGS, tokenizer=tokenizer, seed=0, name="split")
    else:
        rollout = create_rollout_engine("hf", model=load_causal_lm(model_dir).eval(), tokenizer=tokenizer)
    host = RolloutHost(rollout, engine, name=f"rank{rank}", shares_weights=False, bucket_bytes=64 << 10)
    before = [o.token_ids for o in rollout.generate_batch(prompts, greedy)]
    _train_one_step(engine, len(tokenizer))
    host.sync_weights()
    synced = [o.token_ids for o in rollout.generate_batch(prompts, greedy)]
    export_hf_model(engine, os.path.join(out_dir, "hf"), tokenizer)
    dist.barrier()
    result = {"before": before, "synced": synced, "sync": host.last_sync}
    if rank == 0:
        host.close()
        from hybridflow.rollout.vllm.engine import VLLMRolloutEngine

        # (its engine core in a child process, as the synced one: in this process it would join the gloo group)
        disk = VLLMRolloutEngine(os.path.join(out_dir, "hf"), engine_args=ENGINE_ARGS, tokenizer=tokenizer, seed=0,
                                 name="disk")
        try:
            result["disk"] = [o.token_ids for o in disk.generate_batch(prompts, greedy)]
        finally:
            disk.shutdown()
    else:
        sys.path.insert(0, str(HERE.parent))
        from vllm_helpers import hf_greedy

        saved = load_causal_lm(os.path.join(out_dir, "hf")).eval()
        result["disk"] = [hf_greedy(saved, p, 12, None) for p in prompts]
        host.close()
    Path(out_dir, f"result{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
