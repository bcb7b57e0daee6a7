"""One rank of the 2-rank FSDP2 tiny-VLM scenario (run as a script by test_vlm_distributed.py).

usage: python two_rank_vlm_scenario.py RANK WORLD PORT CONFIG_PICKLE OUT_DIR [pp]

``pp``: the two ranks are two pipeline stages (the config's megatron node) instead of two data-parallel ranks: both
take the whole batch, the last stage's outputs and the gathered weights are saved.
"""

import importlib.util
import os
import pickle
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("vlm_batches", HERE.parent / "engine" / "vlm_batches.py")
vlm_batches = importlib.util.module_from_spec(spec)
spec.loader.exec_module(vlm_batches)

TEXT_ONLY_ROWS = (4, 5)  # rank 1's first micro-batch has no image: the vision tower must still run there


def main(rank: int, world: int, port: int, cfg_path: str, out_dir: str, layout: str = "dp") -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), HYBRIDFLOW_DEVICE="cpu")
    torch.set_num_threads(1)
    from hybridflow.engine.fsdp import fsdp_modules
    from hybridflow.workers.actor_rollout_ref import ActorRolloutRefWorker

    with open(cfg_path, "rb") as f:
        cfg = pickle.load(f)
    worker = ActorRolloutRefWorker(cfg.actor_rollout_ref, "actor_rollout_ref")
    worker.init_model()
    module = worker.actor_engine.module
    units = fsdp_modules(module)
    vision_units = [u for u in units if type(u).__name__.startswith("FSDPQwen2VLVisionBlock")]
    data = vlm_batches.make_vlm_update_batch(worker.processor, module.config, seed=0, text_only_rows=TEXT_ONLY_ROWS)
    if layout == "pp":  # the tower and the first layer on stage 0, the rest and the head on stage 1
        assert (len(vision_units) > 0) == (rank == 0), [type(u).__name__ for u in units]
        mine = data
    else:
        assert len(vision_units) == module.config.vision_config.depth, [type(u).__name__ for u in units]
        assert len(units) == module.config.text_config.num_hidden_layers + module.config.vision_config.depth + 1
        mine = data.chunk(world)[rank]
    mine = mine.union(worker.compute_log_prob(mine))
    metrics = worker.update_actor(mine).meta_info["metrics"]
    state = worker.actor_engine.full_state_dict()
    collect = worker.actor_engine.parallel_dims.is_collect(rank)  # the last stage holds the log-probs
    if layout == "pp":
        gathered = [None] * world
        torch.distributed.all_gather_object(gathered, (mine.batch["old_log_probs"], metrics) if collect else None)
        mine.batch["old_log_probs"], metrics = next(g for g in gathered if g is not None)
    if rank == 0:
        torch.save({"state": state, "metrics": metrics, "old_log_probs": mine.batch["old_log_probs"]},
                   os.path.join(out_dir, "after_update.pt"))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    r, w, p, c, o = sys.argv[1:6]
    main(int(r), int(w), int(p), c, o, sys.argv[6] if len(sys.argv) > 6 else "dp")
