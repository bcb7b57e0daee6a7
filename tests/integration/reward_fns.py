"""A dense test reward so random-init tiny models get non-zero, varied rewards (and real gradients).

Exact-match rewards are all zero for an untrained model, which would make every advantage zero and every
"same metrics" comparison trivially true.  This one scores the share of digit characters in the answer.
"""


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    text = solution_str.strip()
    digits = sum(ch.isdigit() for ch in text)
    return {"score": digits / max(len(text), 1), "acc": float(text == str(ground_truth))}


def compute_score_spread(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """Any change of any character changes the score: greedy outputs of an untrained model still differ."""
    return (sum(ord(ch) * (i + 1) for i, ch in enumerate(solution_str)) % 11) / 10.0


def compute_score_thread(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """``compute_score`` plus whether it ran in the main thread (``reward_model.launch_reward_fn_async``)."""
    import threading

    out = compute_score(data_source, solution_str, ground_truth, extra_info)
    out["in_main_thread"] = float(threading.current_thread() is threading.main_thread())
    return out


def compute_score_slow_trainer(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """``compute_score_spread`` that takes 20 ms a sample: scored on the trainer's side, it makes the trainer slow
    against the rollout (async V1 tests)."""
    import time

    time.sleep(0.02)
    return compute_score_spread(data_source, solution_str, ground_truth, extra_info)


def compute_score_half_constant(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """Every sample of prompts whose answer is even scores 1.0 (a group DAPO filters out); others are spread."""
    if int(str(ground_truth).strip() or 0) % 2 == 0:
        return 1.0
    return compute_score_spread(data_source, solution_str, ground_truth, extra_info)


def compute_digit_share(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """The share of digits alone (a float in [0, 1]): PRIME takes it as the outcome label of the sample."""
    text = solution_str.strip()
    return sum(ch.isdigit() for ch in text) / max(len(text), 1)
