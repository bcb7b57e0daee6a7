"""reward_model.sandbox_fusion.* from the real config -> the reward manager scores code on a SandboxFusion server."""

from __future__ import annotations

import json
from types import SimpleNamespace as NS

import pytest

from hybridflow.launch.config import load_config
from hybridflow.rewards import load_reward_manager
from hybridflow.sandbox.http_service import serve_in_thread

BASE = ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8", "critic.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8"]
ADD = "```python\nprint(sum(map(int,input().split())))\n```"
IO = json.dumps({"inputs": ["1 2", "3 4", "5 5"], "outputs": ["3", "7", "11"]})  # the last case is wrong on purpose


@pytest.fixture(scope="module")
def served():
    srv, url = serve_in_thread(workers=2, max_timeout_s=5)
    yield srv, url
    srv.shutdown()
    srv.server_close()


def config(*overrides):
    return load_config(BASE + list(overrides))


@pytest.mark.parametrize("num_workers", [0, 1])
def test_code_rewards_run_on_the_configured_server(served, char_tokenizer, make_batch, num_workers):
    server, url = served
    cfg = config(f"reward_model.sandbox_fusion.url={url}", "reward_model.sandbox_fusion.max_concurrent=2",
                 f"reward_model.num_workers={num_workers}")
    manager = load_reward_manager(cfg, char_tokenizer)
    assert manager.reward_kwargs["concurrent_semaphore"].permits == 2 // max(num_workers, 1)
    batch = make_batch(char_tokenizer, ["p"], [ADD], [IO], ["codecontests"], prompt_len=4, response_len=64)
    before = server.service.programs_run
    try:
        out = manager(batch, return_dict=True)
    finally:
        manager.close()
    assert out["reward_tensor"].sum().item() == pytest.approx(2 / 3)
    assert server.service.programs_run - before == 3  # every case ran on the service, none locally


def test_verl_flat_key_and_refusals(served, char_tokenizer):
    url = served[1]
    with pytest.warns(Warning, match="old spelling"):
        assert config(f"reward_model.sandbox_fusion_url={url}").reward_model.sandbox_fusion.url == url
    for overrides, message in [
        (["reward_model.sandbox_fusion.max_concurrent=1", "reward_model.num_workers=2"], "max_concurrent=1 is below"),
        (["custom_reward_function.path=/x.py"], "custom_reward_function.path replaces them"),
        (["reward_model.sandbox_fusion.memory_limit_mb=8"], "memory_limit_mb=8"),
    ]:
        cfg = config(f"reward_model.sandbox_fusion.url={url}", *overrides)
        with pytest.raises(ValueError, match=message):
            load_reward_manager(cfg, char_tokenizer)
    with pytest.raises(ValueError, match="reward_model.sandbox_fusion.url: .* must be an http"):
        load_reward_manager(config("reward_model.sandbox_fusion.url=localhost:8080"), char_tokenizer)


def test_no_url_no_keywords(char_tokenizer):
    cfg = NS(reward_model=NS(reward_manager="naive", num_workers=0, timeout_s=5.0, error_score=0.0,
                             worker_memory_mb=4096, reward_kwargs={},
                             sandbox_fusion=NS(url=None, max_concurrent=64, memory_limit_mb=1024)),
             custom_reward_function=NS(path=None, name="compute_score"), data=NS(reward_fn_key="data_source"))
    assert load_reward_manager(cfg, char_tokenizer).reward_kwargs == {}
