"""Custom reward functions in worker processes: raise / hang / NaN / non-number, async functions, bad paths."""

from __future__ import annotations


import pytest

from hybridflow.rewards import (
    NaiveRewardManager, RewardFunctionError, ScoreFnSpec, ScoringConfig, load_custom_reward_fn,
)

REWARD_FILE = '''
import asyncio, math, time

def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    if data_source == "raise":
        raise RuntimeError("scorer exploded on purpose")
    if data_source == "hang":
        time.sleep(60)
    if data_source == "nan":
        return math.nan
    if data_source == "text":
        return "very good"
    if data_source == "exit":
        import os
        os._exit(3)
    return kwargs.get("weight", 1.0) * float(solution_str.strip() == ground_truth)

def batch_score(data_sources, solution_strs, ground_truths, extra_infos):
    return [float(s.strip() == g) for s, g in zip(solution_strs, ground_truths)]

async def judge(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    await asyncio.sleep(0.01)
    return {"score": float(solution_str.strip() == ground_truth), "judge": "async"}
'''


@pytest.fixture(scope="module")
def reward_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("reward") / "my_reward.py"
    path.write_text(REWARD_FILE)
    return str(path)


def test_failures_are_counted_scored_and_never_hang(reward_file, char_tokenizer, caplog, make_batch):
    sources = ["ok", "raise", "hang", "nan", "text", "ok", "exit", "ok"]
    responses = ["1", "1", "1", "1", "1", "2", "1", "1"]
    data = make_batch(char_tokenizer, ["q"] * 8, responses, ["1"] * 8, sources)
    mgr = NaiveRewardManager(char_tokenizer, compute_score=ScoreFnSpec(path=reward_file),
                             reward_kwargs={"weight": 2.0},
                             scoring=ScoringConfig(num_workers=2, timeout_s=2.0, error_score=-0.5))
    try:
        assert mgr(make_batch(char_tokenizer, ["q"] * 2, ["1"] * 2, ["1"] * 2, ["ok"] * 2)).sum() == 4.0  # warm
        # the "hang" sample sleeps forever: returning at all shows the per-sample timeout fired (a hang would
        # hold the test until pytest's own timeout)
        with caplog.at_level("WARNING"):
            out = mgr(data, return_dict=True)
        scores = out["reward_tensor"][:, 1].tolist()  # one char + EOS -> score at index 1
        assert scores == [2.0, -0.5, -0.5, -0.5, -0.5, 0.0, -0.5, 2.0]
        metrics = out["reward_metrics"]
        assert metrics["reward/error_count"] == 4.0 and metrics["reward/timeout_count"] == 1.0
        assert metrics["reward/error_rate"] == 5 / 8
        warnings = [r for r in caplog.records if "reward function" in r.getMessage()]
        assert len(warnings) == 1  # the first failure is logged once, with its traceback
        assert "scorer exploded on purpose" in mgr.errors.first_error
        # the pool recovered: a second call works and counts afresh
        again = mgr(make_batch(char_tokenizer, ["q"], ["1"], ["1"], ["ok"]), return_dict=True)
        assert again["reward_tensor"][0, 1].item() == 2.0 and again["reward_metrics"]["reward/error_count"] == 0
        assert mgr.errors.total_errors == 4 and mgr.errors.total_timeouts == 1
    finally:
        mgr.close()


def test_async_custom_function(reward_file, char_tokenizer, make_batch):
    data = make_batch(char_tokenizer, ["q", "q"], ["7", "8"], ["7", "7"], ["any", "any"])
    for workers in (0, 1):
        mgr = NaiveRewardManager(char_tokenizer, compute_score=ScoreFnSpec(path=reward_file, name="judge"),
                                 scoring=ScoringConfig(num_workers=workers))
        out = mgr(data, return_dict=True)
        mgr.close()
        assert out["reward_tensor"][:, 1].tolist() == [1.0, 0.0]
        assert out["reward_extra_info"]["judge"] == ["async", "async"]


def test_in_process_errors_are_caught(reward_file, char_tokenizer, make_batch):
    data = make_batch(char_tokenizer, ["q", "q"], ["1", "1"], ["1", "1"], ["raise", "nan"])
    mgr = NaiveRewardManager(char_tokenizer, compute_score=ScoreFnSpec(path=reward_file),
                             scoring=ScoringConfig(num_workers=0))
    out = mgr(data, return_dict=True)
    assert out["reward_tensor"].sum() == 0.0 and out["reward_metrics"]["reward/error_count"] == 2.0


def test_load_errors_name_the_config_field(reward_file, tmp_path):
    assert load_custom_reward_fn(reward_file)("x", "1", "1") == 1.0
    with pytest.raises(RewardFunctionError, match="custom_reward_function.path='.*missing.py' does not exist"):
        load_custom_reward_fn(str(tmp_path / "missing.py"))
    with pytest.raises(RewardFunctionError) as err:
        load_custom_reward_fn(reward_file, "score_it")
    assert "custom_reward_function.name='score_it'" in str(err.value)
    assert "batch_score, compute_score, judge" in str(err.value)
    broken = tmp_path / "broken.py"
    broken.write_text("import not_a_real_module_xyz\n")
    with pytest.raises(RewardFunctionError, match="importing custom_reward_function.path=.*ModuleNotFoundError"):
        load_custom_reward_fn(str(broken))


def test_a_signature_the_manager_cannot_call_is_refused_when_the_manager_is_built(reward_file, char_tokenizer):
    from hybridflow.rewards import BatchRewardManager

    with pytest.raises(RewardFunctionError) as err:  # a batch function under the per-sample manager
        NaiveRewardManager(char_tokenizer, compute_score=ScoreFnSpec(reward_file, "batch_score"))
    assert f"custom_reward_function.path={reward_file} (custom_reward_function.name='batch_score')" in str(err.value)
    assert "batch_score(data_sources, solution_strs, ground_truths, extra_infos)" in str(err.value)
    with pytest.raises(RewardFunctionError, match=r"def compute_score\(data_sources, solution_strs, ground_truths"):
        BatchRewardManager(char_tokenizer, compute_score=ScoreFnSpec(reward_file, "compute_score"))
    with pytest.raises(RewardFunctionError, match="unexpected keyword argument 'bonus'"):  # reward_kwargs count
        BatchRewardManager(char_tokenizer, compute_score=ScoreFnSpec(reward_file, "batch_score"),
                           reward_kwargs={"bonus": 1.0})
    NaiveRewardManager(char_tokenizer, compute_score=ScoreFnSpec(reward_file), reward_kwargs={"bonus": 1.0}).close()


def test_bad_scoring_config():
    with pytest.raises(ValueError, match="reward_model.timeout_s must be > 0"):
        ScoringConfig(timeout_s=0)
    with pytest.raises(ValueError, match="reward_model.num_workers must be >= 0"):
        ScoringConfig(num_workers=-1)


def test_builtin_scorers_and_batch_function_in_a_worker(char_tokenizer, reward_file, make_batch):
    from hybridflow.rewards import BatchRewardManager

    data = make_batch(char_tokenizer, ["q"] * 3, ["#### 7", "\\boxed{0.5}", "9"], ["7", "\\frac{1}{2}", "9"],
                      ["openai/gsm8k", "lighteval/MATH", "synthetic/addition"], response_len=16)
    mgr = NaiveRewardManager(char_tokenizer, scoring=ScoringConfig(num_workers=1, timeout_s=30))
    try:
        out = mgr(data, return_dict=True)
        assert out["reward_tensor"].sum(-1).tolist() == [1.0, 1.0, 1.0]
        assert mgr.pool._workers[0].proc.poll() is None  # persistent worker, reused across calls
    finally:
        mgr.close()
    assert mgr.pool._workers == []
    batch = BatchRewardManager(char_tokenizer, compute_score=ScoreFnSpec(reward_file, "batch_score"),
                               scoring=ScoringConfig(num_workers=1))
    try:
        assert batch(data)[:, :].sum().item() == 1.0  # only the exact "9" == "9" matches
    finally:
        batch.close()
