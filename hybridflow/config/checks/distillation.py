"""Rules for on-policy distillation (verl 0.9's ``distillation.*``): at least one teacher with a model path, one
teacher per routing key, teacher pool sizes that add up, a loss mode that is built; and the reading of
``distillation.teacher_models`` into :class:`TeacherEntry` (used by ``trainer/teachers.py``)."""

from __future__ import annotations

from typing import Any

from hybridflow.config.key_policy import changed_keys

__all__ = ["check_distillation", "teacher_entries", "TeacherEntry", "DISTILLATION_MODES", "TEACHER_INFERENCE_KEYS"]

DISTILLATION_MODES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
# of a teacher's ``inference`` node, the keys read here (the teacher scores with a forward pass of its own worker
# group, not an inference engine: the engine's keys have no effect)
TEACHER_INFERENCE_KEYS = ("dtype", "tensor_model_parallel_size", "data_parallel_size", "temperature")


class TeacherEntry:
    """One teacher of ``distillation.teacher_models``: the routing ``key``, its ``model_path``, how many processes
    it takes on its own pool (``world_size``) and its log-prob ``temperature``."""

    def __init__(self, name: str, key: str, model_path: str, world_size: int, temperature: float, dtype: str):
        self.name, self.key, self.model_path = name, key, model_path
        self.world_size, self.temperature, self.dtype = world_size, temperature, dtype

    def __repr__(self) -> str:
        return f"TeacherEntry({self.name!r}, key={self.key!r}, model_path={self.model_path!r})"


def teacher_entries(distillation: Any) -> tuple[list[TeacherEntry], list[str]]:
    """The teachers of ``distillation.teacher_models`` and the errors found reading them.

    As in verl, the default entry ``teacher_model`` is the single teacher (serving every row) unless other entries
    are added, in which case it is dropped and each entry needs its ``key``."""
    errors: list[str] = []
    raw = dict(distillation.teacher_models or {})
    if len(raw) > 1:
        raw.pop("teacher_model", None)
    single = len(raw) == 1
    pool = int(distillation.n_gpus_per_node) * int(distillation.nnodes)
    out: list[TeacherEntry] = []
    for name, entry in raw.items():
        where = f"distillation.teacher_models.{name}"
        if not isinstance(entry, dict):
            errors.append(f"{where} must be a mapping with key, model_path, num_replicas")
            continue
        unknown = sorted(set(entry) - {"key", "model_path", "num_replicas", "inference", "_target_"})
        if unknown:
            errors.append(f"{where} has unknown keys {unknown}; it takes key, model_path, num_replicas, inference")
        path = entry.get("model_path")
        if not path:
            errors.append(f"{where}.model_path is not set: give the teacher's checkpoint (a folder or hub name)")
        key = entry.get("key")
        if key is None and not single:
            errors.append(f"{where}.key is not set: with several teachers each serves the rows whose "
                          f"{distillation.teacher_key} equals its key")
        inference = dict(entry.get("inference") or {})
        per_replica = int(inference.get("tensor_model_parallel_size", 1)) * int(inference.get("data_parallel_size", 1))
        replicas = int(entry.get("num_replicas") or 0)
        if single and replicas == 0 and pool > 0:
            if pool % per_replica:
                errors.append(f"{where}: the teacher pool of {pool} processes (distillation.n_gpus_per_node x nnodes) is "
                              f"not a multiple of its {per_replica} processes per replica")
            replicas = max(pool // per_replica, 1)
        out.append(TeacherEntry(name, "default" if single and key is None else str(key), str(path),
                                max(replicas, 1) * per_replica, float(inference.get("temperature", 1.0)),
                                str(inference.get("dtype", "bfloat16"))))
    keys = [t.key for t in out]
    for key in sorted({k for k in keys if keys.count(k) > 1}):
        errors.append(f"distillation.teacher_models: two teachers serve key {key!r}; give each its own key")
    if not out and not errors:
        errors.append("distillation.enabled=true but distillation.teacher_models names no teacher")
    if pool > 0 and out and sum(t.world_size for t in out) != pool:
        sizes = ", ".join(f"{t.name}={t.world_size}" for t in out)
        errors.append(f"the teachers take {sum(t.world_size for t in out)} processes ({sizes}: num_replicas x "
                      f"inference.tensor_model_parallel_size x data_parallel_size) but their pool has {pool} "
                      "(distillation.n_gpus_per_node x nnodes); make them equal, or set distillation.nnodes=0 to "
                      "colocate the teachers with the actor")
    return out, errors


def check_distillation(cfg: Any, errors: list[str], notes: list[str]) -> None:
    if not cfg.distillation.enabled:
        return
    loss = cfg.distillation.distillation_loss
    if loss.loss_mode == "forward_kl_topk":
        if loss.use_policy_gradient or int(loss.topk or 0) < 1:
            errors.append("distillation.distillation_loss.loss_mode=forward_kl_topk is a loss over the teacher's top-k "
                          f"tokens: set use_policy_gradient=false and topk >= 1 (got {loss.use_policy_gradient}, "
                          f"{loss.topk})")
    elif loss.loss_mode not in DISTILLATION_MODES:
        errors.append(f"distillation.distillation_loss.loss_mode={loss.loss_mode!r}: choose one of "
                      f"{', '.join(DISTILLATION_MODES)}")
    elif not loss.use_policy_gradient and loss.loss_mode in ("k1", "kl"):
        errors.append("distillation.distillation_loss.loss_mode=k1 with use_policy_gradient=false: k1's gradient does "
                      "not depend on the teacher; use k3 as a loss, or use_policy_gradient=true")
    if loss.policy_loss_mode != "vanilla":
        errors.append(f"distillation.distillation_loss.policy_loss_mode={loss.policy_loss_mode!r}: only vanilla (the "
                      "PPO clipped loss) is supported, as in verl")
    _, teacher_errors = teacher_entries(cfg.distillation)
    errors.extend(teacher_errors)
    unread = [leaf for leaf, _ in changed_keys(cfg, "distillation.teacher_models")
              if ".inference." in leaf and leaf.split(".inference.", 1)[1].split(".")[0] not in TEACHER_INFERENCE_KEYS]
    if unread:
        notes.append(f"{', '.join(unread[:6])}{' ...' if len(unread) > 6 else ''}: the teachers score the student's "
                     "samples with a forward pass of their own worker group (no inference engine), so engine keys "
                     "have no effect; tensor_model_parallel_size x data_parallel_size, dtype and temperature act")
    if cfg.trainer.recipe == "spin":
        errors.append("distillation.enabled=true with trainer.recipe=spin: SPIN trains on DPO pairs, not on the "
                      "student's samples scored by a teacher; run one or the other")
