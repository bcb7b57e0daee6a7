"""A fleet of standalone vLLM server replicas: started and stopped by hybridflow, fed the actor's weights.

``VLLMServerFleet(model_path, engine_kwargs, n_servers, weights_source)`` starts ``n_servers``
:class:`~hybridflow.rollout.vllm.server.VLLMServerProcess` es (in parallel) and exposes one
:class:`~hybridflow.rollout.vllm.server.VLLMServerClient` per server as :attr:`replicas`.  Lifecycle:

* :meth:`update_weights` -- the actor's weights (HF names) that changed since the last sync are written as
  safetensors under /dev/shm with every tensor's digest, and every server's worker verifies the digests and
  reloads them in place (vLLM ``reload_weights`` through ``/collective_rpc``; tensors vLLM fuses into one
  parameter travel together, :func:`~hybridflow.rollout.weights.delta.vllm_load_group`).  A mismatch loads
  nothing there and the whole model is written again (``weight_sync/checksum_mismatch``).  With
  ``lora_rank > 0`` only the adapter is written (when it changed) and loaded as a new LoRA, which the clients
  then name in their requests.  Returns the seconds spent (``timing_s/update_weights``); :meth:`sync_metrics`
  has the ``weight_sync/*`` numbers.  ``weights_source`` is a callable yielding the full weights (the delta is
  then taken here) or an object with ``fetch(full) -> named tensors`` and ``commit(verified)`` that takes the
  delta on the actor's side, so unchanged tensors do not even leave it.
* :meth:`wake_up` / :meth:`sleep` -- on GPU vLLM's sleep mode (``free_cache_engine``); on CPU the servers keep
  their memory (vLLM has no CPU sleep mode).  ``wake_up`` also checks every server is alive and restarts the
  clients' seed streams at a function of the step.
* :meth:`abort_all`, :meth:`shutdown` (only the processes this fleet started).
* :meth:`interrupt` / :meth:`resume` -- partial rollout: every server aborts what it generates and holds until
  the resume; the clients then continue the interrupted requests with the new weights
  (:mod:`~hybridflow.rollout.vllm.server`).

A server that died is reported by :meth:`check`, naming the replica, its exit code and the first traceback of
its log; :meth:`explain` gives that account for an error a client saw.  A server with requests whose token
counters stand still for ``stall_timeout_s`` is stopped by the fleet's watchdog
(:mod:`~hybridflow.rollout.service.server_watch`, which reads the servers' ``/metrics``: the servers always collect
their statistics, whatever ``disable_log_stats`` says, unless the watchdog is off).
"""

from __future__ import annotations

import concurrent.futures
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

import torch

from hybridflow.rollout.service.fleet import RolloutFleet
from hybridflow.rollout.service.server_watch import ServerWatch
from hybridflow.rollout.vllm.server import VLLMServerClient, VLLMServerError, VLLMServerProcess
from hybridflow.rollout.vllm.weight_check import EXTENSION
from hybridflow.rollout.weights.delta import DeltaTracker, lora_group, vllm_load_group
from hybridflow.rollout.weights.transfer import (
    model_config,
    shm_folder,
    with_tied_head,
    write_lora_adapter,
    write_safetensors_folder,
)

if TYPE_CHECKING:
    from hybridflow.config.schema import PPOConfig

__all__ = ["VLLMServerFleet", "LORA_NAME"]

LORA_NAME = "actor_lora"  # the served name of the actor's adapter (clients request it when lora_rank > 0)

WeightsSource = Callable[[], Iterable[tuple[str, torch.Tensor]]]


def _server_engine_kwargs(model_path: str, engine_kwargs: dict[str, Any], device: str, lora_rank: int,
                          stall_timeout_s: float) -> dict[str, Any]:
    """The engine arguments of every server process; a vision-language model is refused here, before any server
    starts (the replicas take no images)."""
    from hybridflow.rollout.vllm.config import cpu_safe_chunking, enable_lora, vllm_vision_settings

    vllm_vision_settings(str(model_path), engine_kwargs.get("model_impl"), hybrid=False)
    kwargs = {**engine_kwargs, "model": str(model_path)}
    if stall_timeout_s > 0:  # the watchdog reads the servers' token counters (their log file gets stat lines)
        kwargs["disable_log_stats"] = False
    if kwargs.get("load_format") == "dummy":  # reloads read safetensors folders, which a dummy loader cannot
        kwargs["load_format"] = "auto"
    if device == "cpu":
        cpu_safe_chunking(kwargs)
    if lora_rank > 0:
        enable_lora(kwargs, lora_rank)
    kwargs.setdefault("worker_extension_cls", EXTENSION)  # the servers verify what they load
    return kwargs


class VLLMServerFleet(RolloutFleet):
    """``n_servers`` vLLM server processes and their clients (see the module docstring)."""

    def __init__(self, model_path: str, engine_kwargs: dict[str, Any], n_servers: int = 1,
                 weights_source: WeightsSource | None = None, *, device: str = "cpu", free_cache_engine: bool = True,
                 lora_rank: int = 0, lora_alpha: float = 16.0, seed: int = 0, log_dir: str | None = None,
                 start_timeout_s: float = 600.0, python: str | None = None, name: str = "vllm-server",
                 keep_awake: bool = False, delta: bool = True, stall_timeout_s: float = 300.0):
        kwargs = _server_engine_kwargs(model_path, engine_kwargs, device, lora_rank, stall_timeout_s)
        self.checked = kwargs["worker_extension_cls"] == EXTENSION
        self.model_path = str(model_path)
        self.weights_source = weights_source
        self.tracker = DeltaTracker(enabled=delta, group_of=lora_group if lora_rank > 0 else vllm_load_group)
        self.checksum_mismatches = 0
        self.last_sync: dict[str, float] = {}
        self.device = device
        self.free_cache_engine = bool(free_cache_engine)
        self.keep_awake = bool(keep_awake)  # async training: the servers generate while the actor trains
        self.lora_rank, self.lora_alpha = int(lora_rank), float(lora_alpha)
        self.seed = int(seed)
        self._tied = bool(model_config(self.model_path).get("tie_word_embeddings", False))
        self._shm_dir: str | None = None
        self._lora_version = 0
        self.servers = [VLLMServerProcess(kwargs, name=f"{name}-{i}", log_dir=log_dir, python=python,
                                          start_timeout_s=start_timeout_s) for i in range(int(n_servers))]
        self.watch = ServerWatch(self.servers, stall_timeout_s)
        self._start_all()
        self.watch.start()
        self.replicas = [VLLMServerClient(s.url, s.name, LORA_NAME if self.lora_rank > 0 else s.served_model_name,
                                          seed=self.seed + i, api_key=s.api_key) for i, s in enumerate(self.servers)]
        self._asleep = False
        if self.lora_rank > 0 and weights_source is not None:  # the clients name the adapter from the start
            try:
                self.update_weights()
            except BaseException:
                self.shutdown()
                raise

    def _start_all(self) -> None:
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(self.servers)) as pool:
            futures = [pool.submit(s.start) for s in self.servers]
            errors = [f.exception() for f in futures if f.exception() is not None]
        if errors:
            self.shutdown()
            raise errors[0]

    # ------------------------------------------------------------------ health
    def check(self) -> None:
        """Raise naming the first replica the watchdog stopped, or whose process died."""
        for server in self.servers:
            if server.name in self.watch.stalled:
                raise self.watch.stalled[server.name]
            server.check_alive()

    def explain(self, error: BaseException, wait_s: float = 5.0) -> VLLMServerError | None:
        """A replica's own account of ``error`` (what a client saw: a 500, a closed connection): its exit code
        if it died -- a server whose engine failed shuts down within seconds, so this waits up to ``wait_s`` --
        and the first traceback of its log (the root cause).  None when ``error`` names no replica here."""
        named = [s for s in self.servers if f"'{s.name}'" in str(error)]
        if not named:
            self.check()
            return None
        server = named[0]
        if server.name in self.watch.stalled:
            return self.watch.stalled[server.name]
        deadline = time.monotonic() + wait_s
        while server.alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        state = "is still up" if server.alive() else f"died with exit code {server.proc.poll()}"
        return VLLMServerError(f"vLLM server replica '{server.name}' ({server.url}) {state} after it failed requests "
                               f"({server.log_path}); {server.log_excerpt()}")

    # ------------------------------------------------------------------ lifecycle
    def wake_up(self, global_step: int | None = None) -> None:
        self.check()
        if self._asleep and self.device == "cuda":
            for server in self.servers:
                server.wake_up()
        self._asleep = False
        if global_step is not None:
            for i, client in enumerate(self.replicas):
                client.reseed(self.seed + 7919 * int(global_step) + i)

    def sleep(self) -> None:
        if self.keep_awake:
            return
        if self.free_cache_engine and self.device == "cuda":
            for server in self.servers:
                server.sleep(level=2 if self.lora_rank == 0 and self.weights_source is not None else 1)
        self._asleep = True

    def update_weights(self) -> float | None:
        """Push the weights that changed into every server (see the module docstring); seconds spent (``None``
        without a source)."""
        if self.weights_source is None:
            return None
        self.check()
        start = time.perf_counter()
        if self._shm_dir is None:
            self._shm_dir = shm_folder("vllm-fleet")
        if self.device == "cuda" and self._asleep and self.lora_rank == 0:  # weights discarded by sleep(level=2):
            for server in self.servers:  # their memory comes back first, and the reload must be complete
                server.wake_up()
            self._asleep = False
            self.tracker.forget()
        bad = self._push(full=False)
        mismatch = bool(bad)
        if mismatch:  # a server refused the files: nothing was loaded there; everything again
            self.checksum_mismatches += 1
            self._commit(False)
            bad = self._push(full=True)
            if bad:
                raise VLLMServerError(f"vLLM servers refused the weight files twice (digests of {bad[:3]} did not "
                                      f"match what was written to {self._shm_dir}): /dev/shm is unreliable")
        self._commit(True)
        seconds = time.perf_counter() - start
        self.last_sync = {**self._stats.weight_sync_metrics(), "weight_sync/checksum_mismatch": float(mismatch),
                          "weight_sync/checksum_mismatch_total": float(self.checksum_mismatches)}
        return seconds

    def _fetch(self, full: bool):
        source = self.weights_source
        if hasattr(source, "fetch"):  # the delta is taken on the actor's side
            tensors = list(source.fetch(full))
            self._stats = source.stats()
            return tensors
        tensors = list(self.tracker.select(source(), full))
        self._stats = self.tracker.stats
        return tensors

    def _commit(self, verified: bool) -> None:
        source = self.weights_source
        if hasattr(source, "commit"):
            source.commit(verified)
        elif verified:
            self.tracker.commit()
        else:
            self.tracker.forget()

    def _push(self, full: bool) -> list[str]:
        """Write the selected tensors and have every server verify and load them; names that did not verify."""
        tensors = self._fetch(full)
        if self.lora_rank > 0:
            return self._update_lora(tensors) if tensors else []
        if not tensors:
            return []  # nothing changed: nothing to write or reload
        if self._tied:
            tensors = with_tied_head(tensors)
        folder = str(Path(self._shm_dir) / "weights")
        checksums: dict[str, str] = {}
        write_safetensors_folder(tensors, folder, checksums if self.checked else None)
        sums = checksums if self.checked else None
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(self.servers)) as pool:
            results = list(pool.map(lambda s: s.reload_weights(folder, sums), self.servers))
        return sorted({n for r in results for n in r})

    def _update_lora(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> list[str]:
        """The adapter is served under one fixed name, so clients held by other processes stay valid: the
        old one is unloaded and the new one loaded between generations (no request is in flight then).  The
        servers verify the adapter's files first; returns the tensors that did not verify (nothing loaded)."""
        version = self._lora_version + 1
        folder = Path(self._shm_dir) / f"lora_v{version}"
        checksums: dict[str, str] = {}
        write_lora_adapter(tensors, folder, self.lora_rank, self.lora_alpha, self.model_path, checksums)
        if self.checked:
            bad = sorted({n for s in self.servers for n in s.check_folder(str(folder), checksums)})
            if bad:
                shutil.rmtree(folder, ignore_errors=True)
                return bad
        for server in self.servers:
            if self._lora_version:
                server.unload_lora(LORA_NAME)
            server.load_lora(LORA_NAME, str(folder))
        if self._lora_version:
            shutil.rmtree(Path(self._shm_dir) / f"lora_v{self._lora_version}", ignore_errors=True)
        self._lora_version = version
        return []

    def sync_metrics(self) -> dict[str, float]:
        """``weight_sync/*`` of the last :meth:`update_weights`."""
        return dict(self.last_sync)

    def abort_all(self) -> None:
        for server in self.servers:
            server.abort_all()

    def interrupt(self) -> int:
        """Abort every request in flight on every server and hold them for a weight sync; the clients continue
        the aborted requests after :meth:`resume`.  Returns 0: the servers do not report how many they cut."""
        self._each(lambda server: server.interrupt())
        return 0

    def resume(self) -> None:
        """End the hold: the interrupted requests continue with the servers' current weights."""
        self._each(lambda server: server.resume())

    def _each(self, call) -> None:
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(self.servers))) as pool:
            for future in [pool.submit(call, server) for server in self.servers]:
                future.result()

    def shutdown(self) -> None:
        """Stop every server this fleet started and remove its /dev/shm folder."""
        errors = []
        self.watch.stop()
        for client in getattr(self, "replicas", []):  # this process's HTTP sessions (agent-loop actors hold theirs)
            client.close_idle_sessions()
        for server in self.servers:
            try:
                server.stop()
            except Exception as e:  # noqa: BLE001 - stop the others anyway
                errors.append(e)
        if self._shm_dir is not None:
            shutil.rmtree(self._shm_dir, ignore_errors=True)
            self._shm_dir = None
        if errors:
            raise VLLMServerError(f"stopping the vLLM servers failed: {errors[0]}")

    @classmethod
    def from_config(cls, config: PPOConfig, weights_source: WeightsSource, device: str) -> "VLLMServerFleet":
        """Standalone replicas for a training run (``actor_rollout_ref.hybrid_engine=false``): as many servers as
        the rollout pool's devices hold engines (``rollout.nnodes x rollout.n_gpus_per_node / (TP x DP x PP)``,
        at least one; one on CPU), started from ``model.path`` and then given the actor's weights."""
        from hybridflow.rollout.vllm.config import vllm_engine_kwargs

        rc, mc, pool = config.actor_rollout_ref.rollout, config.actor_rollout_ref.model, config.rollout
        per_engine = int(rc.tensor_model_parallel_size) * int(rc.data_parallel_size) * \
            int(rc.pipeline_model_parallel_size)
        n_servers = max(1, int(pool.nnodes) * int(pool.n_gpus_per_node) // per_engine) if device == "cuda" else 1
        kwargs = vllm_engine_kwargs(rc, mc.path, device, lora_rank=int(mc.lora_rank), hybrid=False)
        fleet = cls(mc.path, kwargs, n_servers, weights_source, device=device,
                    free_cache_engine=bool(rc.free_cache_engine), lora_rank=int(mc.lora_rank),
                    lora_alpha=float(mc.lora_alpha), seed=int(rc.seed),
                    keep_awake=config.async_training.mode != "sync",
                    delta=bool((rc.checkpoint_engine.engine_kwargs or {}).get("delta", True)),
                    stall_timeout_s=float(rc.stall_timeout_s))
        if int(mc.lora_rank) == 0:  # LoRA fleets synced in __init__ already
            try:
                fleet.update_weights()
            except BaseException:
                fleet.shutdown()
                raise
        return fleet

    def __enter__(self) -> "VLLMServerFleet":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
