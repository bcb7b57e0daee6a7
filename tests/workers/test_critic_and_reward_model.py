"""CriticWorker (values, clipped value update) and RewardModelWorker (last-token scores)."""

import pytest
import torch

from hybridflow.protocol import DataProto

CRITIC = [
    "algorithm.adv_estimator=gae",
    "critic.ppo_micro_batch_size_per_gpu=2",
    "critic.forward_micro_batch_size_per_gpu=4",
    "critic.model.enable_gradient_checkpointing=false",
    "critic.optim.lr=1e-2",
]


@pytest.fixture(scope="module")
def critic_worker(tiny_model_dir, config_factory):
    from hybridflow.workers.critic import CriticWorker

    cfg = config_factory(tiny_model_dir, *CRITIC, "critic.cliprange_value=0.05")
    worker = CriticWorker(cfg.critic)
    worker.init_model()
    return worker


def test_values_are_per_response_token_and_zero_on_padding(critic_worker, batches):
    data = batches.make_rollout_batch(critic_worker.engine.module.config.vocab_size, batch_size=4, seed=8)
    values = critic_worker.compute_values(data).batch["values"]
    mask = data.batch["response_mask"].bool()
    assert values.shape == mask.shape
    assert (values[~mask] == 0).all() and (values[mask] != 0).all()


def test_update_critic_clips_values_and_moves_toward_returns(critic_worker, batches):
    data = batches.make_rollout_batch(critic_worker.engine.module.config.vocab_size, batch_size=4, seed=9)
    mask = data.batch["response_mask"]
    values = critic_worker.compute_values(data).batch["values"]
    data.batch["values"] = values
    data.batch["returns"] = (values + 1.0) * mask  # far outside cliprange_value=0.05 of the old values
    metrics = critic_worker.update_critic(data).meta_info["metrics"]
    assert set(metrics) >= {"critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean", "critic/grad_norm", "critic/lr"}
    # first mini-batch: vpred == old values, (V - R)^2 = 1 everywhere; 0.5 * token-mean = 0.5
    assert metrics["critic/vf_loss"][0] == pytest.approx(0.5, rel=1e-5)
    assert metrics["critic/vf_clipfrac"][0] == 0.0
    assert metrics["critic/lr"] == [1e-2]
    new_values = critic_worker.compute_values(data).batch["values"]
    m = mask.bool()
    assert (new_values[m] - values[m]).mean() > 0  # moved toward the returns


def test_value_clipping_stops_gradient_beyond_the_clip_range(tiny_model_dir, config_factory, batches):
    """With old values far from the prediction, the clipped term dominates and carries no gradient."""
    from hybridflow.workers.critic import CriticWorker

    cfg = config_factory(tiny_model_dir, *CRITIC, "critic.cliprange_value=0.1")
    worker = CriticWorker(cfg.critic)
    worker.init_model()
    data = batches.make_rollout_batch(worker.engine.module.config.vocab_size, batch_size=4, seed=10)
    mask = data.batch["response_mask"]
    values = worker.compute_values(data).batch["values"]
    data.batch["values"] = (values - 5.0) * mask  # V_old 5 below V: clip(V) = V_old + 0.1, far below R
    data.batch["returns"] = (values + 1.0) * mask
    metrics = worker.update_critic(data).meta_info["metrics"]
    assert metrics["critic/vf_clipfrac"][0] == pytest.approx(1.0)
    assert metrics["critic/grad_norm"][0] == pytest.approx(0.0, abs=1e-6)


def test_reward_model_scores_land_on_the_last_response_token(tiny_model_dir, config_factory, batches):
    from hybridflow.engine.forward import last_token_scores
    from hybridflow.workers.reward_model import RewardModelWorker

    cfg = config_factory(tiny_model_dir, "reward_model.enable=true", f"reward_model.model.path={tiny_model_dir}",
                         f"reward_model.model.input_tokenizer={tiny_model_dir}")
    worker = RewardModelWorker(cfg.reward_model)
    worker.init_model()
    assert worker.retokenize is False
    data = batches.make_rollout_batch(worker.engine.module.config.vocab_size, batch_size=4, seed=11)
    rm = worker.compute_rm_score(data).batch["rm_scores"]
    b = data.batch
    with torch.no_grad():
        expected = last_token_scores(worker.engine.module, b["input_ids"], b["attention_mask"], b["position_ids"])
    last = b["response_mask"].sum(-1) - 1
    for i in range(4):
        assert rm[i, last[i]] == pytest.approx(float(expected[i]), abs=1e-6)
        assert (rm[i].abs() > 0).sum() == 1


def test_reward_model_with_another_tokenizer_rerenders_the_chat(tiny_model_dir, bpe_model_dir, config_factory):
    from hybridflow.engine.forward import last_token_scores
    from hybridflow.engine.model_loader import load_tokenizer
    from hybridflow.workers.reward_model import RewardModelWorker

    cfg = config_factory(tiny_model_dir, "reward_model.enable=true", f"reward_model.model.path={bpe_model_dir}",
                         f"reward_model.model.input_tokenizer={tiny_model_dir}")
    worker = RewardModelWorker(cfg.reward_model)
    worker.init_model()
    assert worker.retokenize is True
    policy_tok = load_tokenizer(tiny_model_dir)
    chat = [{"role": "user", "content": "1+2="}]
    prompt = policy_tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
    prompt = prompt["input_ids"] if isinstance(prompt, dict) or hasattr(prompt, "keys") else prompt
    response = policy_tok("3", add_special_tokens=False)["input_ids"] + [policy_tok.eos_token_id]
    P, R = len(prompt), len(response) + 2
    ids = torch.tensor([prompt + response + [policy_tok.pad_token_id] * 2])
    attn = torch.tensor([[1] * (P + len(response)) + [0, 0]])
    data = DataProto.from_dict(
        {"prompts": ids[:, :P], "responses": ids[:, P:], "input_ids": ids, "attention_mask": attn,
         "position_ids": (attn.cumsum(-1) - 1).clamp(min=0), "response_mask": attn[:, P:]},
        {"raw_prompt": [chat]},
    )
    rm = worker.compute_rm_score(data).batch["rm_scores"]
    text = worker.rm_tokenizer.apply_chat_template(chat + [{"role": "assistant", "content": "3"}], tokenize=False)
    enc = worker.rm_tokenizer(text, return_tensors="pt", add_special_tokens=False)
    pos = torch.arange(enc["input_ids"].shape[1])[None]
    with torch.no_grad():
        expected = last_token_scores(worker.engine.module, enc["input_ids"], enc["attention_mask"], pos)
    assert rm.shape == (1, R)
    assert rm[0, len(response) - 1] == pytest.approx(float(expected[0]), abs=1e-6)
