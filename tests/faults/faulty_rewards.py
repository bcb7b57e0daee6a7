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


def returns_huge(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """Issue 24: a reward of 1e300 crashed the run (float32 overflow in the advantage computation)."""
    return 1e300 if len(solution_str) % 2 else -1e300
