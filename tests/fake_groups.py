"""Fake worker groups and a fake rollout service for the controller's tests: no model, no process, no engine.

The fakes answer each call the way the real roles do (the batch keys of docs/architecture.md) and record the
calls, so a mode's control flow -- stage order, where pi_old comes from, weight versions and staleness, replay
buffer refills -- is checked in milliseconds. Sample ``j`` of a prompt answers tokens ``[j, 7]``; the fake reward
pays 1 when a response starts with token 0. The streaming fake (:class:`FakeStreamManager`) serves the async modes'
rollouter (``trajectory_rows`` / ``run_rows``) and records the weight version each trajectory was generated with.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import torch

from hybridflow.agents.base import AgentLoopOutput
from hybridflow.agents.loop_manager import AgentLoopManager
from hybridflow.protocol import DataProto

P, R = 3, 2  # prompt and response lengths
TOKENIZER = SimpleNamespace(eos_token_id=99, pad_token_id=0)


class Recorder:
    def __init__(self):
        self.calls: list[str] = []
        self.seen: dict[str, DataProto] = {}

    def note(self, name: str, batch: DataProto | None = None) -> None:
        self.calls.append(name)
        if batch is not None:
            self.seen[name] = batch


class FakeFleet:
    """The fleet's control calls; ``moves``: weights travel to replicas of their own (timed)."""

    def __init__(self, rec: Recorder, moves: bool):
        self.rec, self.moves = rec, moves
        self.replicas: list = []
        self.pushes = 0

    def update_weights(self):
        self.rec.note("update_weights")
        self.pushes += 1
        return 0.25 if self.moves else None

    def interrupt(self):
        self.rec.note("interrupt")

    def resume(self):
        self.rec.note("resume")

    def abort_all(self):
        pass

    def wake_up(self, global_step=None):
        self.rec.note("wake_up")

    def sleep(self):
        self.rec.note("sleep")


class FakeRollout:
    """Answers every prompt ``n`` times (``val_kwargs.n`` = 1 when validating). ``rows_per_prompt`` overrides n to
    test the row-count check; ``log_probs`` adds ``rollout_log_probs``."""

    def __init__(self, rec: Recorder, n: int, moves: bool = False, log_probs: bool = False):
        self.rec, self.n, self.log_probs = rec, n, log_probs
        self.fleet = FakeFleet(rec, moves)
        self.rows_per_prompt: int | None = None

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        validate = bool(prompts.meta_info.get("validate"))
        self.rec.note("gen_max" if validate else "generate", prompts)
        n = 1 if validate else (self.rows_per_prompt or self.n)
        ids = prompts.batch["input_ids"].repeat_interleave(n, dim=0)
        b = ids.shape[0]
        first = torch.arange(b) % n if not validate else torch.zeros(b, dtype=torch.long)
        responses = torch.stack([first, torch.full((b,), 7)], dim=1)
        batch = {"input_ids": torch.cat([ids, responses], dim=1), "responses": responses,
                 "attention_mask": torch.ones(b, P + R, dtype=torch.long),
                 "position_ids": torch.arange(P + R).expand(b, -1).clone(),
                 "response_mask": torch.ones(b, R, dtype=torch.long)}
        if self.log_probs:
            batch["rollout_log_probs"] = torch.full((b, R), -0.5)
        return DataProto.from_dict(batch, meta_info={"metrics": {"agent_loop/num_turns/mean": 1.0}})


class FakeStreamManager:
    """The agent-loop manager as the async modes' rollouter uses it: one prompt's ``n`` trajectories at a time.
    ``generated`` records ``(request id, fleet pushes when it started)`` per trajectory."""

    trajectory_rows = AgentLoopManager.trajectory_rows  # the real request ids and seeds

    def __init__(self, rec: Recorder, rollout_config, moves: bool = True):
        self.rec, self.rollout_config = rec, rollout_config
        self.fleet = FakeFleet(rec, moves)
        self.processor = None
        self.generated: list[tuple[str, int]] = []

    async def run_rows(self, rows: DataProto):
        await asyncio.sleep(0)
        out = []
        for request_id in rows.non_tensor_batch["__request_id__"]:
            sample = int(str(request_id).rsplit("-", 1)[1])
            self.generated.append((str(request_id), self.fleet.pushes))
            out.append((AgentLoopOutput(prompt_ids=[1, 2, 3], response_ids=[sample, 7], response_mask=[1, 1],
                                        response_logprobs=[-0.5, -0.5], num_turns=1), {"model_tokens": 2.0}))
        return out


class FakeActor:
    def __init__(self, rec: Recorder, old_log_prob: float = -0.4):
        self.rec, self.old = rec, old_log_prob

    def compute_log_prob(self, batch: DataProto) -> DataProto:
        """``old_log_prob`` everywhere -- or, for a batch with the rollout's log-probs, those (a healthy trainer
        recomputes what the rollout reported; ``drift`` is added to them, per token, to inject a mismatch)."""
        self.rec.note("compute_log_prob", batch)
        shape = batch.batch["responses"].shape
        old = torch.full(shape, self.old)
        if "rollout_log_probs" in batch.batch:
            old = batch.batch["rollout_log_probs"].clone() + self.drift(batch)
        return DataProto.from_dict({"old_log_probs": old, "entropys": torch.full(shape, 1.5)})

    def drift(self, batch: DataProto) -> torch.Tensor | float:
        """What this trainer's log-probs differ by from the rollout's (0: healthy)."""
        return 0.0

    def compute_ref_log_prob(self, batch: DataProto) -> DataProto:
        self.rec.note("compute_ref_log_prob", batch)
        return DataProto.from_dict({"ref_log_prob": torch.full(batch.batch["responses"].shape, -0.6)})

    def update_actor(self, batch: DataProto) -> DataProto:
        self.rec.note("update_actor", batch)
        return DataProto(meta_info={"metrics": {"actor/pg_loss": [0.5, 0.25], "actor/grad_norm": 1.0}})

    def save_checkpoint(self, path: str, global_step: int, max_ckpt_to_keep=None) -> None:
        import os

        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "fake.txt"), "w") as f:
            f.write(str(global_step))
        self.rec.note("save_checkpoint")

    def load_checkpoint(self, path: str) -> None:
        self.rec.note("load_checkpoint")

    def save_actor_weights(self, name: str) -> None:
        self.rec.note(f"save_actor_weights:{name}")

    def drop_actor_weights(self, name: str) -> None:
        self.rec.note(f"drop_actor_weights:{name}")


class FakeCritic:
    def __init__(self, rec: Recorder):
        self.rec = rec

    def compute_values(self, batch: DataProto) -> DataProto:
        self.rec.note("compute_values", batch)
        return DataProto.from_dict({"values": torch.zeros(batch.batch["responses"].shape)})

    def update_critic(self, batch: DataProto) -> DataProto:
        self.rec.note("update_critic", batch)
        return DataProto(meta_info={"metrics": {"critic/vf_loss": 0.125}})


class FakeLoader:
    """A resumable loader of fixed prompt batches (the real one's ``state_dict`` contract: epoch and position)."""

    def __init__(self, batches: list[dict], batch_size: int):
        self.batches, self.batch_size = batches, batch_size
        self.epoch = self.consumed = 0

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        while self.consumed < len(self.batches):
            self.consumed += 1
            yield self.batches[self.consumed - 1]
        self.epoch, self.consumed = self.epoch + 1, 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "consumed": self.consumed}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.consumed = int(state["epoch"]), int(state["consumed"])


def reward_first_token_zero(batch: DataProto, return_dict: bool = False):
    """1 on the last response token when the response starts with token 0, else 0."""
    scores = torch.zeros(batch.batch["responses"].shape)
    scores[:, -1] = (batch.batch["responses"][:, 0] == 0).float()
    return {"reward_tensor": scores, "reward_extra_info": {"acc": scores[:, -1].tolist()}}


def prompts(b: int, start: int = 0) -> dict:
    return {"input_ids": torch.arange(start, start + b * P).view(b, P), "attention_mask": torch.ones(b, P, dtype=torch.long),
            "position_ids": torch.arange(P).expand(b, -1).clone(),
            "data_source": np.array(["fake"] * b, dtype=object), "index": np.arange(start, start + b)}


def config_overrides(tmp_path, n: int, b: int, steps: int, mini: int) -> list[str]:
    """A configuration the fakes can serve (its model path is never read)."""
    a = "actor_rollout_ref"
    return [
        f"{a}.model.path={tmp_path / 'no-model'}", f"critic.model.path={tmp_path / 'no-model'}",
        f"data.train_files={tmp_path / 'train.parquet'}", f"data.train_batch_size={b}",
        f"data.max_prompt_length={P}", f"data.max_response_length={R}", f"{a}.rollout.n={n}",
        f"{a}.actor.ppo_mini_batch_size={mini}", f"{a}.actor.ppo_micro_batch_size_per_gpu={b * n}",
        f"{a}.rollout.log_prob_micro_batch_size_per_gpu={b * n}", f"{a}.ref.log_prob_micro_batch_size_per_gpu={b * n}",
        f"critic.ppo_micro_batch_size_per_gpu={b * n}", f"critic.forward_micro_batch_size_per_gpu={b * n}",
        "trainer.backend=local", "trainer.device=cpu", "trainer.n_gpus_per_node=1",
        f"trainer.total_training_steps={steps}", "trainer.val_before_train=false", "trainer.test_freq=-1",
        "trainer.save_freq=-1", "trainer.report=false", f"trainer.default_local_dir={tmp_path / 'ckpt'}",
    ]
