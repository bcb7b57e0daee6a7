"""verl's reward loop: training trajectories are scored in the agent loops as they finish, with the same
scores the trainer's reward stage would give; validation still scores in the trainer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from run_helpers import run, small_overrides

DENSE = [f"custom_reward_function.path={Path(__file__).parents[1] / 'integration' / 'reward_fns.py'}",
         "custom_reward_function.name=compute_score"]  # {"score": share of digits, "acc": exact}


def test_agent_loops_score_training_trajectories_like_the_reward_stage(tiny_model_dir, addition_rows, tmp_path):
    from hybridflow.launch.config import load_config
    from hybridflow.launch.inputs import build_data, build_reward_fns, load_tokenizer_for
    from hybridflow.launch.run import build_runtime
    from hybridflow.trainer.stages import generate, prompts_from_loader

    cfg = load_config(small_overrides(tiny_model_dir, addition_rows, tmp_path, extra=[
        "actor_rollout_ref.rollout.agent.num_workers=2", "reward_model.num_workers=0", *DENSE]))
    assert cfg.reward_model.use_reward_loop  # verl's default
    tok = load_tokenizer_for(cfg)
    loader, _ = build_data(cfg, tok)
    reward_fn, _ = build_reward_fns(cfg, tok)
    runtime = build_runtime(cfg, tok, total_training_steps=2)
    try:
        prompts = prompts_from_loader(next(iter(loader)))
        batch = generate(runtime.groups, prompts.select(deepcopy=True), {"global_steps": 1})
        assert "rm_scores" in batch.batch and batch.meta_info["reward_extra_keys"] == ["acc", "score"]
        rescored = reward_fn(batch.select(batch_keys=[k for k in batch.batch.keys() if k != "rm_scores"],
                                          non_tensor_batch_keys=list(batch.non_tensor_batch)), return_dict=True)
        assert torch.equal(batch.batch["rm_scores"], rescored["reward_tensor"])
        assert batch.batch["rm_scores"].sum() > 0  # a dense reward: not a batch of zeros
        assert list(batch.non_tensor_batch["score"]) == rescored["reward_extra_info"]["score"]
        val = generate(runtime.groups, prompts.select(deepcopy=True), {"global_steps": 1, "validate": True})
        assert "rm_scores" not in val.batch  # validation scores in the trainer (examples printed there)
    finally:
        runtime.close()
        reward_fn.close()


def _scores(history):
    return [(m["critic/score/mean"], m["reward_extra/acc/mean"]) for m in history.metrics if "timing_s/step" in m]


@pytest.mark.slow
def test_training_is_the_same_with_and_without_the_reward_loop(tiny_model_dir, addition_rows, tmp_path):
    on = run(small_overrides(tiny_model_dir, addition_rows, tmp_path / "on", extra=DENSE), tmp_path / "on")
    off = run(small_overrides(tiny_model_dir, addition_rows, tmp_path / "off",
                              extra=["reward_model.use_reward_loop=false", *DENSE]), tmp_path / "off")
    assert _scores(on) == _scores(off) and len(_scores(on)) == 2


@pytest.mark.slow
@pytest.mark.ray
def test_reward_loop_on_ray_uses_one_scorer_actor(ray_cluster, tiny_model_dir, addition_rows, tmp_path):
    """Two agent-loop workers share one scorer actor; a run with one worker scores in that worker's process (no
    scorer actor at all); both score and train alike."""
    ray = ray_cluster

    def scorer_actors() -> int:  # the GCS keeps dead actors too: every scorer actor the runs ever started
        return sum(a.get("ActorClassName") == "TrajectoryScorer" for a in ray._private.state.actors().values())

    two = run(small_overrides(tiny_model_dir, addition_rows, tmp_path / "two", backend="ray",
                              extra=["actor_rollout_ref.rollout.agent.num_workers=2", *DENSE]), tmp_path / "two")
    assert scorer_actors() == 1
    one = run(small_overrides(tiny_model_dir, addition_rows, tmp_path / "one", backend="ray", extra=DENSE),
              tmp_path / "one")
    assert scorer_actors() == 1  # the one-worker run started none
    for history in (two, one):
        steps = [m for m in history.metrics if "timing_s/step" in m]
        assert len(steps) == 2 and all(m["reward/error_count"] == 0 and "reward_extra/acc/mean" in m for m in steps)
    assert _scores(one) == _scores(two)


class _EchoScorer:
    """Scores each row with its ``index``; records the columns it was given."""

    def __init__(self, fail: bool = False):
        self.fail, self.columns = fail, []

    def score(self, rows):
        if self.fail:
            raise RuntimeError("scorer down")
        self.columns.append(sorted(rows.non_tensor_batch))
        return [{"score": float(i), "extra": {}} for i in rows.non_tensor_batch["index"]]


def _row(index: int, **extra):
    import numpy as np

    from hybridflow.protocol import DataProto

    columns = {"index": np.array([index], dtype=object)}
    columns.update({k: np.array([v], dtype=object) for k, v in extra.items()})
    return DataProto.from_dict({"responses": torch.zeros(1, 2, dtype=torch.long)}, columns)


def test_one_tick_scores_trajectories_whose_extra_fields_differ():
    """A tool trajectory flagged ``tokenization_mismatch`` finishing in the same tick as unflagged ones: one
    scoring call with the column None where absent (a KeyError there used to leave every trajectory waiting)."""
    import asyncio

    from hybridflow.agents.reward_loop import ScorerClient

    scorer = _EchoScorer()
    client = ScorerClient(scorer)

    async def both():
        flagged = _row(1, tokenization_mismatch="x")
        return await asyncio.wait_for(asyncio.gather(client.score(_row(0)), client.score(flagged)), 5)

    assert [r["score"] for r in asyncio.run(both())] == [0.0, 1.0]
    assert scorer.columns == [["index", "tokenization_mismatch"]]


def test_a_failing_scorer_fails_every_waiting_trajectory():
    import asyncio

    from hybridflow.agents.reward_loop import ScorerClient

    client = ScorerClient(_EchoScorer(fail=True))

    async def both():
        return await asyncio.wait_for(asyncio.gather(client.score(_row(0)), client.score(_row(1)),
                                                     return_exceptions=True), 5)

    assert [str(e) for e in asyncio.run(both())] == ["scorer down", "scorer down"]
