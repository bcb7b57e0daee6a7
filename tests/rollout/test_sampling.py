"""SamplingParams validation / config mapping, and the vectorised sampler against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from hybridflow.rollout.hf.token_sampler import RowSampling, _filter_top_k_top_p, sample_next_tokens
from hybridflow.rollout.sampling_params import SamplingParams


def rows(params, vocab=4):
    return RowSampling.build(params, vocab, torch.device("cpu"))


def test_params_validation_names_the_field():
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1.0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="top_k"):
        SamplingParams(top_k=-2)
    with pytest.raises(ValueError, match="n must be"):
        SamplingParams(n=0)
    with pytest.raises(ValueError, match="response_length"):
        SamplingParams(max_tokens=0)


def test_params_normalisation():
    assert SamplingParams(top_k=0).top_k == -1  # HF's "off" spelling
    assert SamplingParams(do_sample=False).greedy and SamplingParams(temperature=0.0).greedy
    assert not SamplingParams(temperature=0.7).greedy
    assert SamplingParams(temperature=0.7).logprob_temperature == 0.7
    assert SamplingParams(temperature=0.7, do_sample=False).logprob_temperature == 1.0
    assert SamplingParams(stop_token_ids=(5,)).with_stop_tokens([3, 5]).stop_token_ids == (5, 3)


def test_from_rollout_config_reads_verl_keys():
    from hybridflow.launch.config import load_config

    cfg = load_config([
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.temperature=0.8",
        "actor_rollout_ref.rollout.top_p=0.9",
        "actor_rollout_ref.rollout.top_k=20",
        "actor_rollout_ref.rollout.response_length=64",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        "actor_rollout_ref.rollout.val_kwargs.temperature=0.5",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "critic.ppo_micro_batch_size_per_gpu=8",
    ])
    rollout = cfg.actor_rollout_ref.rollout
    train = SamplingParams.from_rollout_config(rollout, eos_token_ids=[7])
    assert (train.n, train.temperature, train.top_p, train.top_k, train.max_tokens) == (4, 0.8, 0.9, 20, 64)
    assert train.logprobs and train.do_sample and train.stop_token_ids == (7,)
    val = SamplingParams.from_rollout_config(rollout, validate=True)
    assert (val.n, val.temperature, val.top_p, val.top_k, val.max_tokens) == (1, 0.5, 1.0, -1, 64)


def test_log_prob_is_temperature_scaled_unfiltered_golden():
    # logits [1, 2, 3] at T=2 -> scaled [0.5, 1, 1.5]; log-softmax of index 2 =
    # 1.5 - log(e^0.5 + e^1 + e^1.5) = 1.5 - log(1.64872 + 2.71828 + 4.48169) = 1.5 - 2.18027 = -0.68027
    logits = torch.tensor([[1.0, 2.0, 3.0, -50.0]])
    tokens, lp = sample_next_tokens(logits, rows([SamplingParams(temperature=2.0, top_k=1)]), torch.Generator())
    assert tokens.item() == 2  # top_k=1 keeps only the arg-max
    expected = 1.5 - math.log(math.exp(0.5) + math.exp(1.0) + math.exp(1.5) + math.exp(-25.0))
    assert lp.item() == pytest.approx(expected, abs=1e-6)
    assert expected == pytest.approx(-0.68027, abs=1e-5)


def test_greedy_rows_take_argmax_and_log_prob_at_temperature_one():
    logits = torch.tensor([[0.0, 1.0, 0.5, 0.0], [3.0, 0.0, 0.0, 0.0]])
    params = [SamplingParams(do_sample=False, temperature=0.3), SamplingParams(temperature=0.5)]
    tokens, lp = sample_next_tokens(logits, rows(params), torch.Generator().manual_seed(0))
    assert tokens[0].item() == 1
    assert lp[0].item() == pytest.approx(torch.log_softmax(logits[0], -1)[1].item(), abs=1e-6)
    assert lp[1].item() == pytest.approx(torch.log_softmax(logits[1] / 0.5, -1)[tokens[1]].item(), abs=1e-6)


def test_top_p_keeps_smallest_nucleus_golden():
    # probs [0.5, 0.3, 0.15, 0.05]: top_p=0.6 keeps {0, 1} (0.5 < 0.6, 0.8 >= 0.6); top_p=0.5 keeps {0}.
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.5, 0.3, 0.15, 0.05]]))
    out = _filter_top_k_top_p(logits, rows([SamplingParams(top_p=0.6), SamplingParams(top_p=0.5)]))
    assert torch.isfinite(out[0]).tolist() == [True, True, False, False]
    assert torch.isfinite(out[1]).tolist() == [True, False, False, False]
    assert torch.equal(out[0, :2], logits[0, :2])


def test_top_k_then_top_p_per_row():
    logits = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.1, 0.2, 0.3, 0.4]]))
    params = [SamplingParams(top_k=2), SamplingParams(top_k=3, top_p=0.5)]
    out = _filter_top_k_top_p(logits, rows(params))
    assert torch.isfinite(out[0]).tolist() == [False, False, True, True]
    # top-3 renormalised: [0.2, 0.3, 0.4]/0.9 -> 0.444 < 0.5 so the 2nd (0.333) is kept too
    assert torch.isfinite(out[1]).tolist() == [False, False, True, True]


def test_sampling_frequencies_follow_softmax_and_seed_repeats():
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    logits = torch.log(probs).expand(20000, 4).contiguous()
    rs = rows([SamplingParams()] * 20000)
    tokens, _ = sample_next_tokens(logits, rs, torch.Generator().manual_seed(1))
    freq = torch.bincount(tokens, minlength=4).float() / tokens.numel()
    assert torch.allclose(freq, probs, atol=0.015)
    again, _ = sample_next_tokens(logits, rs, torch.Generator().manual_seed(1))
    assert torch.equal(tokens, again)
