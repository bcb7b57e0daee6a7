"""Standalone vLLM server replicas: start, token-in/token-out with log-probs, weight reload, abort, death, stop."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
import torch

from hybridflow.rollout import SamplingParams


@pytest.fixture(scope="module")
def model(varied_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(varied_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def fleet(varied_model_dir, engine_args, model, tmp_path_factory):
    from hybridflow.rollout.vllm.server_fleet import VLLMServerFleet

    kwargs = {**engine_args, "logprobs_mode": "processed_logprobs"}
    f = VLLMServerFleet(varied_model_dir, kwargs, n_servers=1, weights_source=lambda: model.named_parameters(),
                        log_dir=str(tmp_path_factory.mktemp("server_logs")))
    yield f
    f.shutdown()
    for server in f.servers:  # nothing of what the fleet started is left
        with pytest.raises(ProcessLookupError):
            os.killpg(server.proc.pid, 0)


def run(coro):
    return asyncio.run(coro)


async def _gather(client, prompts, params):
    try:
        return await asyncio.gather(*(client.generate(f"r{i}", p, params) for i, p in enumerate(prompts)))
    finally:
        await client.aclose()


def test_server_generates_like_hf_with_log_probs(fleet, model, tokenizer, prompts, hf_reference):
    hf_greedy, hf_log_probs = hf_reference
    client = fleet.replicas[0]
    outs = run(_gather(client, prompts, SamplingParams(do_sample=False, max_tokens=16, logprobs=True)))
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == hf_greedy(model, prompt, 16, tokenizer.eos_token_id)
        assert out.finish_reason == ("stop" if out.token_ids[-1] == tokenizer.eos_token_id else "length")
    sampled = run(_gather(client, prompts, SamplingParams(temperature=0.8, max_tokens=16, logprobs=True,
                                                          ignore_eos=True, seed=3)))
    diffs = torch.cat([(hf_log_probs(model, p, o.token_ids, 0.8) - torch.tensor(o.log_probs)).abs()
                       for p, o in zip(prompts, sampled)])
    print(f"server log-prob diff vs HF: mean {diffs.mean():.2e} max {diffs.max():.2e}")
    assert diffs.mean().item() <= 1e-4
    again = run(_gather(client, prompts, SamplingParams(temperature=0.8, max_tokens=16, ignore_eos=True, seed=3)))
    assert [o.token_ids for o in again] == [o.token_ids for o in sampled]


def test_weight_reload_then_greedy_equals_hf_with_the_new_weights(fleet, model, tokenizer, prompts, hf_reference):
    hf_greedy, _ = hf_reference
    with torch.no_grad():
        gen = torch.Generator().manual_seed(11)
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.3)
    seconds = fleet.update_weights()
    print(f"server weight reload: {seconds:.2f}s")
    assert seconds is not None and seconds > 0
    outs = run(_gather(fleet.replicas[0], prompts, SamplingParams(do_sample=False, max_tokens=16)))
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == hf_greedy(model, prompt, 16, tokenizer.eos_token_id)


def test_abort_all_returns_partial_outputs(fleet, prompts):
    client = fleet.replicas[0]
    budget = 230

    async def go():
        tasks = [asyncio.ensure_future(client.generate(f"long{i}", p, SamplingParams(max_tokens=budget, ignore_eos=True,
                                                                                      logprobs=True)))
                 for i, p in enumerate(prompts * 6)]
        await asyncio.sleep(0.5)
        await asyncio.to_thread(fleet.abort_all)
        try:
            return await asyncio.gather(*tasks)
        finally:
            await client.aclose()

    outs = run(go())
    aborted = [o for o in outs if o.finish_reason == "abort"]
    assert aborted, [o.finish_reason for o in outs]  # 36 x 230 tokens cannot all be done in 0.5 s
    assert all(len(o.token_ids) < budget for o in aborted)
    assert all(len(o.token_ids) == budget for o in outs if o.finish_reason != "abort")  # finished before the abort
    assert all(len(o.log_probs) == len(o.token_ids) for o in outs)
    after = run(_gather(client, prompts[:1], SamplingParams(max_tokens=4, ignore_eos=True)))
    assert after[0].finish_reason == "length"


def test_client_pickles_without_its_sessions(fleet):
    import pickle

    clone = pickle.loads(pickle.dumps(fleet.replicas[0]))
    assert clone.url == fleet.replicas[0].url and clone.name == fleet.replicas[0].name


def test_replicas_need_their_key_and_have_no_dev_endpoints(fleet):
    """Issue 24: replicas ran with VLLM_SERVER_DEV_MODE=1 and no key (/collective_rpc reached any worker method)."""
    import json
    import urllib.error
    import urllib.request

    server = fleet.servers[0]
    env = open(f"/proc/{server.proc.pid}/environ", "rb").read().split(b"\0")
    assert not any(e.startswith(b"VLLM_SERVER_DEV_MODE=") for e in env)
    assert server.api_key.encode() not in open(f"/proc/{server.proc.pid}/cmdline", "rb").read()  # not in `ps`

    def call(path, method="POST", key=None, body=b"{}"):
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        req = urllib.request.Request(f"{server.url}{path}", data=body if method == "POST" else None, method=method,
                                     headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code

    for path in ("/v1/completions", "/collective_rpc", "/sleep", "/hybridflow/reload_weights",
                 "/hybridflow/sleep?level=1", "/v1/load_lora_adapter", "/tokenize"):
        assert call(path) == 401, path
        assert call(path, key="wrong") == 401, path
    assert call("/health", method="GET") == 200 and call("/metrics", method="GET") == 200  # read-only, open
    assert call("/collective_rpc", key=server.api_key,
                body=json.dumps({"method": "reload_weights"}).encode()) == 404  # dev mode is off
    assert call("/hybridflow/reload_weights", key=server.api_key,
                body=json.dumps({"weights_path": "/nonexistent"}).encode()) == 400
    assert call("/hybridflow/pause?mode=abort", key=server.api_key) == 200
    assert call("/hybridflow/resume", key=server.api_key) == 200


def test_a_dead_replica_is_named(fleet, prompts):
    from hybridflow.rollout.vllm.server import VLLMServerError

    server = fleet.servers[0]
    os.killpg(server.proc.pid, signal.SIGKILL)  # the process group this fleet started
    server.proc.wait(timeout=30)
    with pytest.raises(VLLMServerError, match=r"replica 'vllm-server-0'"):
        run(_gather(fleet.replicas[0], prompts[:1], SamplingParams(max_tokens=4)))
    with pytest.raises(VLLMServerError, match=r"replica 'vllm-server-0'.*died with exit code"):
        fleet.wake_up(3)


def test_start_failure_shows_the_log_tail(varied_model_dir, engine_args, tmp_path):
    from hybridflow.rollout.vllm.server import VLLMServerError, VLLMServerProcess

    server = VLLMServerProcess({**engine_args, "model": varied_model_dir, "max_model_len": 100000}, name="bad",
                               log_dir=str(tmp_path))
    with pytest.raises(VLLMServerError, match=r"(?s)vLLM server 'bad' exited with code \d+ while starting.*"
                                              r"last log lines:.*max_model_len"):
        server.start()
    assert not server.alive()

