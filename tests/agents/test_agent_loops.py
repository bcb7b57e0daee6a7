"""verl's agent-loop API: registry and YAML, the batch layout, and a user's loop through the whole trainer."""

from __future__ import annotations

import sys

import pytest
import torch

from hybridflow.agents import AgentLoopOutput, register, registered_agent_loops, resolve_agent_loop
from hybridflow.agents.base import AgentLoopBase, load_agent_loop_config
from hybridflow.agents.postprocess import outputs_to_batch
from run_helpers import assert_timings_are_durations, run, small_overrides


def test_batch_layout_masks_observations_and_places_scores():
    outs = [
        AgentLoopOutput(prompt_ids=[5, 6], response_ids=[7, 8, 9, 10], response_mask=[1, 0, 0, 1],
                        response_logprobs=[-0.5, 0.0, 0.0, -0.25], num_turns=4, reward_score=1.0,
                        extra_fields={"turn_scores": [0.5]}),
        AgentLoopOutput(prompt_ids=[4, 5, 6], response_ids=[11], response_mask=[1], response_logprobs=[-1.0],
                        num_turns=2, reward_score=0.0),
    ]
    b = outputs_to_batch(outs, prompt_length=3, response_length=5, pad_token_id=0)
    t = {k: v.tolist() for k, v in b.batch.items()}
    assert t["prompts"] == [[0, 5, 6], [4, 5, 6]]
    assert t["responses"] == [[7, 8, 9, 10, 0], [11, 0, 0, 0, 0]]
    assert t["response_mask"] == [[1, 0, 0, 1, 0], [1, 0, 0, 0, 0]]
    assert t["attention_mask"] == [[0, 1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0, 0, 0]]
    assert t["position_ids"] == [[0, 0, 1, 2, 3, 4, 5, 5], [0, 1, 2, 3, 3, 3, 3, 3]]
    assert t["input_ids"] == [[0, 5, 6, 7, 8, 9, 10, 0], [4, 5, 6, 11, 0, 0, 0, 0]]
    assert t["rollout_log_probs"] == [[-0.5, 0.0, 0.0, -0.25, 0.0], [-1.0, 0.0, 0.0, 0.0, 0.0]]
    assert t["rm_scores"] == [[0.0, 0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0]]
    assert b.non_tensor_batch["__num_turns__"].tolist() == [4, 2]
    assert b.non_tensor_batch["turn_scores"].tolist() == [[0.5], []]  # the stable schema: [] where a loop set none
    wide = outputs_to_batch(outs, prompt_length=1, response_length=5, pad_token_id=0)
    assert wide.batch["prompts"].shape == (2, 3)  # the longest prompt sets the width


def test_batch_layout_rejects_misaligned_outputs():
    bad = AgentLoopOutput(prompt_ids=[1], response_ids=[2, 3], response_mask=[1], num_turns=2)
    with pytest.raises(ValueError, match="mask entries"):
        outputs_to_batch([bad], 2, 4, 0)
    long = AgentLoopOutput(prompt_ids=[1], response_ids=[2, 3, 4], response_mask=[1, 1, 1], num_turns=2)
    with pytest.raises(ValueError, match="response_length=2"):
        outputs_to_batch([long], 2, 2, 0)


def test_registry_decorator_yaml_and_errors(agent_loop_yaml, tmp_path):
    @register("test_registry_loop")
    class Loop(AgentLoopBase):
        async def run(self, sampling_params, **kwargs):
            raise NotImplementedError

    assert resolve_agent_loop("test_registry_loop") == (Loop, {})
    assert "single_turn_agent" in registered_agent_loops()
    assert load_agent_loop_config(str(agent_loop_yaml)) == ["two_turn"]
    cls, extra = resolve_agent_loop("two_turn")
    assert cls.__name__ == "TwoTurnAgentLoop" and extra == {"first_turn_tokens": 2}
    with pytest.raises(KeyError, match="did you mean 'two_turn'"):
        resolve_agent_loop("two_trun")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- name: x\n  _target_: no_such_module_xyz.Loop\n")
    with pytest.raises(ImportError, match="no_such_module_xyz"):
        load_agent_loop_config(str(bad))
    bad.write_text("- name: x\n  _target_: collections.OrderedDict\n")
    with pytest.raises(TypeError, match="AgentLoopBase"):
        load_agent_loop_config(str(bad))
    bad.write_text("- _target_: a.B\n")
    with pytest.raises(ValueError, match="'name' and '_target_'"):
        load_agent_loop_config(str(bad))


def _two_turn_overrides(model_dir, data_dir, out_dir, yaml_path, backend):
    return small_overrides(model_dir, data_dir, out_dir, backend=backend, extra=[
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={yaml_path}",
        "actor_rollout_ref.rollout.agent.default_agent_loop=two_turn",
        "actor_rollout_ref.rollout.agent.num_workers=2",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "data.max_response_length=12", "algorithm.adv_estimator=grpo",
    ])


def _check_two_turn_run(history):
    steps = [m for m in history.metrics if "timing_s/step" in m]
    assert len(steps) == 2
    for m in steps:
        assert m["num_turns/mean"] == 4
        assert m["agent/observation_tokens/mean"] == 4  # "|ok|" in the char tokenizer
        assert m["agent/model_tokens/mean"] >= 3
        assert m["agent/error_count"] == 0
        assert m["training/rollout_probs_diff_mean"] < 1e-4  # model tokens only: observations are masked out
        assert "timing_s/agent_loop/generate_sequences/mean" in m
    assert "timing_s/update_actor" in assert_timings_are_durations(history.metrics)


@pytest.mark.slow
def test_user_agent_loop_from_yaml_trains_locally(tiny_model_dir, addition_rows, agent_loop_yaml, tmp_path):
    history = run(_two_turn_overrides(tiny_model_dir, addition_rows, tmp_path, agent_loop_yaml, "local"), tmp_path)
    _check_two_turn_run(history)


@pytest.mark.slow
@pytest.mark.ray
def test_user_agent_loop_from_yaml_trains_on_ray(ray_cluster, tiny_model_dir, addition_rows, agent_loop_yaml, tmp_path):
    history = run(_two_turn_overrides(tiny_model_dir, addition_rows, tmp_path, agent_loop_yaml, "ray"), tmp_path)
    _check_two_turn_run(history)


def test_multi_turn_rows_align_tokens_masks_and_log_probs(tiny_model_dir, addition_rows, agent_loop_yaml, tmp_path):
    """The rollout batch of a two-turn loop: observation tokens masked with log-prob 0, and the actor's own
    log-probs of the model tokens equal the rollout's."""
    from hybridflow.launch.config import load_config
    from hybridflow.launch.inputs import build_data, load_tokenizer_for
    from hybridflow.launch.run import build_runtime
    from hybridflow.trainer.stages import generate, prompts_from_loader

    cfg = load_config(_two_turn_overrides(tiny_model_dir, addition_rows, tmp_path, agent_loop_yaml, "local"))
    tok = load_tokenizer_for(cfg)
    loader, _ = build_data(cfg, tok)
    runtime = build_runtime(cfg, tok, total_training_steps=2)
    try:
        batch = generate(runtime.groups, prompts_from_loader(next(iter(loader))), {"global_steps": 1})
        obs = tok.encode("|ok|", add_special_tokens=False)
        responses, mask = batch.batch["responses"], batch.batch["response_mask"]
        for row in range(len(batch)):
            r = responses[row].tolist()
            first = next(i for i in range(len(r)) if r[i:i + len(obs)] == obs)
            assert mask[row, first:first + len(obs)].tolist() == [0] * len(obs)
            assert mask[row, :first].tolist() == [1] * first
            assert batch.batch["rollout_log_probs"][row, first:first + len(obs)].abs().sum() == 0
        batch.meta_info["temperature"] = cfg.actor_rollout_ref.rollout.temperature
        old = runtime.groups.actor_rollout.compute_log_prob(batch).batch["old_log_probs"]
        m = mask.bool()
        assert torch.allclose(old[m], batch.batch["rollout_log_probs"][m], atol=1e-5)
    finally:
        runtime.close()
        sys.modules.pop("two_turn_loop", None)


def test_a_response_ending_in_an_observation_credits_the_last_model_token():
    from hybridflow.rewards.managers import reward_positions

    ends_observed = AgentLoopOutput(prompt_ids=[1], response_ids=[5, 6, 7, 8], response_mask=[1, 1, 0, 0],
                                    num_turns=3, reward_score=2.0)
    failed = AgentLoopOutput(prompt_ids=[1], response_ids=[9], response_mask=[0], num_turns=0, reward_score=0.5)
    b = outputs_to_batch([ends_observed, failed], prompt_length=1, response_length=5, pad_token_id=0)
    assert b.batch["rm_scores"].tolist() == [[0.0, 2.0, 0.0, 0.0, 0.0], [0.5, 0.0, 0.0, 0.0, 0.0]]
    assert reward_positions(None, [4, 1]) == [3, 0]
