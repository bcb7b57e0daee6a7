"""Rollout-shaped batches for engine/worker tests: left-padded prompts + right-padded responses."""

from __future__ import annotations

import numpy as np
import torch

from hybridflow.protocol import DataProto


def make_rollout_batch(
    vocab_size: int,
    batch_size: int = 4,
    prompt_len: int = 6,
    response_len: int = 5,
    seed: int = 0,
    pad_id: int = 0,
    low_id: int = 5,
) -> DataProto:
    """Random token ids with ragged prompt/response lengths laid out as the rollout returns them."""
    g = torch.Generator().manual_seed(seed)
    prompts = torch.full((batch_size, prompt_len), pad_id, dtype=torch.long)
    responses = torch.full((batch_size, response_len), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros(batch_size, prompt_len, dtype=torch.long)
    response_mask = torch.zeros(batch_size, response_len, dtype=torch.long)
    for i in range(batch_size):
        p = int(torch.randint(1, prompt_len + 1, (1,), generator=g))
        r = int(torch.randint(1, response_len + 1, (1,), generator=g))
        prompts[i, prompt_len - p :] = torch.randint(low_id, vocab_size, (p,), generator=g)
        prompt_mask[i, prompt_len - p :] = 1
        responses[i, :r] = torch.randint(low_id, vocab_size, (r,), generator=g)
        response_mask[i, :r] = 1
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return DataProto.from_dict(
        {
            "prompts": prompts,
            "responses": responses,
            "response_mask": response_mask,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attention_mask,
            "position_ids": position_ids,
        }
    )


def padded_reference_log_probs(model, batch: DataProto, temperature: float = 1.0) -> torch.Tensor:
    """Log-probs of the response tokens from a plain padded forward (the ground truth)."""
    b = batch.batch
    R = b["responses"].shape[1]
    logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"],
                   use_cache=False).logits
    logits = logits[:, -R - 1 : -1] / temperature
    return torch.log_softmax(logits.float(), -1).gather(-1, b["responses"].unsqueeze(-1)).squeeze(-1)


def make_update_batch(vocab_size: int, seed: int, rows: int = 8, prompt_len: int = 6, response_len: int = 5) -> DataProto:
    """A rollout batch with random advantages and a sampling temperature, ready for update_actor."""
    data = make_rollout_batch(vocab_size, batch_size=rows, prompt_len=prompt_len, response_len=response_len, seed=seed)
    g = torch.Generator().manual_seed(seed + 100)
    data.batch["advantages"] = torch.randn(rows, response_len, generator=g)
    data.meta_info["temperature"] = 0.9
    return data


def prompts_of(data: DataProto) -> DataProto:
    """The left-padded prompt batch (what the dataloader gives the rollout) of a rollout batch."""
    P = data.batch["prompts"].shape[1]
    b = data.batch
    return DataProto.from_dict(
        {"input_ids": b["prompts"], "attention_mask": b["attention_mask"][:, :P], "position_ids": b["position_ids"][:, :P]}
    )


def run_update(worker, data: DataProto) -> dict:
    """compute_log_prob -> update_actor on an ActorRolloutRefWorker; returns the update metrics.

    Works on a shallow copy: ``DataProto.union`` adds keys in place and ``data`` may be reused.
    """
    data = DataProto.from_dict(dict(data.batch), dict(data.non_tensor_batch), dict(data.meta_info))
    data = data.union(worker.compute_log_prob(data))
    return worker.update_actor(data).meta_info["metrics"]


class OneRankGroup:
    """A bare worker seen as a one-rank worker group (each method returns a one-element list), which is
    what :class:`hybridflow.rollout.service.fleet.HybridFleet` drives."""

    host_role = None

    def __init__(self, worker):
        self.worker = worker

    def __getattr__(self, name):
        method = getattr(self.worker, name)
        return lambda *args, **kwargs: [method(*args, **kwargs)]


def with_raw_prompt_ids(prompts: DataProto) -> DataProto:
    """Add the unpadded ``raw_prompt_ids`` the dataset gives every row (read through the attention mask)."""
    ids, mask = prompts.batch["input_ids"], prompts.batch["attention_mask"].bool()
    raw = np.empty(len(prompts), dtype=object)
    raw[:] = [row[m].tolist() for row, m in zip(ids, mask)]
    prompts.non_tensor_batch["raw_prompt_ids"] = raw
    return prompts


def generate(worker, config, prompts: DataProto, backend: str = "local") -> DataProto:
    """Generate through the rollout service (hybrid fleet on ``worker``'s engine, local agent-loop manager)."""
    from hybridflow.agents import AgentLoopManager
    from hybridflow.rollout.service.fleet import HybridFleet
    from hybridflow.trainer.stages import split_generation_input

    group = worker if hasattr(worker, "host_role") else OneRankGroup(worker)
    config.reward_model.use_reward_loop = False  # these prompts carry no reward columns: generation only
    manager = AgentLoopManager(config, HybridFleet(group), backend, tokenizer=getattr(worker, "tokenizer", None))
    gen = split_generation_input(with_raw_prompt_ids(DataProto.from_dict(dict(prompts.batch),
                                                                         dict(prompts.non_tensor_batch),
                                                                         dict(prompts.meta_info))))
    return manager.generate_sequences(gen)
