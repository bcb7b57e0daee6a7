"""The one generation path (prompt batch -> agent-loop manager -> server -> engine -> verl's rollout layout):
n-grouping, EOS padding, validation params, log-probs, seeds."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hybridflow.agents import AgentLoopManager
from hybridflow.protocol import DataProto
from hybridflow.rollout.service.fleet import ServerFleet
from hybridflow.rollout.hf.engine import HFRolloutEngine
from hybridflow.rollout.service.server import RolloutServer
from hybridflow.trainer.stages import WorkerGroups, generate

P = 24


def _config(model_dir, *overrides):
    import warnings

    from hybridflow.launch.config import load_config

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_config([f"actor_rollout_ref.model.path={model_dir}", f"critic.model.path={model_dir}",
                            "actor_rollout_ref.rollout.name=hf", f"data.max_prompt_length={P}",
                            "data.max_response_length=10", "actor_rollout_ref.rollout.agent.num_workers=2",
                            "reward_model.use_reward_loop=false",  # generation only: rows carry no reward_model
                            "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "trainer.n_gpus_per_node=1",
                            "critic.ppo_micro_batch_size_per_gpu=2", *overrides])


def _prompts(tok, texts, meta=None):
    ids = [tok.encode(t, add_special_tokens=False) for t in texts]
    pad = tok.pad_token_id
    input_ids = torch.tensor([[pad] * (P - len(r)) + r for r in ids])
    mask = torch.tensor([[0] * (P - len(r)) + [1] * len(r) for r in ids])
    raw = np.empty(len(ids), dtype=object)
    raw[:] = ids
    return DataProto.from_dict(
        {"input_ids": input_ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)},
        {"raw_prompt_ids": raw, "data_source": np.array([f"src{i}" for i in range(len(texts))], dtype=object)},
        meta or {},
    )


class _Service:
    """An in-process server fleet + local agent-loop manager around ``engine``."""

    def __init__(self, cfg, engine, tok):
        self.fleet = ServerFleet([RolloutServer(engine, name="test")])
        self.groups = WorkerGroups(actor_rollout=None, rollout=AgentLoopManager(cfg, self.fleet, "local", tok))

    def generate(self, prompts, **meta):
        return generate(self.groups, prompts, {"global_steps": 1, **meta})

    def close(self):
        self.fleet.shutdown()


@pytest.fixture()
def service(model_and_tokenizer, varied_model_dir):
    created = []

    def make(*overrides, engine=None):
        model, tok = model_and_tokenizer
        svc = _Service(_config(varied_model_dir, *overrides), engine or HFRolloutEngine(model, tok, seed=0), tok)
        created.append(svc)
        return svc

    yield make
    for svc in created:
        svc.close()


def test_output_layout(service, model_and_tokenizer, prompt_texts):
    _, tok = model_and_tokenizer
    svc = service("actor_rollout_ref.rollout.n=1", "actor_rollout_ref.rollout.calculate_log_probs=true")
    prompts = _prompts(tok, prompt_texts)
    out = svc.generate(prompts.select(deepcopy=True))
    B, R = len(prompt_texts), 10
    assert out.batch["prompts"].shape == (B, P) and out.batch["responses"].shape == (B, R)
    for key in ("input_ids", "attention_mask", "position_ids"):
        assert out.batch[key].shape == (B, P + R)
    assert out.batch["rollout_log_probs"].shape == (B, R)
    assert torch.equal(out.batch["prompts"], prompts.batch["input_ids"])  # left padding kept
    assert torch.equal(out.batch["input_ids"], torch.cat([out.batch["prompts"], out.batch["responses"]], 1))
    assert torch.equal(out.batch["attention_mask"][:, :P], prompts.batch["attention_mask"])
    assert torch.equal(out.batch["attention_mask"][:, P:], out.batch["response_mask"])
    assert torch.equal(out.batch["position_ids"], (out.batch["attention_mask"].cumsum(-1) - 1).clamp(min=0))
    assert torch.equal(out.batch["position_ids"][:, P], prompts.batch["attention_mask"].sum(-1))
    assert list(out.non_tensor_batch["data_source"]) == [f"src{i}" for i in range(B)]
    assert out.non_tensor_batch["__num_turns__"].tolist() == [2] * B


def test_responses_stop_at_eos_with_mask_and_pad_after(service, model_and_tokenizer, prompt_texts):
    model, tok = model_and_tokenizer
    free = service("actor_rollout_ref.rollout.n=1", "actor_rollout_ref.rollout.do_sample=false",
                   "actor_rollout_ref.rollout.ignore_eos=true").generate(_prompts(tok, prompt_texts))
    stop = int(free.batch["responses"][0, 3])  # a token row 0 is known to emit: treat it as EOS
    out = service("actor_rollout_ref.rollout.n=1", "actor_rollout_ref.rollout.do_sample=false",
                  engine=HFRolloutEngine(model, tok, eos_token_ids=[stop])).generate(_prompts(tok, prompt_texts))
    responses, mask = out.batch["responses"], out.batch["response_mask"]
    stopped_rows = 0
    for row in range(len(prompt_texts)):
        ref = free.batch["responses"][row].tolist()
        end = ref.index(stop) + 1 if stop in ref else 10
        stopped_rows += stop in ref
        assert responses[row, :end].tolist() == ref[:end]
        assert mask[row, :end].tolist() == [1] * end and mask[row, end:].sum() == 0
        assert (responses[row, end:] == tok.pad_token_id).all()
    assert stopped_rows >= 1
    assert [r == "stop" for r in out.non_tensor_batch["finish_reason"]].count(True) == stopped_rows


def test_n_groups_are_adjacent_and_seeded_draws_repeat(service, model_and_tokenizer, prompt_texts):
    _, tok = model_and_tokenizer
    svc = service("actor_rollout_ref.rollout.n=3")
    texts = prompt_texts[:2]
    out = svc.generate(_prompts(tok, texts))
    assert len(out) == 6
    assert list(out.non_tensor_batch["data_source"]) == ["src0"] * 3 + ["src1"] * 3
    for g in range(2):
        group = out.batch["prompts"][3 * g : 3 * g + 3]
        assert (group == group[0]).all()
    assert len({tuple(r) for r in out.batch["responses"][:3].tolist()}) > 1  # the samples of a group differ
    again = svc.generate(_prompts(tok, texts))
    assert torch.equal(again.batch["responses"], out.batch["responses"])  # same step, same seeds


def test_validate_uses_val_kwargs(service, model_and_tokenizer, prompt_texts):
    model, tok = model_and_tokenizer
    svc = service("actor_rollout_ref.rollout.n=2", "actor_rollout_ref.rollout.val_kwargs.n=1",
                  "actor_rollout_ref.rollout.val_kwargs.do_sample=false")
    out = svc.generate(_prompts(tok, prompt_texts[:3]), validate=True)
    from hybridflow.rollout import SamplingParams

    greedy = HFRolloutEngine(model, tok).generate_batch([tok.encode(t, add_special_tokens=False) for t in prompt_texts[:3]],
                                                        SamplingParams(do_sample=False, max_tokens=10))
    assert len(out) == 3
    for row, ref in enumerate(greedy):
        assert out.batch["responses"][row, : len(ref.token_ids)].tolist() == ref.token_ids


def test_rollout_log_probs_match_actor_style_recomputation(service, model_and_tokenizer, prompt_texts):
    """What the actor does: one padded forward over input_ids/attention_mask/position_ids, logits / T."""
    model, tok = model_and_tokenizer
    svc = service("actor_rollout_ref.rollout.n=1", "actor_rollout_ref.rollout.temperature=0.8",
                  "actor_rollout_ref.rollout.top_k=20", "actor_rollout_ref.rollout.calculate_log_probs=true")
    out = svc.generate(_prompts(tok, prompt_texts))
    with torch.no_grad():
        logits = model(input_ids=out.batch["input_ids"], attention_mask=out.batch["attention_mask"],
                       position_ids=out.batch["position_ids"]).logits
    logits = logits[:, P - 1 : -1] / 0.8
    recomputed = torch.log_softmax(logits, -1).gather(2, out.batch["responses"][..., None]).squeeze(-1)
    mask = out.batch["response_mask"].bool()
    diff = (recomputed - out.batch["rollout_log_probs"]).abs()[mask]
    assert diff.mean().item() < 1e-5, diff.max()
    assert (out.batch["rollout_log_probs"][~mask] == 0).all()


def test_a_failing_trajectory_is_counted_and_kept(service, model_and_tokenizer, prompt_texts):
    """An engine error on one row (an empty prompt) fails that trajectory only: it stays in the batch,
    untrained (response_mask 0), counted in agent/error_count."""
    _, tok = model_and_tokenizer
    svc = service("actor_rollout_ref.rollout.n=1")
    prompts = _prompts(tok, prompt_texts[:3])
    prompts.non_tensor_batch["raw_prompt_ids"][1] = []
    out = svc.generate(prompts)
    assert len(out) == 3
    assert out.batch["response_mask"][1].sum() == 0 and out.batch["response_mask"][0].sum() > 0
    assert out.meta_info["gen_metrics"]["agent/error_count"] == 1
    errors = out.non_tensor_batch["agent_error"].tolist()  # the failed row carries its traceback
    assert errors[0] is None and errors[2] is None and "Traceback (most recent call last)" in errors[1]
