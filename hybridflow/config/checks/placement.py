"""Rules for split placement and asynchronous training: every key acts in the mode that reads it, or is refused.

* ``actor_rollout_ref.hybrid_engine=false`` puts standalone rollout replicas on their own pool
  (``rollout.nnodes x rollout.n_gpus_per_node``); the trainer pushes weights to them through the checkpoint
  engine (``actor_rollout_ref.rollout.checkpoint_engine.*``).  With the colocated hybrid engine those keys have
  nothing to act on.
* ``async_training.mode`` picks the controller: ``sync``, ``one_step_off`` or ``fully_async``; both async modes
  need the split placement (the colocated ``hf`` engine generates with the very module the actor trains).
* The other ``async_training.*`` keys and ``rollout.total_rollout_steps/total_epochs/test_freq`` act in
  ``fully_async`` only.  In that mode a trainer step takes ``require_batches x ppo_mini_batch_size`` prompts,
  which becomes the effective ``data.train_batch_size`` (verl writes 0 there).
"""

from __future__ import annotations

from typing import Any
from hybridflow.config.checks.parallel import n_devices

__all__ = ["ASYNC_MODES", "CHECKPOINT_ENGINE_BACKENDS", "check_async_config", "fully_async_batch_prompts"]

ASYNC_MODES = ("sync", "one_step_off", "fully_async")
CHECKPOINT_ENGINE_BACKENDS = ("naive", "gloo", "nccl")

_FULLY_ASYNC_KEYS = (
    "async_training.staleness_threshold", "async_training.trigger_parameter_sync_step",
    "async_training.require_batches", "async_training.partial_rollout", "async_training.use_rollout_log_probs",
    "async_training.compute_prox_log_prob", "async_training.use_trainer_do_validate",
    "async_training.checkpoint_engine.enable", "async_training.checkpoint_engine.device_buffer_size_M",
    "async_training.checkpoint_engine.overlap_broadcast_and_consume",
)
_POOL_KEYS = ("rollout.nnodes", "rollout.n_gpus_per_node")
_CKPT_ENGINE_KEYS = ("actor_rollout_ref.rollout.checkpoint_engine.backend",
                     "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes")


def _default(key: str) -> Any:
    """What a key is when nobody set it (the defaults file)."""
    from hybridflow.config.key_policy import default_of

    return default_of(key)


def _get(cfg, key: str) -> Any:
    obj = cfg
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj


def _changed(cfg, key: str) -> bool:
    return _get(cfg, key) != _default(key)


def fully_async_batch_prompts(cfg) -> int:
    """Prompts per fully async trainer step: ``require_batches x ppo_mini_batch_size``."""
    return int(cfg.async_training.require_batches) * int(cfg.actor_rollout_ref.actor.ppo_mini_batch_size)


def check_async_config(cfg, errors: list[str], notes: list[str]) -> None:
    """Append the placement / async problems of ``cfg`` to ``errors``; normalise fully async batch sizes."""
    mode = cfg.async_training.mode
    if mode not in ASYNC_MODES:
        errors.append(f"async_training.mode={mode!r} is not a training mode; choose one of: {', '.join(ASYNC_MODES)}")
        return
    _check_placement(cfg, errors)
    if mode != "sync" and not cfg.split_placement:
        errors.append(f"async_training.mode={mode} generates while the actor trains, which the colocated hybrid "
                      "engine cannot (it generates with the module being trained): set "
                      "actor_rollout_ref.hybrid_engine=false and size the rollout pool with rollout.nnodes / "
                      "rollout.n_gpus_per_node")
    if mode == "fully_async":
        _check_fully_async(cfg, errors)
        return
    for key in _FULLY_ASYNC_KEYS:
        if _changed(cfg, key):
            errors.append(f"{key}={_get(cfg, key)!r} acts in fully async training only; set "
                          f"async_training.mode=fully_async (or use python -m "
                          "hybridflow.experimental.fully_async_policy.fully_async_main), or remove the key")
    pool = cfg.rollout
    if pool.total_rollout_steps is not None:
        errors.append(f"rollout.total_rollout_steps={pool.total_rollout_steps} counts the prompts of a fully async "
                      f"run; with async_training.mode={mode} the run length is trainer.total_training_steps / "
                      "trainer.total_epochs")
    for key, trainer_key in (("total_epochs", "total_epochs"), ("test_freq", "test_freq")):
        if getattr(pool, key) != getattr(cfg.trainer, trainer_key):
            errors.append(f"rollout.{key}={getattr(pool, key)} acts in fully async training only; with "
                          f"async_training.mode={mode} set trainer.{trainer_key}")


def _check_placement(cfg, errors: list[str]) -> None:
    _check_checkpoint_engine(cfg, errors)
    if not cfg.split_placement:
        _check_colocated(cfg, errors)
    else:
        _check_rollout_pool(cfg, errors)


def _check_checkpoint_engine(cfg, errors: list[str]) -> None:
    ce = cfg.actor_rollout_ref.rollout.checkpoint_engine
    if ce.backend not in CHECKPOINT_ENGINE_BACKENDS:
        errors.append(f"actor_rollout_ref.rollout.checkpoint_engine.backend={ce.backend!r} is not available; choose "
                      f"one of: {', '.join(CHECKPOINT_ENGINE_BACKENDS)} (naive: gloo on CPU, NCCL on GPU)")
    if ce.update_weights_bucket_megabytes < 1:
        errors.append("actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes must be >= 1")
    extra = {k: v for k, v in (ce.engine_kwargs or {}).items() if k != "delta"}
    if extra:
        errors.append(f"actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs={ce.engine_kwargs!r}: the "
                      "broadcast checkpoint engine takes one argument, delta (true: send only the tensors that "
                      "changed since the last sync; false: every tensor every time); remove the others")
    if not isinstance((ce.engine_kwargs or {}).get("delta", True), bool):
        errors.append("actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.delta must be true or false")


def _check_colocated(cfg, errors: list[str]) -> None:
    """The colocated vLLM engine reloads the actor's weights in buckets of update_weights_bucket_megabytes, and so
    does the hf engine next to an actor split by tensor / expert / pipeline parallelism (it keeps its own copy);
    otherwise the
    colocated hf engine generates with the actor's own module and no weights move."""
    rc = cfg.actor_rollout_ref.rollout
    ce = rc.checkpoint_engine
    bucket_key, backend_key = _CKPT_ENGINE_KEYS[1], _CKPT_ENGINE_KEYS[0]
    actor = cfg.actor_rollout_ref.actor
    split = actor.strategy == "megatron" and (int(actor.megatron.tensor_model_parallel_size) > 1
                                              or int(actor.megatron.expert_model_parallel_size) > 1
                                              or int(actor.megatron.pipeline_model_parallel_size or 1) > 1)
    # the hf engine split over rollout.tensor_model_parallel_size ranks is filled by the switch, in buckets
    split = split or (rc.name == "hf" and int(rc.tensor_model_parallel_size) > 1 and n_devices(cfg) > 1)
    acting = () if rc.name == "vllm" or split else (bucket_key,)
    if rc.name != "vllm" and not split and (ce.engine_kwargs or {}).get("delta", True) is not True:
        errors.append("actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.delta=false: the colocated hf "
                      "engine generates with the actor's own module, no weights travel; remove the key")
    for key in (*_POOL_KEYS, backend_key, *acting):
        if _changed(cfg, key):
            errors.append(f"{key}={_get(cfg, key)!r} acts only when the rollout has its own pool: with "
                          f"actor_rollout_ref.hybrid_engine=true the {rc.name} engine is colocated with the "
                          "actor. Set actor_rollout_ref.hybrid_engine=false, or remove the key")


def _check_rollout_pool(cfg, errors: list[str]) -> None:
    """Standalone replicas: a pool with devices, hf replicas fed by the checkpoint engine or vLLM servers."""
    rc = cfg.actor_rollout_ref.rollout
    pool = cfg.rollout
    if pool.nnodes < 1 or pool.n_gpus_per_node < 1:
        errors.append(f"rollout.nnodes={pool.nnodes} x rollout.n_gpus_per_node={pool.n_gpus_per_node}: the rollout "
                      "pool needs at least one device (one replica per device)")
    if rc.name == "vllm":  # OpenAI-compatible vLLM server processes, reloading a safetensors copy of the weights
        for key in _CKPT_ENGINE_KEYS:
            if _changed(cfg, key):
                errors.append(f"{key}={_get(cfg, key)!r}: standalone vLLM servers (hybrid_engine=false, "
                              "rollout.name=vllm) reload the actor's weights from a shared-memory safetensors copy, "
                              "not through the broadcast checkpoint engine; remove the key")
        return
    if rc.name != "hf":
        errors.append(f"actor_rollout_ref.rollout.name={rc.name}: standalone rollout replicas "
                      "(actor_rollout_ref.hybrid_engine=false) run the hf engine or vLLM servers in this version; "
                      "set rollout.name=hf or vllm, or hybrid_engine=true")
    if int(cfg.actor_rollout_ref.model.lora_rank) > 0:
        errors.append("actor_rollout_ref.model.lora_rank>0 with actor_rollout_ref.hybrid_engine=false and "
                      "rollout.name=hf: standalone hf replicas hold plain weights and the adapters are not merged "
                      "for them; train LoRA with the hybrid engine (hybrid_engine=true) or with rollout.name=vllm "
                      "(adapter-only sync)")


def _check_fully_async(cfg, errors: list[str]) -> None:
    at = cfg.async_training
    if at.staleness_threshold < 0:
        errors.append(f"async_training.staleness_threshold={at.staleness_threshold} must be >= 0 (0: every sample "
                      "is generated by the weights it is trained from)")
    if at.trigger_parameter_sync_step < 1 or at.require_batches < 1:
        errors.append("async_training.trigger_parameter_sync_step and async_training.require_batches must be >= 1")
        return
    if at.checkpoint_engine.device_buffer_size_M < 1:
        errors.append("async_training.checkpoint_engine.device_buffer_size_M must be >= 1 (MB per bucket)")
    _check_fully_async_sizes(cfg, errors)
    _check_fully_async_features(cfg, errors)
    _check_fully_async_stream(cfg, errors)


def _check_fully_async_sizes(cfg, errors: list[str]) -> None:
    """A trainer step's prompts (require_batches x ppo_mini_batch_size) against verl's batch keys."""
    at, data = cfg.async_training, cfg.data
    prompts = fully_async_batch_prompts(cfg)
    if data.train_batch_size not in (0, prompts):
        errors.append(f"data.train_batch_size={data.train_batch_size}: a fully async trainer step takes "
                      f"async_training.require_batches={at.require_batches} x ppo_mini_batch_size="
                      f"{cfg.actor_rollout_ref.actor.ppo_mini_batch_size} = {prompts} prompts; set "
                      f"data.train_batch_size=0 (as verl) or {prompts}")
    if data.gen_batch_size not in (0, 1, prompts, data.train_batch_size):  # its default is train_batch_size
        errors.append(f"data.gen_batch_size={data.gen_batch_size}: the fully async rollouter streams one prompt at a "
                      "time; set data.gen_batch_size=1 (as verl)")


def _check_fully_async_features(cfg, errors: list[str]) -> None:
    """What fully async training reads differently (pi_old, validation, DAPO, the KV cache, weight buckets)."""
    at, rc = cfg.async_training, cfg.actor_rollout_ref.rollout
    if at.use_rollout_log_probs and not rc.calculate_log_probs:
        errors.append("async_training.use_rollout_log_probs=true trains with the rollout's own log-probs as pi_old: "
                      "set actor_rollout_ref.rollout.calculate_log_probs=true (or use_rollout_log_probs=false to "
                      "recompute them)")
    if at.compute_prox_log_prob and at.trigger_parameter_sync_step > 1:
        errors.append("async_training.compute_prox_log_prob=true anchors pi_old at the weights of the last sync, which "
                      "the trainer no longer holds after its first step of a version: use "
                      "async_training.trigger_parameter_sync_step=1 with it")
    if at.use_trainer_do_validate:
        errors.append("async_training.use_trainer_do_validate=true: validation runs on the rollout replicas (every "
                      "rollout.test_freq weight versions); the trainer pool has no rollout engine. Remove the key")
    if cfg.algorithm.filter_groups.enable:
        errors.append("algorithm.filter_groups.enable=true (DAPO dynamic sampling) is not available in fully async "
                      "training, whose trainer takes fixed-size batches from the stream; use async_training.mode="
                      "one_step_off or sync")
    if rc.free_cache_engine:
        errors.append("actor_rollout_ref.rollout.free_cache_engine=true: fully async replicas generate without pause, "
                      "so there is never a moment to free their KV cache; set it to false (as verl's config does)")
    if _changed(cfg, "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes"):
        errors.append("actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes does not act in "
                      "fully async training; its bucket is async_training.checkpoint_engine.device_buffer_size_M")


def _check_fully_async_stream(cfg, errors: list[str]) -> None:
    """The rollouter's own horizon and validation schedule; the effective step size written for the later checks."""
    data, pool = cfg.data, cfg.rollout
    prompts = fully_async_batch_prompts(cfg)
    if pool.total_rollout_steps is not None and pool.total_rollout_steps < prompts:
        errors.append(f"rollout.total_rollout_steps={pool.total_rollout_steps} is fewer prompts than one trainer step "
                      f"({prompts})")
    if pool.total_epochs < 1:
        errors.append(f"rollout.total_epochs={pool.total_epochs}: at least one pass over the data")
    if cfg.trainer.test_freq > 0 and cfg.trainer.test_freq != pool.test_freq:
        errors.append(f"trainer.test_freq={cfg.trainer.test_freq}: fully async training validates every "
                      f"rollout.test_freq weight versions (now {pool.test_freq}); set rollout.test_freq instead")
    if data.train_batch_size in (0, prompts) and data.gen_batch_size in (0, 1, prompts, data.train_batch_size):
        data.train_batch_size = prompts  # the batch checks and the loader see the effective step size
        data.gen_batch_size = prompts
