"""One rank of the uneven-batch scenario (run as a script by test_dp_padding.py).

usage: python uneven_batch_scenario.py RANK WORLD PORT IN_PICKLE OUT_DIR
IN_PICKLE holds the config and this rank's chunks (as DP_COMPUTE_PROTO dispatched them) for the actor and critic.
"""

import os
import pickle
import sys

import torch


def main(rank: int, world: int, port: int, in_path: str, out_dir: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), HYBRIDFLOW_DEVICE="cpu")
    torch.set_num_threads(1)
    from hybridflow.workers.actor_rollout_ref import ActorRolloutRefWorker
    from hybridflow.workers.critic import CriticWorker

    with open(in_path, "rb") as f:
        job = pickle.load(f)
    cfg = job["config"]
    actor = ActorRolloutRefWorker(cfg.actor_rollout_ref, "actor_rollout")
    actor.init_model()
    actor_metrics = actor.update_actor(job["actor_chunks"][rank]).meta_info["metrics"]
    actor_state = actor.actor_engine.full_state_dict()
    critic = CriticWorker(cfg.critic)
    critic.init_model(total_training_steps=1)
    critic_metrics = critic.update_critic(job["critic_chunks"][rank]).meta_info["metrics"]
    critic_state = critic.engine.full_state_dict()
    if rank == 0:
        torch.save({"actor": actor_state, "critic": critic_state, "actor_metrics": actor_metrics,
                    "critic_metrics": critic_metrics}, os.path.join(out_dir, "two_ranks.pt"))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    r, w, p, i, o = sys.argv[1:6]
    main(int(r), int(w), int(p), i, o)
