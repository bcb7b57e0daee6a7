"""MoE routers in the actor's update (``engine/moe.py``): the auxiliary loss equals transformers' own, expert-load
metrics have verl's values, activation-checkpoint recomputation is not counted twice, and the actor adds the
loss only when ``output_router_logits`` is switched on (DeepSeek-V3, which defines none, refuses it)."""

from __future__ import annotations

import pytest
import torch

from hybridflow.engine.moe import MoESpec, expert_load_counts, expert_load_metrics, load_balancing_loss, record_routing
from hybridflow.utils.tiny_model import build_char_tokenizer, build_tiny_model, make_tiny_checkpoint


def _moe(family="qwen3-moe", **overrides):
    return build_tiny_model(build_char_tokenizer(), size="nano", family=family, initializer_range=0.2, **overrides)


def _padded_ids():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, 90, (3, 9), generator=g)
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[0, :4], mask[1, :1] = 0, 0  # left padding
    return ids, mask


def test_aux_loss_equals_transformers_with_padding():
    model = _moe(output_router_logits=True)
    spec = MoESpec.of(model)
    assert spec == MoESpec(num_experts=4, top_k=2, aux_loss_coef=0.001)
    ids, mask = _padded_ids()
    with record_routing(model) as record:
        out = model(input_ids=ids, attention_mask=mask)
    assert len(record.layers) == 2 and int(record.valid.sum()) == int(mask.sum())
    ours = load_balancing_loss(record, spec)
    torch.testing.assert_close(ours, out.aux_loss, rtol=1e-6, atol=1e-7)
    ours.backward()  # the loss reaches the routers' weights
    assert all(r.weight.grad is not None and r.weight.grad.abs().sum() > 0
               for r in (layer.mlp.gate for layer in model.model.layers))


def test_expert_load_counts_and_verl_violation_metrics():
    model = _moe()
    ids, mask = _padded_ids()
    with record_routing(model) as record, torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    counts = expert_load_counts(record, 4)
    assert counts.shape == (2, 4) and counts.sum(1).tolist() == [2.0 * mask.sum()] * 2  # k=2 per valid token
    # golden values: layer 0 perfectly balanced, layer 1 all on expert 0 (shares x E - 1 = [3, -1, -1, -1])
    m = expert_load_metrics(torch.tensor([[2.0, 2.0, 2.0, 2.0], [8.0, 0.0, 0.0, 0.0]]))
    assert m["actor/moe/max_vio/layer_0"] == 0.0 and m["actor/moe/max_vio/layer_1"] == 3.0
    assert m["actor/moe/min_vio/layer_1"] == -1.0 and m["actor/moe/avg_vio/layer_1"] == 1.5
    assert m["actor/moe/max_vio/max"] == 3.0 and m["actor/moe/max_vio/avg"] == 1.5
    assert m["actor/moe/avg_vio/avg"] == 0.75 and m["actor/moe/min_vio/max"] == 0.0
    assert expert_load_metrics(torch.zeros(2, 4)) == {}


def test_activation_checkpoint_recomputation_is_not_recorded():
    from hybridflow.engine.model_loader import enable_gradient_checkpointing

    model = _moe()
    model.train()
    enable_gradient_checkpointing(model)
    ids, mask = _padded_ids()
    with record_routing(model) as record:
        model(input_ids=ids, attention_mask=mask).logits.sum().backward()  # the backward re-runs every layer
    assert len(record.layers) == 2


def test_dense_models_have_no_spec_and_deepseek_refuses_the_aux_loss():
    assert MoESpec.of(build_tiny_model(build_char_tokenizer(), size="nano")) is None
    assert MoESpec.of(_moe("deepseek-v3")) == MoESpec(num_experts=4, top_k=2, aux_loss_coef=0.0)
    with pytest.raises(ValueError, match="output_router_logits=true.*deepseek_v3 defines no router_aux_loss_coef"):
        MoESpec.of(_moe("deepseek-v3", output_router_logits=True))


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    return str(make_tiny_checkpoint(tmp_path_factory.mktemp("qwen3_moe"), size="nano", family="qwen3-moe",
                                    initializer_range=0.2))


def _update(moe_dir, *overrides):
    """One single-micro-batch update of a fresh actor on a fixed batch: (metrics, router weights after)."""
    from hybridflow.launch.config import load_config
    from hybridflow.protocol import DataProto
    from hybridflow.workers.actor_rollout_ref import ActorRolloutRefWorker

    cfg = load_config([f"actor_rollout_ref.model.path={moe_dir}", f"critic.model.path={moe_dir}",
                       "algorithm.adv_estimator=grpo", "trainer.device=cpu", "trainer.n_gpus_per_node=1",
                       "data.train_batch_size=3", "actor_rollout_ref.rollout.n=1",
                       "actor_rollout_ref.actor.ppo_mini_batch_size=3",
                       "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3",
                       "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=3",
                       "actor_rollout_ref.model.enable_gradient_checkpointing=false",
                       "actor_rollout_ref.actor.optim.lr=0.1", *overrides])
    cfg.actor_rollout_ref.actor.optim.override_optimizer_config = {"eps": 1.0}  # Adam's first step ~ linear in grad
    worker = ActorRolloutRefWorker(cfg.actor_rollout_ref, "actor_rollout_ref")
    worker.init_model()
    ids, mask = _padded_ids()
    data = DataProto.from_dict({"input_ids": ids, "attention_mask": mask,
                                "position_ids": (mask.cumsum(-1) - 1).clamp(min=0), "responses": ids[:, -4:],
                                "response_mask": mask[:, -4:],
                                "advantages": torch.tensor([[1.0], [-1.0], [0.5]]).expand(3, 4).contiguous()})
    data.meta_info["temperature"] = 1.0
    data = data.union(worker.compute_log_prob(data))
    metrics = worker.update_actor(data).meta_info["metrics"]
    routers = {k: v for k, v in worker.actor_engine.full_state_dict().items() if k.endswith("mlp.gate.weight")}
    return metrics, routers, (ids, mask)


def test_the_actor_reports_expert_load_and_adds_the_aux_loss_only_when_asked(moe_dir):
    from transformers import AutoModelForCausalLM

    plain, routers_plain, (ids, mask) = _update(moe_dir)
    assert "actor/moe/max_vio/max" in plain and "actor/moe_aux_loss" not in plain
    assert plain["actor/moe/max_vio/max"][0] > 0.0  # a random router is not balanced
    aux, routers_aux, _ = _update(moe_dir, "+actor_rollout_ref.model.override_config.output_router_logits=true",
                                  "+actor_rollout_ref.model.override_config.router_aux_loss_coef=0.5")
    # one micro-batch on one rank: the reported term is the loss of this forward, which transformers computes too
    reference = AutoModelForCausalLM.from_pretrained(moe_dir, dtype=torch.float32, output_router_logits=True)
    with torch.no_grad():
        want = reference(input_ids=ids, attention_mask=mask).aux_loss.item()
    assert aux["actor/moe_aux_loss"][0] == pytest.approx(want, rel=1e-5)
    assert aux["actor/pg_loss"] == pytest.approx(plain["actor/pg_loss"], abs=1e-7)  # same forward, same policy loss
    moved = [not torch.allclose(routers_aux[k], routers_plain[k], atol=1e-7) for k in routers_plain]
    assert len(moved) == 2 and all(moved), "the auxiliary loss did not reach the routers' update"
