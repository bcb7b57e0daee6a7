"""The SGLang adapter's pure parts (it cannot run here: SGLang has no CPU build)."""

from __future__ import annotations

import importlib.util

import pytest

from hybridflow.launch.config import load_config
from hybridflow.rollout import SamplingParams
from hybridflow.rollout.sglang.engine import UNVERIFIED_NOTICE, parse_sglang_output, sglang_server_args


def test_verl_keys_become_server_flags():
    cfg = load_config(["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "critic.ppo_micro_batch_size_per_gpu=4",
                       "actor_rollout_ref.rollout.name=sglang", "actor_rollout_ref.rollout.enable_prefix_caching=false",
                       "actor_rollout_ref.rollout.enforce_eager=true", "data.max_prompt_length=64",
                       "data.max_response_length=32", "+actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend=fa3"])
    args = sglang_server_args(cfg.actor_rollout_ref.rollout, "/m")
    joined = " ".join(args)
    for part in ("--model-path /m", "--tp-size 2", "--mem-fraction-static 0.5", "--max-running-requests 1024",
                 "--context-length 96", "--disable-radix-cache", "--disable-cuda-graph", "--chunked-prefill-size 8192",
                 "--enable-memory-saver", "--skip-tokenizer-init", "--attention-backend fa3"):
        assert part in joined


def test_generate_answers_become_token_outputs():
    data = {"output_ids": [5, 6, 2], "meta_info": {"output_token_logprobs": [[-0.1, 5, None], [-0.2, 6, None],
                                                                            [-0.3, 2, None]],
                                                    "finish_reason": {"type": "stop", "matched": 2}}}
    out = parse_sglang_output("r", data, True)
    assert out.token_ids == [5, 6, 2] and out.log_probs == [-0.1, -0.2, -0.3] and out.finish_reason == "stop"
    assert parse_sglang_output("r", {"output_ids": [1], "meta_info": {"finish_reason": {"type": "abort"}}},
                               False).finish_reason == "abort"


@pytest.mark.skipif(importlib.util.find_spec("sglang") is not None, reason="sglang is installed")
def test_missing_sglang_says_it_needs_a_gpu_machine():
    from hybridflow.rollout.sglang.engine import SGLangRolloutEngine

    with pytest.raises(ImportError, match=r"hybridflow\[sglang\].*GPU"):
        SGLangRolloutEngine("/m")
    assert "UNVERIFIED" in UNVERIFIED_NOTICE and "GPU" in UNVERIFIED_NOTICE


def test_payload_carries_seed_stops_and_log_probs(monkeypatch):
    from hybridflow.rollout.sglang.engine import SGLangRolloutEngine

    engine = SGLangRolloutEngine.__new__(SGLangRolloutEngine)  # no server: only the request builder
    import random
    import threading

    engine.eos_token_ids, engine._rng, engine._lock = (2,), random.Random(0), threading.Lock()
    body = engine.payload([1, 2, 3], SamplingParams(temperature=0.7, max_tokens=9, logprobs=True, seed=5,
                                                    stop_token_ids=(7,)))
    sp = body["sampling_params"]
    assert body["input_ids"] == [1, 2, 3] and body["return_logprob"] is True
    assert sp["max_new_tokens"] == 9 and sp["stop_token_ids"] == [7, 2] and sp["sampling_seed"] == 5
    assert sp["temperature"] == 0.7
