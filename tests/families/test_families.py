"""Every model family hybridflow is tested on, built tiny from its config (``utils/tiny_model.FAMILIES``), in
this process: the ``hf`` engine's greedy output equals transformers' ``generate`` token by token (chunked
prefill and prefix reuse included, sequences longer than the sliding windows), the actor's forward equals a
plain HF forward, the rollout's log-probs equal the actor's, the fast decode step is used or the fallback is
reported once, and a trained checkpoint merges into a folder ``AutoModelForCausalLM`` loads.

The two-rank FSDP2 run of every family (training, a GRPO step, checkpoint -> merge) is
``test_families_distributed.py``.
"""

from __future__ import annotations

import logging

import pytest
import torch

from hybridflow.rollout import SamplingParams
from hybridflow.rollout.hf.engine import HFRolloutEngine
from hybridflow.utils.tiny_model import FAMILIES, make_tiny_checkpoint

# qwen2-swa: Qwen2 with use_sliding_window (a full layer, then a sliding one): keyed per-layer-type masks on the
# fast decode path.  Not a released checkpoint shape, but a code path the seed families do not reach.
CASES = {name: (name, {}) for name in FAMILIES}
CASES["qwen2-swa"] = ("qwen2", {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1})
FAST = {"qwen2", "qwen2.5", "qwen3", "llama3.1", "mistral", "qwen2-swa"}  # the fast decode step applies
EAGER = {"gemma2"}  # no sdpa path (attention soft-capping)
WINDOWED = {"mistral", "gemma2", "qwen2-swa"}

PROMPTS = ["hello there, 1+2=3\n x", "what is 17*3?", "abc", "The answer is", "x", "a much longer prompt: 12345678"]
MAX_NEW = 12


@pytest.fixture(scope="module", params=sorted(CASES))
def family(request, tmp_path_factory):
    """(case name, checkpoint dir, model loaded as a run loads it, tokenizer)."""
    from hybridflow.engine.model_loader import load_causal_lm, load_tokenizer

    fam, extra = CASES[request.param]
    path = make_tiny_checkpoint(tmp_path_factory.mktemp(request.param), size="nano", family=fam,
                                initializer_range=0.2, **extra)
    model = load_causal_lm(str(path)).eval()
    return request.param, str(path), model, load_tokenizer(str(path))


def _generate(model, tok, prompt: list[int]) -> list[int]:
    # an explicit all-ones mask: a random model may generate the pad id, which generate would take for padding
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW, do_sample=False,
                         eos_token_id=None, pad_token_id=tok.pad_token_id)
    return out[0, len(prompt):].tolist()


def test_loads_with_its_attention_and_reports_a_decode_fallback_once(family, caplog):
    from hybridflow.engine.transformers_adapter import attention_implementation, attention_mask_layout

    name, _, model, tok = family
    assert attention_implementation(model.config) == ("eager" if name in EAGER else "sdpa")
    assert attention_mask_layout(model.config).has_windows == (name in WINDOWED)
    with caplog.at_level(logging.WARNING, logger="hybridflow.rollout.hf.batcher"):
        engines = [HFRolloutEngine(model, tok) for _ in range(2)]
    fast = engines[0]._batcher.fast
    notes = [r.getMessage() for r in caplog.records if "decodes through model.forward" in r.getMessage()]
    if name in FAST:
        assert fast is not None, engines[0]._batcher.fast_reason
        assert not notes
    else:
        assert fast is None
        from hybridflow.rollout.hf import batcher as hf_batcher

        reported = {key for key in hf_batcher._REPORTED if key[0] == model.config.model_type}
        assert reported, "the fallback was never reported"
        assert len(notes) <= 1  # said once per process (an earlier test module may have said it already)


def test_greedy_rollout_equals_generate_with_chunks_and_prefix_reuse(family):
    name, _, model, tok = family
    prompts = [tok.encode(p) for p in PROMPTS]
    want = [_generate(model, tok, p) for p in prompts]
    assert len({tuple(w) for w in want}) > 2, "the random init gives near-identical outputs: a weak test"
    # 16-token prefill forwards: the long prompts are prefilled in chunks (the window straddles them)
    engine = HFRolloutEngine(model, tok, max_num_batched_tokens=16, enable_prefix_caching=True)
    params = SamplingParams(do_sample=False, max_tokens=MAX_NEW, ignore_eos=True)
    got = engine.generate_batch(prompts, params)
    for i, (out, ref) in enumerate(zip(got, want)):
        assert out.token_ids == ref, f"{name}: prompt {i} diverges from generate at token " \
            f"{next((j for j, (a, b) in enumerate(zip(out.token_ids, ref)) if a != b), len(ref))}"
    assert engine.stats()["prefill_forwards"] > 1
    # the next turn extends each sequence: only the new suffix is prefilled, over the parked rows
    turns = [p + o.token_ids + tok.encode(" ok?") for p, o in zip(prompts, got)]
    again = engine.generate_batch(turns, params)
    assert engine.stats()["prefix_hits"] >= len(turns) - 1
    for out, turn in zip(again, turns):
        assert out.token_ids == _generate(model, tok, turn)
    if name in FAST:  # the fast decode step gives what model.forward gives
        slow = HFRolloutEngine(model, tok, fast_decode=False).generate_batch(prompts, params)
        assert [o.token_ids for o in slow] == [o.token_ids for o in got]


def _rollout_batch(tok, prompts: list[list[int]], responses: list[list[int]]):
    """Left-padded prompts + right-padded responses, as the rollout hands them to the actor."""
    P, R = max(map(len, prompts)), max(map(len, responses))
    pad = tok.pad_token_id
    rows, masks = [], []
    for p, r in zip(prompts, responses):
        rows.append([pad] * (P - len(p)) + p + r + [pad] * (R - len(r)))
        masks.append([0] * (P - len(p)) + [1] * (len(p) + len(r)) + [0] * (R - len(r)))
    input_ids, attention_mask = torch.tensor(rows), torch.tensor(masks)
    return {"input_ids": input_ids, "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0), "responses": input_ids[:, P:],
            "response_mask": attention_mask[:, P:]}


def test_actor_log_probs_equal_a_plain_hf_forward(family):
    """The actor's forward (``engine/forward.py``, padded batch, trimmed layout) against each sequence alone."""
    from hybridflow.engine.forward import response_log_probs

    _, _, model, tok = family
    prompts = [tok.encode(p) for p in PROMPTS]
    g = torch.Generator().manual_seed(0)
    responses = [torch.randint(4, model.config.vocab_size, (int(n),), generator=g).tolist()
                 for n in torch.randint(3, 14, (len(prompts),), generator=g)]
    batch = _rollout_batch(tok, prompts, responses)
    with torch.no_grad():
        got, _ = response_log_probs(model, batch, temperature=0.8)
        diffs = []
        for i, (p, r) in enumerate(zip(prompts, responses)):
            logits = model(torch.tensor([p + r])).logits[0, len(p) - 1: -1] / 0.8
            ref = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(r)[:, None])[:, 0]
            diffs.append((got[i, : len(r)] - ref).abs().max())
    assert max(diffs) < 1e-5, f"max |actor - HF| = {max(diffs):.2e}"


def test_rollout_log_probs_equal_the_actor(family):
    """Sampled responses (temperature 1): the engine's per-token log-probs against the actor's recomputation."""
    from hybridflow.engine.forward import response_log_probs

    _, _, model, tok = family
    prompts = [tok.encode(p) for p in PROMPTS]
    engine = HFRolloutEngine(model, tok, seed=5, max_num_batched_tokens=16)
    outs = engine.generate_batch(prompts, SamplingParams(temperature=1.0, max_tokens=MAX_NEW, logprobs=True,
                                                         ignore_eos=True))
    batch = _rollout_batch(tok, prompts, [o.token_ids for o in outs])
    with torch.no_grad():
        actor, _ = response_log_probs(model, batch, temperature=1.0)
    rollout = torch.tensor([o.log_probs for o in outs])
    diff = (actor - rollout).abs().max().item()
    assert diff < 1e-5, f"max |rollout - actor| = {diff:.2e}"


def test_trained_checkpoint_merges_into_a_loadable_model(family, tmp_path):
    """One rank: an update changes the weights, the checkpoint merges, AutoModelForCausalLM loads the result
    with the trained logits (the two-rank version, sharded, is in ``test_families_distributed.py``)."""
    from transformers import AutoModelForCausalLM

    from hybridflow.launch.config import load_config
    from hybridflow.cli.merge import merge_checkpoint
    from hybridflow.protocol import DataProto
    from hybridflow.workers.actor_rollout_ref import ActorRolloutRefWorker

    name, path, model, tok = family
    cfg = load_config([f"actor_rollout_ref.model.path={path}", f"critic.model.path={path}", "trainer.device=cpu",
                       "algorithm.adv_estimator=grpo",
                       "trainer.n_gpus_per_node=1", "data.train_batch_size=4", "actor_rollout_ref.rollout.n=1",
                       "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                       "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                       "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
                       "actor_rollout_ref.actor.optim.lr=1e-2",
                       "actor_rollout_ref.model.enable_gradient_checkpointing=false"])
    worker = ActorRolloutRefWorker(cfg.actor_rollout_ref, "actor_rollout_ref")
    worker.init_model()
    g = torch.Generator().manual_seed(2)
    prompts = [tok.encode(p) for p in PROMPTS[:4]]
    data = DataProto.from_dict(_rollout_batch(tok, prompts, [torch.randint(4, 90, (6,), generator=g).tolist()
                                                             for _ in prompts]))
    data.batch["advantages"] = torch.randn(data.batch["responses"].shape, generator=g)
    data.meta_info["temperature"] = 1.0
    data = data.union(worker.compute_log_prob(data))
    worker.update_actor(data)
    worker.save_checkpoint(str(tmp_path / "global_step_1" / "actor"), global_step=1)
    merged = AutoModelForCausalLM.from_pretrained(merge_checkpoint(str(tmp_path / "global_step_1"),
                                                                   str(tmp_path / "merged")), dtype=torch.float32)
    assert type(merged).__name__ == type(model).__name__
    trained = worker.actor_engine.module.eval()
    ids = torch.randint(4, model.config.vocab_size, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got, want, before = merged.eval()(ids).logits, trained(ids).logits, model(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got, before, atol=1e-4), f"{name}: the update did not change the model"
