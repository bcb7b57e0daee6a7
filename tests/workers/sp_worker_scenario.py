"""One rank of the Ulysses worker scenario (run as a script by test_sequence_parallel_workers.py).

usage: python sp_worker_scenario.py RANK WORLD PORT CONFIG_PICKLE OUT_DIR

The actor/ref, critic and reward-model workers run with ``ulysses_sequence_parallel_size = WORLD`` (dp = 1): every
rank gets the whole batch, as the controller's N-D dispatch gives it to the sp ranks of one group.  The actor
computes log-probs, reference log-probs and one PPO update with token-budget micro-batches; the critic computes
values and one update; the reward model scores the batch.  Rank 0 writes what the parent compares with a one-process
run.
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


def critic_batch(data):
    """The batch update_critic needs: values from compute_values plus made-up returns."""
    g = torch.Generator().manual_seed(7)
    data.batch["returns"] = torch.randn(data.batch["responses"].shape, generator=g)
    return data


def main(rank: int, world: int, port: int, cfg_path: str, out_dir: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), HYBRIDFLOW_DEVICE="cpu")
    torch.set_num_threads(1)
    from hybridflow.protocol import DataProto
    from hybridflow.workers.actor_rollout_ref import ActorRolloutRefWorker
    from hybridflow.workers.critic import CriticWorker
    from hybridflow.workers.reward_model import RewardModelWorker

    with open(cfg_path, "rb") as f:
        cfg = pickle.load(f)
    worker = ActorRolloutRefWorker(cfg.actor_rollout_ref, "actor_rollout_ref")
    worker.init_model()
    assert worker.actor_engine.sequence_parallel.size == world and worker.actor_engine.dp_size == 1
    vocab = worker.actor_engine.module.config.vocab_size
    data = batches.make_update_batch(vocab, seed=0)
    ref = worker.compute_ref_log_prob(data)
    data.batch["ref_log_prob"] = ref.batch["ref_log_prob"]  # the update's KL loss reads it
    metrics = batches.run_update(worker, data)
    state = worker.actor_engine.full_state_dict()
    ckpt = os.path.join(out_dir, "global_step_1", "actor")
    worker.save_checkpoint(ckpt, global_step=1)

    critic = CriticWorker(cfg.critic)
    critic.init_model()
    values = critic.compute_values(data)
    cdata = critic_batch(DataProto.from_dict({**dict(data.batch), "values": values.batch["values"]}))
    cmetrics = critic.update_critic(cdata).meta_info["metrics"]
    cstate = critic.engine.full_state_dict()

    rm = RewardModelWorker(cfg.reward_model)
    rm.init_model()
    rm_scores = rm.compute_rm_score(data).batch["rm_scores"]
    if rank == 0:
        torch.save({"state": state, "metrics": metrics, "ref_log_prob": ref.batch["ref_log_prob"],
                    "values": values.batch["values"], "critic_state": cstate, "critic_metrics": cmetrics,
                    "rm_scores": rm_scores}, os.path.join(out_dir, "after_update.pt"))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    r, w, p, c, o = sys.argv[1:6]
    main(int(r), int(w), int(p), c, o)
