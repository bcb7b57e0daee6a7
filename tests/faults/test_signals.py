"""GracefulInterrupt (trainer/signals.py) on its own: first signal = stop request, second = abandon the step."""

from __future__ import annotations

import io
import os
import signal
import threading

import pytest

from hybridflow.trainer.signals import GracefulInterrupt, exit_code_for


def test_exit_codes_follow_the_shell_convention():
    assert exit_code_for(signal.SIGINT) == 130
    assert exit_code_for(signal.SIGTERM) == 143


def test_first_signal_requests_a_stop_and_says_what_happens_next():
    err = io.StringIO()
    with GracefulInterrupt(stream=err) as interrupt:
        assert not interrupt.should_stop() and interrupt.exit_code == 0
        os.kill(os.getpid(), signal.SIGTERM)
        assert interrupt.should_stop() and interrupt.interrupted
    assert interrupt.exit_code == 143
    assert "SIGTERM received: finishing the current step" in err.getvalue()


def test_second_signal_abandons_the_step_and_keeps_the_first_exit_code():
    err = io.StringIO()
    reached_after_second = False
    with GracefulInterrupt(stream=err) as interrupt:
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)  # raises KeyboardInterrupt here; the context swallows it
        reached_after_second = True
    assert not reached_after_second
    assert interrupt.exit_code == 130  # the first signal decides the code
    assert "second SIGTERM: abandoning the current step" in err.getvalue()


def test_previous_handlers_are_restored():
    before = signal.getsignal(signal.SIGINT)
    with GracefulInterrupt(stream=io.StringIO()):
        assert signal.getsignal(signal.SIGINT) is not before
    assert signal.getsignal(signal.SIGINT) is before


def test_unrelated_keyboard_interrupt_is_not_swallowed():
    with pytest.raises(KeyboardInterrupt):
        with GracefulInterrupt(stream=io.StringIO()):
            raise KeyboardInterrupt  # no signal was handled: not ours to hide


def test_combine_stops_on_either_condition():
    budget = {"over": False}
    with GracefulInterrupt(stream=io.StringIO()) as interrupt:
        stop = interrupt.combine(lambda: budget["over"])
        assert not stop()
        budget["over"] = True
        assert stop()
        assert interrupt.combine(None) == interrupt.should_stop


def test_outside_the_main_thread_it_is_inert():
    seen = {}

    def body():
        with GracefulInterrupt(stream=io.StringIO()) as interrupt:
            seen["handler_installed"] = bool(interrupt._previous)
            seen["stop"] = interrupt.should_stop()

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert seen == {"handler_installed": False, "stop": False}
