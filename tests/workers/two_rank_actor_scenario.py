"""One rank of the 2-rank FSDP2 actor scenario (run as a script by test_actor_distributed.py).

usage: python two_rank_actor_scenario.py RANK WORLD PORT CONFIG_PICKLE OUT_DIR
"""

import importlib.util
import os
import pickle
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("hf_test_batches", HERE.parent / "engine" / "batches.py")
batches = importlib.util.module_from_spec(spec)
spec.loader.exec_module(batches)


def main(rank: int, world: int, port: int, cfg_path: str, out_dir: str) -> None:
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
    assert len(fsdp_modules(module)) == module.config.num_hidden_layers + 1
    vocab = module.config.vocab_size
    mine = batches.make_update_batch(vocab, seed=0).chunk(world)[rank]
    metrics = batches.run_update(worker, mine)
    state = worker.actor_engine.full_state_dict()
    if rank == 0:
        torch.save({"state": state, "metrics": metrics}, os.path.join(out_dir, "after_update.pt"))

    # Generation with sharded weights: ranks decode different lengths and must not deadlock.
    cfg.actor_rollout_ref.rollout.response_length = 3 + 4 * rank
    cfg.actor_rollout_ref.rollout.ignore_eos = True
    gen = batches.generate(worker, cfg, batches.prompts_of(mine))
    assert gen.batch["responses"].shape == (len(mine) * cfg.actor_rollout_ref.rollout.n, 3 + 4 * rank)

    # Split placement: a second (rollout-only) sharded copy receives the weights broadcast from rank 0.
    rollout = ActorRolloutRefWorker(cfg.actor_rollout_ref, "rollout")
    rollout.init_model()
    rollout.update_rollout_weights(worker.get_actor_weights())
    synced = rollout.actor_engine.full_state_dict()
    if rank == 0:
        assert all(torch.equal(synced[k], state[k]) for k in state)

    # Checkpoint round-trip: the update after loading equals the update right after saving.
    ckpt = os.path.join(out_dir, "global_step_1", "actor")
    worker.save_checkpoint(ckpt, global_step=1)
    nxt = batches.make_update_batch(vocab, seed=1).chunk(world)[rank]
    batches.run_update(worker, nxt)
    first = worker.actor_engine.full_state_dict()
    worker.load_checkpoint(ckpt)
    batches.run_update(worker, nxt)
    second = worker.actor_engine.full_state_dict()
    if rank == 0:
        same = all(torch.equal(first[k], second[k]) for k in first)
        torch.save(same, os.path.join(out_dir, "ckpt_same.pt"))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    r, w, p, c, o = sys.argv[1:6]
    main(int(r), int(w), int(p), c, o)
