"""The data-parallel PPO actor: log-prob recomputation and the clipped policy-gradient update.

One instance lives on every rank of the actor group and sees that rank's share of the batch.  The
update follows PPO (Schulman et al. 2017, arXiv:1707.06347) as verl runs it:

    for epoch in ppo_epochs:
        for mini-batch of ppo_mini_batch_size prompts x rollout.n trajectories (split over DP ranks):
            for micro-batch (fixed size or token budget):
                loss = pg_loss - entropy_coeff * H + kl_loss_coef * KL(pi || pi_ref)
                loss.backward()            # gradients accumulate over micro-batches
            clip grad norm, optimizer step (skipped when the norm is not finite)
    lr_scheduler.step()

Every term is aggregated with the mini-batch's *global* token/sequence counts (summed over
micro-batches and all-reduced over ranks, see ``algorithms/aggregation.py``), so the gradient does
not depend on how rows were split into micro-batches or ranks.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from hybridflow.algorithms.batch_ops import (
    OLD_LOG_PROBS_FROM_UPDATE,
    PI_OLD_DIAGNOSTICS_IN_UPDATE,
    ROLLOUT_CORRECTION_BYPASS,
)
from hybridflow.algorithms.bypass_loss import compute_policy_loss_bypass_mode
from hybridflow.algorithms.distillation import (
    DISTILLATION_SETTINGS,
    TEACHER_LOG_PROBS,
    TEACHER_TOPK_IDS,
    TEACHER_TOPK_LOG_PROBS,
    compute_distillation_loss,
)
from hybridflow.algorithms.aggregation import agg_loss, check_loss_agg_mode, count_loss_normalizers
from hybridflow.algorithms.kl import kl_penalty
from hybridflow.algorithms.loss_config import with_global_batch_info
from hybridflow.algorithms.registries import get_policy_loss_fn
from hybridflow.algorithms.rollout_correction import (
    PROBS_DIFF_SUM_KEYS,
    rollout_probs_diff_from_sums,
    rollout_probs_diff_sums,
)
from hybridflow.engine.forward import response_log_probs, response_token_outputs, token_outputs_pass
from hybridflow.engine.moe import MoEUpdateTracker
from hybridflow.engine.topk_outputs import response_outputs_at
from hybridflow.engine.train_engine import TrainEngine
from hybridflow.engine.vision import merge_multi_modal_inputs
from hybridflow.protocol import DataProto
from hybridflow.workers.micro_batching import (
    MicroBatchSpec,
    gather_in_order,
    normalize_mini_batch_size,
    split_micro_batches,
)

if TYPE_CHECKING:
    from hybridflow.config.schema import ActorConfig

__all__ = [
    "PPOActor", "NonFiniteGradientError", "compute_token_outputs",
]

_MODEL_KEYS = ("responses", "input_ids", "attention_mask", "position_ids")
# Non-tensor model inputs of a vision-language batch (per-row pixel inputs, see engine/vision.py).
_MULTI_MODAL_KEY = "multi_modal_inputs"


def _model_inputs(data: DataProto, batch_keys: list[str]) -> DataProto:
    """The tensors the forward needs, plus the rows' ``multi_modal_inputs`` when the batch has images."""
    non_tensor = [_MULTI_MODAL_KEY] if _MULTI_MODAL_KEY in data.non_tensor_batch else []
    return data.select(batch_keys=batch_keys, non_tensor_batch_keys=non_tensor)

# meta_info flag set by the trainer (``StepPlan.old_log_prob_in_update``): the batch has no
# ``old_log_probs`` because the update is exactly on-policy, so pi_old is the update's own detached log-prob.


class NonFiniteGradientError(RuntimeError):
    """Too many consecutive optimizer steps were skipped because gradients were inf/nan."""


def _pixel_inputs(micro_batches: list[DataProto], device) -> list[dict[str, torch.Tensor]] | None:
    """Each micro-batch's merged pixel inputs for a pass through pipeline stages (``None``: a text batch)."""
    if not micro_batches or _MULTI_MODAL_KEY not in micro_batches[0].non_tensor_batch:
        return None
    return [merge_multi_modal_inputs(mb.non_tensor_batch.get(_MULTI_MODAL_KEY), device) for mb in micro_batches]


def compute_token_outputs(
    engine: TrainEngine,
    data: DataProto,
    spec: MicroBatchSpec,
    temperature: float,
    calculate_entropy: bool,
    use_remove_padding: bool,
    packed: bool | None = None,
    calculate_sum_pi_squared: bool = False,
    use_torch_compile: bool = False,
    prefix_grouping: bool = False,
) -> dict[str, torch.Tensor]:
    """No-grad per-response-token outputs (B, R) of ``engine``'s module, in ``data``'s row order:
    ``log_probs``, plus ``entropy`` and ``sum_pi_squared`` when asked (see ``response_token_outputs``).
    ``prefix_grouping``: the actor's ``use_prefix_grouper`` (the rows of a prompt share its forward).

    Shared by the actor (``old_log_probs``) and the reference policy (``ref_log_prob``)."""
    module = engine.module
    batch = _model_inputs(data, list(_MODEL_KEYS))
    micro_batches, parts = split_micro_batches(batch, spec, sp=engine.parallel_dims.sp)
    batches = [mb.batch.to(engine.device) for mb in micro_batches]

    def run_one(i: int) -> dict[str, torch.Tensor]:
        return response_token_outputs(
            module, batches[i], temperature, calculate_entropy, use_remove_padding, packed=packed,
            calculate_sum_pi_squared=calculate_sum_pi_squared, use_torch_compile=use_torch_compile,
            multi_modal_inputs=micro_batches[i].non_tensor_batch.get(_MULTI_MODAL_KEY),
            sequence_parallel=engine.sequence_parallel, prefix_grouping=prefix_grouping,
        )

    pieces: dict[str, list[torch.Tensor]] = {}
    was_training = module.training
    module.eval()
    with torch.no_grad(), engine.on_device(), engine.autocast():
        pipeline_pass = token_outputs_pass(module, data.batch["responses"].shape[-1], temperature, calculate_entropy,
                                           False, use_remove_padding, calculate_sum_pi_squared, use_torch_compile,
                                           sequence_parallel=engine.sequence_parallel)
        pipeline_pass.multi_modal = _pixel_inputs(micro_batches, engine.device)
        for outs in engine.forward_passes(batches, pipeline_pass, run_one):
            for key, value in outs.items():
                pieces.setdefault(key, []).append(value.float().cpu())
    module.train(was_training)
    return {key: gather_in_order(values, parts) for key, values in pieces.items()}


def _mini_batch_seed(base: int, global_step: int, epoch: int) -> int:
    return (int(base) * 1_000_003 + int(global_step) * 1009 + int(epoch)) % (2**63 - 1)


class _MicroBatchMetrics:
    """Loss terms summed and policy-loss metrics averaged over a mini-batch's micro-batches, kept on the
    device and read back with one host sync (a ``float()`` per term and micro-batch would stall a GPU's
    queue every micro-batch).

    Micro-batch terms carry global normalisers x dp_size: their sum on a rank, averaged over ranks (the
    trainer's mean of the collected lists), is the mini-batch value.
    """

    def __init__(self) -> None:
        self._sums: dict[str, torch.Tensor] = {}
        self._per_micro: dict[str, list[torch.Tensor]] = defaultdict(list)

    def add(self, name: str, term: torch.Tensor) -> None:
        value = term.detach().float().reshape(())
        self._sums[name] = self._sums[name] + value if name in self._sums else value

    def observe(self, metrics: dict[str, Any]) -> None:
        for name, value in metrics.items():
            self._per_micro[name].append(torch.as_tensor(value, dtype=torch.float32).reshape(()))

    def values(self) -> dict[str, float]:
        names = list(self._sums) + list(self._per_micro)
        if not names:
            return {}
        device = next(iter(self._sums.values())).device if self._sums else torch.device("cpu")
        stacked = [self._sums[n] for n in self._sums]
        stacked += [torch.stack([v.to(device) for v in vs]).mean() for vs in self._per_micro.values()]
        return dict(zip(names, torch.stack(stacked).tolist()))


@dataclass
class _LossSetup:
    """What every micro-batch of one mini-batch computes its loss with."""

    view: Any  # the actor config with the mini-batch's global normalisers (``with_global_batch_info``)
    agg: dict[str, Any]  # those normalisers, as ``agg_loss`` takes them
    global_tokens: int  # response tokens of the mini-batch on all data-parallel ranks
    entropy_in_loss: bool
    want_entropy: bool
    bypass: Any = None  # rollout correction in bypass mode: its settings
    distill: Any = None  # distillation: its settings


def _add_probs_diff(sums: dict[str, torch.Tensor], micro: dict[str, torch.Tensor]) -> None:
    """Fold one micro-batch's rollout/actor drift sums into the mini-batch's (``max_d`` is a maximum)."""
    for key, value in micro.items():
        if key not in sums:
            sums[key] = value
        else:
            sums[key] = torch.maximum(sums[key], value) if key == "max_d" else sums[key] + value


class PPOActor:
    """PPO actor over a ``TrainEngine`` (``config`` is an ``ActorConfig``)."""

    def __init__(self, config: ActorConfig, engine: TrainEngine, use_remove_padding: bool, rollout_n: int = 1):
        self.config = config
        self.engine = engine
        self.use_remove_padding = bool(use_remove_padding)
        # None: ``engine.forward.use_packed_layout`` picks packed vs trimmed for the device; True/False
        # forces a layout (benchmarks compare the two side by side).
        self.packed: bool | None = None
        # use_prefix_grouper: the samples of a prompt share one forward of it (engine/prefix_grouping.py)
        self.prefix_grouping = bool(getattr(config, "use_prefix_grouper", False))
        check_loss_agg_mode(config.loss_agg_mode)
        self.policy_loss_fn = get_policy_loss_fn(config.policy_loss.loss_mode)
        self.mini_batch_size = normalize_mini_batch_size(
            config.ppo_mini_batch_size, rollout_n, engine.dp_size, "actor_rollout_ref.actor.ppo_mini_batch_size"
        )
        self.update_spec = MicroBatchSpec(
            use_dynamic_bsz=bool(config.use_dynamic_bsz),
            micro_batch_size=config.ppo_micro_batch_size_per_gpu,
            max_token_len=int(config.ppo_max_token_len_per_gpu),
            field="actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
        )
        if not config.use_dynamic_bsz and not config.ppo_micro_batch_size_per_gpu:
            raise ValueError(
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu must be set when use_dynamic_bsz=false "
                "(or enable actor_rollout_ref.actor.use_dynamic_bsz with ppo_max_token_len_per_gpu)"
            )
        self._skipped_in_a_row = 0
        # MoE: expert-load metrics, the optional router aux loss (not with pipeline stages: each rank holds some of the
        # routers and the aux loss of a stage's routers would have to reach the last stage's loss -- refused at
        # config time, see config/checks/megatron.py)
        self.moe = MoEUpdateTracker.of(engine.module) if engine.pipeline is None else None

    # ------------------------------------------------------------------ log-probs
    def compute_log_prob(
        self, data: DataProto, spec: MicroBatchSpec, temperature: float, calculate_entropy: bool = False,
        calculate_sum_pi_squared: bool = False,
    ) -> dict[str, torch.Tensor]:
        """``log_probs`` (and ``entropy``, ``sum_pi_squared`` when asked) of ``data``'s response tokens."""
        return compute_token_outputs(
            self.engine, data, spec, temperature, calculate_entropy, self.use_remove_padding, self.packed,
            calculate_sum_pi_squared, use_torch_compile=bool(self.config.use_torch_compile),
            prefix_grouping=self.prefix_grouping,
        )

    # ------------------------------------------------------------------ update
    def update_policy(self, data: DataProto) -> dict[str, list[float]]:
        """PPO epochs over mini-batches of ``data``; returns verl-named metrics (lists, one per step).

        With ``meta_info[OLD_LOG_PROBS_FROM_UPDATE]`` the update is a single optimiser step on the whole
        batch, so pi_old = pi_theta at the start of it: the old log-prob is the detached log-prob of this
        very forward pass (PPO ratio exactly 1; Schulman et al. 2017, eq. 7, whose gradient at r = 1 is the
        policy gradient A * grad log pi) and the pass also reports ``actor/entropy``, the metric the skipped
        ``old_log_prob`` stage would have produced.
        """
        cfg = self.config
        temperature = float(data.meta_info["temperature"])
        from_update = bool(data.meta_info.get(OLD_LOG_PROBS_FROM_UPDATE, False))
        diagnose = from_update or bool(data.meta_info.get(PI_OLD_DIAGNOSTICS_IN_UPDATE, False))
        if from_update:
            self._check_single_step(len(data))
        keys = list(_MODEL_KEYS) + ["response_mask", "advantages"] + ([] if from_update else ["old_log_probs"])
        if diagnose and "rollout_log_probs" in data.batch:
            keys.append("rollout_log_probs")
        bypass = data.meta_info.get(ROLLOUT_CORRECTION_BYPASS)  # old_log_probs are the rollout's mu
        if cfg.use_kl_loss:
            if "ref_log_prob" not in data.batch:
                raise KeyError("actor.use_kl_loss=true needs 'ref_log_prob' in the batch; compute it with the ref worker")
            keys.append("ref_log_prob")
        if "rollout_is_weights" in data.batch:
            keys.append("rollout_is_weights")
        distill = data.meta_info.get(DISTILLATION_SETTINGS)  # on-policy distillation: the teachers' log-probs
        if distill is not None:
            keys.append(TEACHER_LOG_PROBS)
            if distill.topk_mode:
                keys += [TEACHER_TOPK_LOG_PROBS, TEACHER_TOPK_IDS]
        batch = _model_inputs(data, keys)
        global_step = int(data.meta_info.get("global_steps", 0))
        metrics: dict[str, list[float]] = defaultdict(list)
        module = self.engine.module
        module.train()
        with self.engine.on_device(with_optimizer=True):
            for epoch in range(int(cfg.ppo_epochs)):
                if cfg.shuffle:
                    gen = torch.Generator().manual_seed(_mini_batch_seed(cfg.data_loader_seed, global_step, epoch))
                    batch_e = batch.select_idxs(torch.randperm(len(batch), generator=gen))
                else:
                    batch_e = batch
                for i, mini_batch in enumerate(batch_e.split(self.mini_batch_size)):
                    # Only the first forward pass runs before an optimiser step, i.e. at pi_old.
                    at_pi_old = diagnose and epoch == 0 and i == 0
                    self._train_mini_batch(mini_batch, temperature, metrics, from_update, at_pi_old, bypass, distill)
        metrics["actor/lr"].append(self.engine.lr_scheduler_step())
        return dict(metrics)

    def _check_single_step(self, rows: int) -> None:
        """Old log-probs taken from the update are only pi_old if the update is one optimiser step."""
        epochs = int(self.config.ppo_epochs)
        if epochs != 1 or rows > self.mini_batch_size:
            raise ValueError(
                f"the batch asks for old log-probs from the update pass ({OLD_LOG_PROBS_FROM_UPDATE}), but this "
                f"update makes {epochs} epoch(s) over {rows} rows in mini-batches of {self.mini_batch_size}: only "
                "one optimiser step is on-policy; compute old_log_probs with compute_log_prob first, or set "
                "actor_rollout_ref.actor.ppo_epochs=1 and ppo_mini_batch_size >= data.train_batch_size"
            )

    def _global_normalizers(self, micro_batches: list[DataProto]) -> dict[str, int]:
        tokens, seqs = 0, 0
        for mb in micro_batches:
            counts = count_loss_normalizers(mb.batch["response_mask"])
            tokens += counts["global_token_num"]
            seqs += counts["global_batch_size"]
        tokens, seqs = self.engine.all_reduce_sum([float(tokens), float(seqs)])
        return {"global_token_num": int(tokens), "global_batch_size": int(seqs)}

    def _train_mini_batch(
        self, mini_batch: DataProto, temperature: float, metrics: dict[str, list[float]], from_update: bool = False,
        at_pi_old: bool = False, bypass=None, distill=None,
    ) -> None:
        """One optimiser step on ``mini_batch``: every micro-batch's loss back-propagated, then the step; the
        mini-batch's metrics are appended to ``metrics``."""
        micro_batches, _ = split_micro_batches(mini_batch, self.update_spec, sp=self.engine.parallel_dims.sp)
        # The skipped old_log_prob stage reported actor/entropy; the update's pass at pi_old reports it instead.
        setup = self._loss_setup(micro_batches, from_update or at_pi_old, bypass, distill)
        diff_sums: dict[str, torch.Tensor] = {}
        acc = _MicroBatchMetrics()
        self.engine.zero_grad()
        # read before the copy to the device (no sync): a micro-batch of padding rows has no statistics to average in
        has_tokens = [bool(mb.batch["response_mask"].any()) for mb in micro_batches]
        batches = [mb.batch.to(self.engine.device) for mb in micro_batches]
        routing: dict[int, Any] = {}

        def run_one(i: int) -> dict[str, torch.Tensor]:
            if setup.distill is not None and setup.distill.topk_mode:  # the student at the teacher's top-k tokens
                return self._topk_forward(batches[i], micro_batches[i], temperature, setup)
            log_prob, entropy, routing[i] = self._micro_batch_forward(batches[i], micro_batches[i], temperature, setup)
            return {"log_probs": log_prob, **({"entropy": entropy} if entropy is not None else {})}

        def loss(out: dict[str, torch.Tensor], i: int) -> torch.Tensor:
            b, log_prob = batches[i], out["log_probs"]
            old_log_prob = log_prob.detach() if from_update else b["old_log_probs"]
            if at_pi_old and "rollout_log_probs" in b:
                drift = rollout_probs_diff_sums(b["rollout_log_probs"], log_prob, b["response_mask"])
                _add_probs_diff(diff_sums, drift)
            term, pg_metrics = self._micro_batch_loss(b, log_prob, old_log_prob, out.get("entropy"), routing.get(i),
                                                      setup, acc, has_tokens[i], out.get("log_probs_at"))
            if has_tokens[i]:
                acc.observe(pg_metrics)
            return term

        pipeline_pass = self._update_pass(mini_batch, temperature, setup)
        pipeline_pass.multi_modal = _pixel_inputs(micro_batches, self.engine.device)
        self.engine.backward_passes(batches, pipeline_pass, run_one, loss)
        step = self.engine.optimizer_step(self.config.grad_clip)
        self._track_skips(step.stepped, step.grad_norm)
        probs_diff = diff_sums if at_pi_old and "rollout_log_probs" in mini_batch.batch else None
        self._record_update(metrics, acc, step, probs_diff)

    def _loss_setup(self, micro_batches: list[DataProto], pass_at_pi_old: bool, bypass, distill) -> _LossSetup:
        cfg = self.config
        normalizers = self._global_normalizers(micro_batches)
        view = with_global_batch_info(
            cfg, loss_scale_factor=cfg.loss_scale_factor, dp_size=self.engine.dp_size, **normalizers
        )
        entropy_in_loss = cfg.entropy_coeff != 0
        return _LossSetup(view=view, agg={k: v for k, v in view.global_batch_info.items() if v is not None},
                          global_tokens=normalizers["global_token_num"], entropy_in_loss=entropy_in_loss,
                          want_entropy=bool(entropy_in_loss or cfg.calculate_entropy or pass_at_pi_old),
                          bypass=bypass, distill=distill)

    def _update_pass(self, mini_batch: DataProto, temperature: float, setup: _LossSetup):
        """The update's head for passes through pipeline stages (the same as :meth:`_micro_batch_forward`'s)."""
        cfg = self.config
        with self.engine.autocast():
            return token_outputs_pass(self.engine.module, mini_batch.batch["responses"].shape[-1], temperature,
                                      setup.want_entropy, setup.entropy_in_loss, self.use_remove_padding,
                                      use_torch_compile=bool(cfg.use_torch_compile),
                                      entropy_checkpointing=bool(cfg.entropy_checkpointing),
                                      sequence_parallel=self.engine.sequence_parallel)

    def _micro_batch_forward(self, b, mb: DataProto, temperature: float, setup: _LossSetup):
        """(response log-probs, entropies or ``None``, the MoE routing record or ``None``) of one micro-batch."""
        cfg = self.config
        routing = self.moe.forward(self.engine.module) if self.moe is not None else contextlib.nullcontext()
        with self.engine.autocast(), self.engine.activation_offload(), routing as routed:
            log_prob, entropy = response_log_probs(
                self.engine.module, b, temperature, setup.want_entropy, self.use_remove_padding,
                entropy_grad=setup.entropy_in_loss, packed=self.packed, use_torch_compile=bool(cfg.use_torch_compile),
                entropy_checkpointing=bool(cfg.entropy_checkpointing),
                multi_modal_inputs=mb.non_tensor_batch.get(_MULTI_MODAL_KEY),
                sequence_parallel=self.engine.sequence_parallel, prefix_grouping=self.prefix_grouping,
            )
        return log_prob, entropy, routed

    def _topk_forward(self, b, mb: DataProto, temperature: float, setup: _LossSetup) -> dict[str, torch.Tensor]:
        """forward_kl_topk distillation: the micro-batch's log-probs (and entropy) and the student's log-probs of the
        teacher's top-k tokens, from one forward (``engine/topk_outputs.py``)."""
        if self.engine.pipeline is not None:
            raise ValueError("distillation loss_mode=forward_kl_topk is not built for an actor split into pipeline "
                             "stages; use actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=1")
        with self.engine.autocast(), self.engine.activation_offload():
            return response_outputs_at(self.engine.module, b, b[TEACHER_TOPK_IDS], temperature, setup.want_entropy,
                                       setup.entropy_in_loss, self.use_remove_padding,
                                       sequence_parallel=self.engine.sequence_parallel,
                                       multi_modal_inputs=mb.non_tensor_batch.get(_MULTI_MODAL_KEY))

    def _micro_batch_loss(self, b, log_prob: torch.Tensor, old_log_prob: torch.Tensor, entropy, routed,
                          setup: _LossSetup, acc: _MicroBatchMetrics, has_tokens: bool, student_topk=None):
        """(loss, policy-loss metrics) of one micro-batch: the policy gradient (or the distillation mix), minus the
        entropy bonus, plus the KL and MoE auxiliary terms the config asks for; each term's value goes to ``acc``."""
        cfg, mask, view, agg = self.config, b["response_mask"], setup.view, setup.agg
        if setup.bypass is not None:
            pg_loss, pg_metrics = compute_policy_loss_bypass_mode(
                old_log_prob, log_prob, b["advantages"], mask, cfg.loss_agg_mode, view, setup.bypass
            )
        else:
            pg_loss, pg_metrics = self.policy_loss_fn(
                old_log_prob, log_prob, b["advantages"], mask, cfg.loss_agg_mode, view, b.get("rollout_is_weights")
            )
        loss = pg_loss
        acc.add("actor/pg_loss", pg_loss)
        if setup.distill is not None:  # the task's loss (kept or dropped) plus the teacher's term
            distill = setup.distill
            topk = (student_topk, b[TEACHER_TOPK_LOG_PROBS]) if distill.topk_mode else None
            distill_term, distill_metrics = compute_distillation_loss(
                old_log_prob, log_prob, b[TEACHER_LOG_PROBS], mask, cfg.loss_agg_mode, view, distill, topk)
            loss = distill.task_coef * pg_loss + distill.coef * distill_term
            acc.add("distillation/loss", distill_term)
            if has_tokens:
                acc.observe(distill_metrics)
        if setup.want_entropy:
            entropy_term = agg_loss(entropy, mask, cfg.loss_agg_mode, **agg)
            acc.add("actor/entropy", entropy_term)
            if setup.entropy_in_loss:
                loss = loss - cfg.entropy_coeff * entropy_term
        if cfg.use_kl_loss:
            kld = kl_penalty(log_prob, b["ref_log_prob"], cfg.kl_loss_type)
            kl_term = agg_loss(kld, mask, cfg.loss_agg_mode, **agg)
            loss = loss + cfg.kl_loss_coef * kl_term
            acc.add("actor/kl_loss", kl_term)
        if self.moe is not None:
            share = mask.sum() / max(setup.global_tokens, 1) * self.engine.dp_size
            aux = self.moe.loss_term(routed, share)
            if aux is not None:
                loss = loss + self.moe.spec.aux_loss_coef * aux
                acc.add("actor/moe_aux_loss", aux)
        return loss, pg_metrics

    def _record_update(self, metrics: dict[str, list[float]], acc: _MicroBatchMetrics, step,
                       probs_diff: dict[str, torch.Tensor] | None) -> None:
        """Append one optimiser step's metrics: the loss terms, the rollout/actor drift at pi_old (when measured),
        the KL coefficient, the MoE load, the gradient norm and whether the step was skipped."""
        for name, value in acc.values().items():
            metrics[name].append(value)
        if probs_diff is not None:
            metrics.update({k: [v] for k, v in self._global_probs_diff(probs_diff).items()})
        if self.config.use_kl_loss:
            metrics["actor/kl_coef"].append(float(self.config.kl_loss_coef))
        if self.moe is not None:
            for name, value in self.moe.pop_metrics(self.engine.all_reduce_sum).items():
                metrics[name].append(value)
        metrics["actor/grad_norm"].append(step.grad_norm)
        metrics["actor/nonfinite_grad_skipped"].append(0.0 if step.stepped else 1.0)

    def _global_probs_diff(self, sums: dict[str, torch.Tensor]) -> dict[str, float]:
        """``training/rollout_probs_diff_*`` of the whole mini-batch: the sums of every micro-batch and rank
        (a collective: every rank calls it with the same keys, zeros where it saw no token)."""
        totals = self.engine.all_reduce_sum([float(sums[k]) if k in sums else 0.0 for k in PROBS_DIFF_SUM_KEYS])
        merged: dict[str, float] = dict(zip(PROBS_DIFF_SUM_KEYS, totals))
        merged["max_d"] = self.engine.all_reduce_max([float(sums["max_d"]) if "max_d" in sums else 0.0])[0]
        return rollout_probs_diff_from_sums(merged)

    def _track_skips(self, stepped: bool, grad_norm: float) -> None:
        if stepped:
            self._skipped_in_a_row = 0
            return
        self._skipped_in_a_row += 1
        limit = int(self.config.max_consecutive_skipped_steps)
        if limit > 0 and self._skipped_in_a_row >= limit:
            raise NonFiniteGradientError(
                f"the actor's gradient norm was {grad_norm} for {self._skipped_in_a_row} optimizer steps in a row, "
                "so those steps were skipped; lower actor.optim.lr, check rewards/advantages for inf/nan, or raise "
                "actor_rollout_ref.actor.max_consecutive_skipped_steps (0 disables the abort)"
            )
