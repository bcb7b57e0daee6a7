"""``init_ray`` fails fast and says what was asked (no Ray instance is started here)."""

from __future__ import annotations


import pytest

from hybridflow.controller import RayInitError, init_ray

ray = pytest.importorskip("ray")


def test_unreachable_address_fails_in_seconds_not_minutes():
    assert not ray.is_initialized()
    with pytest.raises(RayInitError, match=r"cannot reach the Ray head at ray_kwargs.ray_init.address='127.0.0.1:9'"):
        init_ray({"address": "127.0.0.1:9"})  # nothing listens on the discard port: a probe fails, no retry loop
    assert not ray.is_initialized()


def test_bad_ray_init_argument_is_named():
    with pytest.raises(RayInitError, match=r"(?s)a new local Ray instance with arguments .*num_cpuz"):
        init_ray({"num_cpuz": 2})
    assert not ray.is_initialized()
