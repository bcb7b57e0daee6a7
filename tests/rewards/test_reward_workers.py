"""Scoring processes under misbehaving reward code (issue 34): a scorer that leaks memory is bounded, what a scorer
detaches dies with its worker, hung scorers time out together, and a judge is read strictly and blamed by name."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import torch

from hybridflow.rewards.custom_function import ScoreFnSpec
from hybridflow.rewards.pool import ERROR, OK, TIMEOUT, ScoringPool

SCORERS = str(Path(__file__).with_name("misbehaving_scorers.py"))


def task(i: int, **extra) -> dict:
    return {"data_source": "t", "solution_str": str(i), "ground_truth": "0", "extra_info": {"i": i, **extra}}


def pool(name: str, **kw) -> ScoringPool:
    return ScoringPool(ScoreFnSpec(path=SCORERS, name=name), **kw)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_a_leaking_scorer_is_bounded_by_recycling_its_worker(caplog):
    """The probe: 364 -> 2,284 MB in 4 steps. Scaled: 40 MiB kept per call, workers bounded at 150 MiB."""
    scoring = pool("leak", num_workers=1, timeout_s=30, memory_mb=150)
    try:
        pids, peaks = [], []
        for _ in range(3):  # three "steps" of four samples
            results = scoring.run([task(i, mb=40) for i in range(4)])
            assert [r.status for r in results] == [OK] * 4
            pids += [r.value["pid"] for r in results]
            peaks.append(max(w.rss_mb() for w in scoring._workers))
        assert len(set(pids)) >= 3  # replaced by fresh processes along the way
        assert max(peaks) < 150 + 40 + 10, peaks  # never more than one call past the bound
        assert "over reward_model.worker_memory_mb=150: replaced by a fresh process" in caplog.text
    finally:
        scoring.close()


def test_a_scorer_growing_inside_one_call_is_killed_with_a_reason():
    scoring = pool("balloon", num_workers=1, timeout_s=60, memory_mb=200)
    try:
        (result,) = scoring.run([task(0)])
    finally:
        scoring.close()
    assert result.status == ERROR and "reward_model.worker_memory_mb=200 MiB" in result.error
    assert scoring.recycled == 1


def test_processes_a_scorer_detaches_end_with_its_worker(tmp_path):
    """The probe: 32 processes started by reward code outlived the run."""
    scoring = pool("detach", num_workers=2, timeout_s=30)
    try:
        results = scoring.run([task(i, folder=str(tmp_path)) for i in range(4)])
        assert [r.status for r in results] == [OK] * 4
        pids = [int(p) for f in tmp_path.iterdir() for p in f.read_text().split()]
        assert len(pids) == 8 and all(alive(p) for p in pids)  # running while the workers serve
    finally:
        scoring.close()
    deadline = time.monotonic() + 20
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if alive(p)], "processes detached by the scorer outlived its workers"


def test_hung_scorers_time_out_together_not_one_after_another(tmp_path):
    """The probe: ~8 min a step at the default 30 s. With one worker, six hung samples used to take six time-outs
    in turn; after the first, the others now run side by side and time out together."""
    scoring = pool("hang", num_workers=1, timeout_s=5)
    try:
        results = scoring.run([task(i, folder=str(tmp_path)) for i in range(6)])
    finally:
        scoring.close()
    assert [r.status for r in results] == [TIMEOUT] * 6
    starts = sorted(float((tmp_path / f"start-{i}").read_text()) for i in range(6))
    # samples 2..6 all started within one time-out of each other (in turn they would start 5 s apart: 20 s)
    assert starts[-1] - starts[1] < 5, starts


def test_the_pool_returns_to_its_size_after_a_burst(tmp_path):
    scoring = pool("hang", num_workers=1, timeout_s=2)
    try:
        scoring.run([task(i, folder=str(tmp_path)) for i in range(4)])
        assert len(scoring._workers) == 1
    finally:
        scoring.close()


# ------------------------------------------------------------------------------------------------ judges
def test_judge_scores_are_read_strictly_on_the_declared_scale():
    from hybridflow.rewards.judge import JudgeParseError, parse_score

    assert parse_score("7", scale=10) == 0.7 and parse_score("Score: 7/10", scale=10) == 0.7
    assert parse_score("8 out of 10", scale=10) == 0.8 and parse_score("0", scale=10) == 0.0
    for reply, why in (("42", "outside its declared scale 0..10"), ("-3", "outside"), ("3, no, 7", "several"),
                       ("no idea", "no score"), ("nan", "no score")):
        with pytest.raises(JudgeParseError, match=why):
            parse_score(reply, scale=10)


def test_a_random_judge_cannot_score_beyond_the_scale():
    """The probe: a random judge scored ~2 on a 0-1 scale and trained. Its replies are failures now, never rewards."""
    import random

    from hybridflow.rewards.judge import JudgeParseError, parse_score

    rng = random.Random(0)
    scores, failures = [], 0
    for _ in range(500):
        reply = " ".join(rng.choice(["the", "answer", "is", str(rng.randint(0, 40)), "ok", "x"])
                         for _ in range(rng.randint(1, 6)))
        try:
            scores.append(parse_score(reply, scale=10))
        except JudgeParseError:
            failures += 1
    assert all(0.0 <= s <= 1.0 for s in scores) and failures > 250


def test_a_nan_judge_is_reported_as_the_judges_failure(nano_model_dir):
    """The engine's words for NaN logits blame the policy (actor_rollout_ref.*); under a judge they name the judge."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hybridflow.rewards.judge import JudgeClient, JudgeError
    from hybridflow.rollout import create_rollout_engine
    from hybridflow.rollout.service.judge_router import JudgeLimits, JudgeRouter
    from hybridflow.rollout.service.replica import InProcessReplica
    from hybridflow.rollout.service.server import RolloutServer

    tok = AutoTokenizer.from_pretrained(nano_model_dir)
    model = AutoModelForCausalLM.from_pretrained(nano_model_dir).eval()
    with torch.no_grad():
        model.lm_head.weight.fill_(float("nan"))
    server = RolloutServer(create_rollout_engine("hf", model=model, tokenizer=tok, seed=0), name="nan-judge")
    router = JudgeRouter([InProcessReplica(server)], tok, JudgeLimits(response_length=4, prompt_length=64),
                         defaults={"temperature": 0.0})
    try:
        with pytest.raises(JudgeError) as err:
            asyncio.run(JudgeClient(router.address, 30.0).chat([{"role": "user", "content": "1+1="}], max_tokens=3))
    finally:
        router.close()
        server.close()
    text = str(err.value)
    assert "the judge (reward_model.model.path) produced non-finite logits" in text, text
    assert "actor_rollout_ref" not in text and "the policy's weights" not in text
