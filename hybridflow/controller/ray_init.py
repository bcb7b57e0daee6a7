"""Starting Ray for a run: a private local instance unless a cluster is named, and only hybridflow's lines.

Which Ray a run uses:

* ``ray_kwargs.ray_init.address`` set (``host:port``, ``auto``, ``ray://...``): that cluster; the run says so.
* else ``RAY_ADDRESS`` set in the environment: that cluster.  Setting the variable is an explicit request (it is
  how ``ray job submit`` hands its cluster to a job, and how a user points every run of a shell at a ``ray start
  --head`` cluster), so it is honoured, and the run says which cluster it joined and that unsetting the
  variable gives a private instance.
* else a new, private local instance, always.  A bare ``ray.init()`` would instead join the last cluster that
  ``ray start`` left on this machine (its address file, ``ray_current_cluster`` in Ray's temp dir) -- a stray
  cluster with other resources, other settings and other users' actors; hybridflow passes ``address="local"``,
  which makes Ray start a new instance whatever that file says.

A private instance gets lean defaults (no dashboard: ~1 s and ~150 MB on a laptop), a start that survives a busy
machine (Ray waits 30 s for its GCS server to publish its port and then gives up; on a 2-core laptop or CI runner
also busy with tests or model workers the GCS can need longer, so hybridflow allows :data:`LOCAL_START_WAIT_S`
through Ray's own ``RAY_gcs_server_port_wait_time_s``, unless the user set that variable, and a start whose GCS
never came up is cleaned away and tried once more, saying what its GCS process did) and a quiet start: Ray's
notices that ask nothing of the user are left out (see :data:`RAY_NOTICES_DROPPED`); an attached cluster keeps
its own settings.  Failures raise :class:`RayInitError` repeating what was asked.

Signals: in the driver (this process) Ray's C++ core would install abseil's failure signal handler, which
answers a SIGTERM with a register dump on the console and, once hybridflow's own handler has run, aborts the
process (exit 134) instead of letting the step finish and the checkpoint be written (exit 143).  The driver
therefore connects with that handler off -- Ray's ``RAY_DISABLE_FAILURE_SIGNAL_HANDLER`` switch, unless the user
set the variable -- and Python's ``faulthandler`` prints tracebacks of real crashes (SIGSEGV, SIGABRT, ...)
instead.  Worker processes keep Ray's handler.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from contextlib import contextmanager
from typing import Any, Iterator

from hybridflow.controller.errors import RayInitError

__all__ = ["init_ray", "RAY_NOTICES_DROPPED", "LOCAL_START_WAIT_S"]

# How long a new local instance may take to start its GCS server (Ray's default: 30 s) -- a bound, not a delay:
# a healthy start still takes ~1-2 s.
LOCAL_START_WAIT_S = 60

# Ray's start-up warnings that ask nothing of a hybridflow user: (the logger that emits it, its text), with why.
RAY_NOTICES_DROPPED = (
    # ray.init called off the main thread (a user's or a test's) does not install Ray's SIGTERM handler -- which is
    # what hybridflow wants: its handler finishes the step and checkpoints (on the main thread the handler in
    # place before ray.init is put back, see _connect).
    ("ray._private.worker", "SIGTERM handler is not set because current thread is not the main thread"),
    # Ray 2.60 turns token authentication on for a new local instance (it listens on the node's address) and
    # says so when RAY_AUTH_MODE is unset; keeping that protection needs no action.  The opposite notice
    # (authentication *disabled*) is a security warning and stays.
    ("ray._private.authentication.authentication_token_setup", "Token authentication is enabled for this Ray cluster"),
)


class _DropNotices(logging.Filter):
    def __init__(self, texts: list[str]):
        super().__init__()
        self.texts = texts

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(text in message for text in self.texts)


@contextmanager
def _quiet_start() -> Iterator[None]:
    """Leave Ray's no-action start-up notices out of the console while ``ray.init`` runs: a logging filter on each
    logger that emits one (everything else they log still shows)."""
    filters = []
    for name in dict.fromkeys(logger for logger, _ in RAY_NOTICES_DROPPED):
        notice_filter = _DropNotices([text for logger, text in RAY_NOTICES_DROPPED if logger == name])
        logging.getLogger(name).addFilter(notice_filter)
        filters.append((name, notice_filter))
    try:
        yield
    finally:
        for name, notice_filter in filters:
            logging.getLogger(name).removeFilter(notice_filter)


@contextmanager
def _patient_local_start() -> Iterator[None]:
    """Give a new local instance's GCS server :data:`LOCAL_START_WAIT_S` to start (Ray's
    ``RAY_gcs_server_port_wait_time_s``, read while ``ray.init`` starts the node) unless the user set the variable;
    restored afterwards, so a later connection from this process to a cluster keeps Ray's own retry count."""
    var = "RAY_gcs_server_port_wait_time_s"
    if var in os.environ:
        yield
        return
    os.environ[var] = str(LOCAL_START_WAIT_S)
    try:
        yield
    finally:
        os.environ.pop(var, None)


def _say(line: str) -> None:
    print(f"hybridflow: {line}", file=sys.stderr, flush=True)


def init_ray(ray_init_kwargs: dict[str, Any] | None = None) -> None:
    """Start a private local Ray instance, or connect to the cluster named by ``address`` / ``RAY_ADDRESS`` (see the
    module docstring); nothing when Ray is already initialised in this process."""
    import ray

    if ray.is_initialized():
        return
    _driver_signal_handling()
    kwargs = dict(ray_init_kwargs or {})
    address = kwargs.get("address")
    env_address = os.environ.get("RAY_ADDRESS", "")
    if address not in (None, "", "local"):
        where = f"the Ray cluster at ray_kwargs.ray_init.address={address!r}"
        _check_reachable(str(address))
        _connect(kwargs, where)
        _say(f"connected to {where}")
    elif address in (None, "") and env_address not in ("", "local"):
        kwargs.pop("address", None)  # ray.init reads RAY_ADDRESS itself
        where = f"the Ray cluster in RAY_ADDRESS={env_address!r}"
        _check_reachable(env_address, field="the RAY_ADDRESS environment variable")
        _connect(kwargs, where)
        _say(f"connected to {where} (unset RAY_ADDRESS to run on a private local instance instead)")
    else:
        kwargs["address"] = "local"  # never the cluster in Ray's address file
        kwargs.setdefault("include_dashboard", False)
        kwargs.setdefault("logging_level", logging.WARNING)  # hybridflow says what started (below)
        with _quiet_start(), _patient_local_start():
            _start_local(kwargs)
        resources = ray.cluster_resources()
        gpus = int(resources.get("GPU", 0))
        _say(f"started a private Ray instance ({int(resources.get('CPU', 0))} CPUs"
             + (f", {gpus} GPUs" if gpus else "") + "); to use a running cluster instead, set "
             "ray_kwargs.ray_init.address (or RAY_ADDRESS)")


def _driver_signal_handling() -> None:
    """Keep Ray's failure signal handler out of this (driver) process; crashes still print a traceback."""
    import faulthandler

    from ray._private import ray_constants

    if "RAY_DISABLE_FAILURE_SIGNAL_HANDLER" not in os.environ:  # Ray reads the variable once, when imported
        ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True
    if not faulthandler.is_enabled():
        faulthandler.enable()


def _connect(kwargs: dict[str, Any], where: str) -> None:
    import ray

    # On the main thread ray.init replaces the SIGTERM handler with one that exits at once; the run's own
    # (hybridflow's: finish the step, checkpoint, exit 143) or the default stays instead.
    on_main = threading.current_thread() is threading.main_thread()
    sigterm = signal.getsignal(signal.SIGTERM) if on_main else None
    try:
        ray.init(**kwargs)
    except Exception as e:  # noqa: BLE001 - re-raised with the request attached
        hint = ""
        if "auth" in f"{type(e).__name__} {e} {e.__cause__}".lower():
            hint = (" The cluster uses token authentication (what `ray start` of Ray 2.60 enables by default): "
                    "export RAY_AUTH_MODE=token on this machine (the token is read from ~/.ray/auth_token).")
        raise RayInitError(
            f"ray.init failed while connecting to {where} with arguments {kwargs}: {type(e).__name__}: {e}. "
            "Check ray_kwargs.ray_init (address, num_cpus, num_gpus) or run `ray status` on the cluster." + hint
        ) from e
    finally:
        if on_main and sigterm is not None:
            signal.signal(signal.SIGTERM, sigterm)


def _start_local(kwargs: dict[str, Any], attempts: int = 2) -> None:
    """Start a new local instance; a start whose GCS server never came up is cleaned away and tried once more.

    Seen on busy 2-core machines (a Ray GCS process that never wrote its port file nor a line of its log); what
    happened to that process -- exited with a code, or still running -- is said, and only a second failure is an
    error."""
    for attempt in range(1, attempts + 1):
        try:
            _connect(kwargs, "a new local Ray instance")
            return
        except RayInitError as e:
            state = _failed_gcs_start(e.__cause__)
            if state is None or attempt == attempts:
                if state is not None:
                    e.args = (f"{e.args[0]} ({state})",)
                raise
            _say(f"Ray's GCS server did not start ({state}); starting a new local instance again "
                 f"(attempt {attempt + 1} of {attempts})")


def _failed_gcs_start(error: BaseException | None) -> str | None:
    """If ``error`` is Ray's wait for a new node's GCS port that ran out, kill that node's processes and say what its
    GCS process did; None for any other failure (those are not retried)."""
    if error is None or "gcs_server_port" not in str(error):
        return None
    tb, node = error.__traceback__, None
    while tb is not None:  # the half-started Node is the `self` of a frame of the failed start
        candidate = tb.tb_frame.f_locals.get("self")
        if type(candidate).__name__ == "Node" and hasattr(candidate, "all_processes"):
            node = candidate
        tb = tb.tb_next
    if node is None:
        return "its GCS process could not be inspected"
    gcs = [info.process for info in node.all_processes.get("gcs_server", [])]
    code = gcs[0].poll() if gcs else None
    what = ("no GCS process was started" if not gcs else
            f"its GCS process (pid {gcs[0].pid}) exited with code {code}" if code is not None else
            f"its GCS process (pid {gcs[0].pid}) was still running without having published its port")
    try:
        node.kill_all_processes(check_alive=False, allow_graceful=False)
    except Exception:  # noqa: BLE001 - best effort: the reaper Ray spawned kills them when this process ends
        pass
    return f"{what} after {os.environ.get('RAY_gcs_server_port_wait_time_s', 30)} s"


def _check_reachable(address: str, timeout_s: float = 5.0, field: str = "ray_kwargs.ray_init.address") -> None:
    """Fail in seconds on an unreachable ``host:port`` (``ray.init`` itself retries for minutes)."""
    import socket

    if address == "auto" or "://" in address or ":" not in address:
        return  # "auto" reads RAY_ADDRESS / the local session; ray:// client addresses are checked by Ray
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            pass
    except (OSError, ValueError) as e:
        raise RayInitError(
            f"cannot reach the Ray head at {field}={address!r} ({type(e).__name__}: {e}). "
            "Start it with `ray start --head` on that machine, fix the address, or leave the address unset "
            "(and RAY_ADDRESS unset) to start a local Ray instance."
        ) from e
