"""Reward functions that misbehave in each way a user's scorer can (loaded via custom_reward_function.path)."""

import time


def raises(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    raise RuntimeError("scorer bug: could not parse the answer")


def returns_nan(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return float("nan")


def returns_text(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return "correct"


def hangs(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    time.sleep(60)
    return 1.0


def exact_match(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """A normal 0/1 reward (used by the non-finite-gradient tests, where the loss itself is made non-finite)."""
    return float(solution_str.strip() == str(ground_truth))


_signalled = []


def _signal_once(signum):
    import os

    if not _signalled:
        _signalled.append(signum)
        os.kill(os.getpid(), signum)


def sends_sigterm(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """Delivers SIGTERM to this (controller) process in the middle of the first step's reward stage."""
    import signal

    _signal_once(signal.SIGTERM)
    return 0.0


def sends_sigint(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    import signal

    _signal_once(signal.SIGINT)
    return 0.0


def raises_on_some_prompts(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """A bug on the prompts whose dataset index is a multiple of 4 (2 of the 8 samples of a base_args step)."""
    if int(extra_info["index"]) % 4 == 0:
        raise RuntimeError(f"scorer bug on prompt {extra_info['index']}")
    return float(solution_str.strip() == str(ground_truth))


def wrong_signature(solution, answer):
    """Not verl's signature: the reward manager calls with data_source=, solution_str=, ground_truth=, ..."""
    return float(solution == answer)


def hangs_forever(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """Never answers (a scorer stuck on a lock or a socket); records when it was entered."""
    import os

    path = os.environ.get("HYBRIDFLOW_REWARD_STAMP")
    if path:
        with open(path, "a") as f:
            f.write(f"{time.time()}\n")
    time.sleep(3600)
    return 1.0


def returns_huge(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """Issue 24: a reward of 1e300 crashed the run (float32 overflow in the advantage computation)."""
    return 1e300 if len(solution_str) % 2 else -1e300
