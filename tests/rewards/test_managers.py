"""Reward managers on hand-built batches: placement, decoding, batch calls, DAPO overlong golden values."""

from __future__ import annotations

import pytest
import torch

from hybridflow.rewards import (
    REWARD_MANAGERS, BatchRewardManager, DAPORewardManager, NaiveRewardManager, OverlongBufferConfig, ScoringConfig,
    compute_reward,
    load_reward_manager,
)

INLINE = ScoringConfig(num_workers=0)


def test_registry_names():
    assert REWARD_MANAGERS.names() == ["batch", "dapo", "gdpo", "naive", "prime"]


def test_naive_places_score_on_last_valid_token(char_tokenizer, make_batch):
    data = make_batch(char_tokenizer, ["07+45=", "1+1="], ["52", "3"], ["52", "2"], ["synthetic/addition"] * 2)
    mgr = NaiveRewardManager(char_tokenizer, scoring=INLINE)
    out = mgr(data, return_dict=True)
    expected = torch.zeros(2, 8)
    expected[0, 2] = 1.0  # "5", "2", EOS -> 3 valid tokens, score at index 2; sample 1 is wrong (0.0)
    assert torch.equal(out["reward_tensor"], expected)
    assert out["reward_extra_info"] == {}
    assert out["reward_metrics"] == {"reward/error_count": 0.0, "reward/timeout_count": 0.0, "reward/error_rate": 0.0,
                                     "reward/clipped_count": 0.0, "reward/workers_recycled": 0.0}
    assert torch.equal(mgr(data), expected)  # return_dict=False gives the tensor


def test_prime_scores_per_sample_in_worker_processes_like_naive(char_tokenizer, make_batch):
    """verl's ``prime`` manager: per-sample scores from parallel scoring processes, same placement as naive."""
    data = make_batch(char_tokenizer, ["07+45=", "1+1="], ["52", "3"], ["52", "2"], ["synthetic/addition"] * 2)
    mgr = REWARD_MANAGERS.get("prime")(char_tokenizer, scoring=ScoringConfig(num_workers=2, timeout_s=30))
    try:
        out = mgr(data, return_dict=True)
    finally:
        mgr.close()
    expected = NaiveRewardManager(char_tokenizer, scoring=INLINE)(data)
    assert torch.equal(out["reward_tensor"], expected) and out["reward_tensor"].sum() == 1.0
    assert out["reward_metrics"]["reward/error_count"] == 0.0


def test_dict_results_become_extra_info_columns(char_tokenizer, make_batch):
    data = make_batch(char_tokenizer, ["q", "q"], ["Answer: 5", "Answer: 6"], ["5", "5"], ["math_dapo"] * 2,
                      response_len=12)
    out = NaiveRewardManager(char_tokenizer, scoring=INLINE)(data, return_dict=True)
    assert out["reward_extra_info"] == {"acc": [True, False], "pred": ["5", "6"], "score": [1.0, -1.0]}
    assert out["reward_tensor"][0, 9].item() == 1.0 and out["reward_tensor"][1, 9].item() == -1.0


def test_reward_kwargs_reach_the_scorer(char_tokenizer, make_batch):
    data = make_batch(char_tokenizer, ["q"], ["so 42"], ["42"], ["openai/gsm8k"])
    assert NaiveRewardManager(char_tokenizer, scoring=INLINE)(data).sum() == 0.0
    flexible = NaiveRewardManager(char_tokenizer, scoring=INLINE, reward_kwargs={"method": "flexible"})
    assert flexible(data).sum() == 1.0


def test_multi_turn_valid_length_uses_attention_mask(char_tokenizer, make_batch):
    data = make_batch(char_tokenizer, ["q"], ["52"], ["52"], ["synthetic/addition"])
    data.batch["response_mask"][0, 1] = 0  # e.g. a tool-output token: not trained on but part of the response
    assert NaiveRewardManager(char_tokenizer, scoring=INLINE)(data)[0, 2].item() == 1.0


def test_rm_scores_are_used_when_present(char_tokenizer, make_batch):
    data = make_batch(char_tokenizer, ["q"], ["52"], ["52"], ["synthetic/addition"])
    rm = torch.full((1, 8), 0.25)
    data.batch["rm_scores"] = rm
    out = NaiveRewardManager(char_tokenizer, scoring=INLINE)(data, return_dict=True)
    assert out["reward_tensor"] is rm
    scores, extra, metrics = compute_reward(data, NaiveRewardManager(char_tokenizer, scoring=INLINE))
    assert scores is rm and extra == {} and metrics == {}
    del data.batch["rm_scores"]
    scores, _, metrics = compute_reward(data, NaiveRewardManager(char_tokenizer, scoring=INLINE))
    assert scores[0, 2].item() == 1.0 and metrics["reward/error_count"] == 0.0


def batch_score(data_sources, solution_strs, ground_truths, extra_infos, bonus=0.0):
    return [float(s.strip() == g) + bonus for s, g in zip(solution_strs, ground_truths)]


def short_batch_score(data_sources, solution_strs, ground_truths, extra_infos):
    return [1.0]


def test_batch_manager_one_call_with_lists(char_tokenizer, make_batch):
    data = make_batch(char_tokenizer, ["a", "b", "c"], ["1", "2", "9"], ["1", "2", "3"], ["x"] * 3)
    mgr = BatchRewardManager(char_tokenizer, compute_score=batch_score, reward_kwargs={"bonus": 0.5}, scoring=INLINE)
    out = mgr(data, return_dict=True)
    assert out["reward_tensor"][:, 1].tolist() == [1.5, 1.5, 0.5]
    bad = BatchRewardManager(char_tokenizer, compute_score=short_batch_score, scoring=INLINE)
    out = bad(data, return_dict=True)
    assert out["reward_metrics"]["reward/error_count"] == 3.0 and out["reward_tensor"].sum() == 0.0
    assert "list of 3 scores, got 1 items" in bad.errors.first_error


class TestDAPO:
    # max_resp_len=10, buffer len=4, factor=1: expected length 6; L=7 -> -0.25, L=8 -> -0.5, L<=6 -> 0.
    def make(self, tok, log=True):
        cfg = OverlongBufferConfig(enable=True, len=4, penalty_factor=1.0, log=log)
        return DAPORewardManager(tok, scoring=INLINE, max_resp_len=10, overlong_buffer_cfg=cfg)

    def test_overlong_penalty_golden(self, char_tokenizer):
        mgr = self.make(char_tokenizer)
        assert [mgr.overlong_reward(n) for n in (5, 6, 7, 8, 10)] == [0.0, 0.0, -0.25, -0.5, -1.0]

    def test_manager_adds_penalty(self, char_tokenizer, make_batch):
        # response token counts incl. EOS: "52"+EOS = 3, "52    "+EOS = 7 (exact-match strips spaces), "5"*7+EOS = 8
        data = make_batch(char_tokenizer, ["q"] * 3, ["52", "52    ", "5555555"], ["52", "52", "52"],
                          ["synthetic/addition"] * 3, response_len=10)
        out = self.make(char_tokenizer)(data, return_dict=True)
        t = out["reward_tensor"]
        assert t[0, 2].item() == 1.0 and t[1, 6].item() == 0.75 and t[2, 7].item() == -0.5
        assert out["reward_extra_info"]["overlong_reward"] == [0.0, -0.25, -0.5]
        assert out["reward_extra_info"]["overlong"] == [False, True, True]

    def test_config_errors(self, char_tokenizer):
        with pytest.raises(ValueError, match="needs max_resp_len"):
            DAPORewardManager(char_tokenizer, scoring=INLINE, overlong_buffer_cfg={"enable": True, "len": 4})
        with pytest.raises(ValueError, match=r"overlong_buffer_cfg.len must be in \(0, max_resp_len=10\]"):
            DAPORewardManager(char_tokenizer, scoring=INLINE, max_resp_len=10,
                              overlong_buffer_cfg={"enable": True, "len": 20})


def test_load_reward_manager_from_config(char_tokenizer, tmp_path):
    from types import SimpleNamespace as NS

    cfg = NS(
        reward_model=NS(reward_manager="dapo", num_workers=0, timeout_s=5.0, error_score=-1.0, worker_memory_mb=4096,
                        reward_kwargs={"max_resp_len": 8, "overlong_buffer_cfg": {"enable": True, "len": 2}},
                        sandbox_fusion=NS(url=None, max_concurrent=64, memory_limit_mb=1024)),
        custom_reward_function=NS(path=None, name="compute_score"),
        data=NS(reward_fn_key="data_source"),
    )
    mgr = load_reward_manager(cfg, char_tokenizer)
    assert isinstance(mgr, DAPORewardManager) and mgr.max_resp_len == 8 and mgr.scoring.error_score == -1.0
    cfg.reward_model.reward_manager = "naiv"
    with pytest.raises(ValueError, match="reward_model.reward_manager: Unknown reward manager 'naiv'. Did you mean"):
        load_reward_manager(cfg, char_tokenizer)
    cfg.reward_model.reward_manager = "naive"
    with pytest.raises(ValueError, match="only apply to reward_manager=dapo"):
        load_reward_manager(cfg, char_tokenizer)


def test_reward_manager_class_from_a_file_verl09_importlib_source(char_tokenizer, tmp_path):
    """verl 0.9's reward.reward_manager.source=importlib: the class is loaded from module.path / module.name."""
    from types import SimpleNamespace as NS

    from hybridflow.utils.load_object import LoadObjectError

    (tmp_path / "my_manager.py").write_text(
        "from hybridflow.rewards import NaiveRewardManager\n"
        "class HalfManager(NaiveRewardManager):\n"
        "    pass\n"
        "class NotAManager:\n"
        "    pass\n")
    cfg = NS(
        reward_model=NS(reward_manager="naive", reward_loop_source="importlib",
                        reward_loop_module_path=str(tmp_path / "my_manager.py"), reward_loop_class_name="HalfManager",
                        num_workers=0, timeout_s=5.0, error_score=0.0, worker_memory_mb=4096, reward_kwargs={},
                        sandbox_fusion=NS(url=None, max_concurrent=64, memory_limit_mb=1024)),
        custom_reward_function=NS(path=None, name="compute_score"),
        data=NS(reward_fn_key="data_source"),
    )
    assert type(load_reward_manager(cfg, char_tokenizer)).__name__ == "HalfManager"
    cfg.reward_model.reward_loop_class_name = "NotAManager"
    with pytest.raises(LoadObjectError, match=r"reward.reward_manager.module.path: .*NotAManager' must be a subclass of "
                                              r"hybridflow.rewards.managers.RewardManager"):
        load_reward_manager(cfg, char_tokenizer)
