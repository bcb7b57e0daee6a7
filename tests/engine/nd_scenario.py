"""One rank of the tensor / expert parallel equality scenario (run as a script by test_tensor_parallel.py).

usage: python nd_scenario.py RANK WORLD PORT MODELS_JSON OUT_JSON [BREAK]

For every case of this world size (``CASES``), every rank loads the same tiny checkpoint twice: a plain module
that computes the reference on the *whole* batch in this process, and a ``TrainEngine`` over the group with the
case's layout (world = dp x sp x tp, ep inside dp) that computes the same thing on the rank's dp chunk.  It
compares the response log-probs, the entropies and every parameter's gradient of a loss normalised by the global
token count (as the workers normalise theirs), then one clipped AdamW step (global grad norm, parameters after
the step).  Rank 0 writes the max abs differences (the max over ranks) to OUT_JSON.

With ``breaks`` as the last argument it first runs the sabotaged cases of ``BREAKS`` (tests of the tests), one
after the other in the same process group -- each patch breaks one piece of the implementation for one case --
then every case; another last argument runs only the cases whose name contains it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import warnings
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from multirank import exit_rank  # tests/ is on a scenario's path (tests/multirank.py)

HERE = Path(__file__).resolve().parent

# name -> (family of utils/tiny_model.FAMILIES, tp, ep, sp, role)
CASES = {
    2: {
        "tp2-qwen2": ("qwen2", 2, 1, 1, "actor"),
        "tp2-llama3.1": ("llama3.1", 2, 1, 1, "actor"),
        "tp2-qwen3": ("qwen3", 2, 1, 1, "actor"),
        "tp2-mistral": ("mistral", 2, 1, 1, "actor"),
        "tp2-qwen3-moe": ("qwen3-moe", 2, 1, 1, "actor"),
        "tp2-deepseek-v3": ("deepseek-v3", 2, 1, 1, "actor"),
        "ep2-qwen3-moe": ("qwen3-moe", 1, 2, 1, "actor"),
        "ep2-deepseek-v3": ("deepseek-v3", 1, 2, 1, "actor"),
        "tp2-critic-qwen2": ("qwen2", 2, 1, 1, "critic"),
        # LoRA on every linear of the decoder layers (q/k/v/gate/up column-wise, o/down row-wise): the adapters'
        # gradients, the sync of the merged weights into an hf rollout engine and the saved PEFT adapter
        "tp2-lora-qwen3": ("qwen3", 2, 1, 1, "lora"),
        # Megatron's sequence parallelism inside the tp group (megatron.sequence_parallel): norms and the residual
        # stream split along the tokens (a role suffixed "+seqpar")
        "tp2-seqpar-qwen3": ("qwen3", 2, 1, 1, "actor+seqpar"),
        "tp2-seqpar-qwen3-moe": ("qwen3-moe", 2, 1, 1, "actor+seqpar"),
        "tp2-seqpar-critic-qwen2": ("qwen2", 2, 1, 1, "critic+seqpar"),
        "tp2-seqpar-lora-qwen3": ("qwen3", 2, 1, 1, "lora+seqpar"),
        # LoRA on the experts (peft's ParamWrapper around each expert stack) with the experts split over ep
        "ep2-lora-qwen3-moe": ("qwen3-moe", 1, 2, 1, "lora"),
    },
    4: {
        "dp2xtp2-qwen2": ("qwen2", 2, 1, 1, "actor"),
        "dp2xtp2-qwen3": ("qwen3", 2, 1, 1, "actor"),
        "dp2xtp2-llama3.1": ("llama3.1", 2, 1, 1, "actor"),
        "ep2xtp2-qwen3-moe": ("qwen3-moe", 2, 2, 1, "actor"),
        "ep2xtp2-deepseek-v3": ("deepseek-v3", 2, 2, 1, "actor"),
        "ep2xedp2-qwen3-moe": ("qwen3-moe", 1, 2, 1, "actor"),
        "ep4-qwen3-moe": ("qwen3-moe", 1, 4, 1, "actor"),
        # expert groups over dp x tp (ep 4 does not divide dp 2): Megatron's layout of verl's Qwen3-30B lines
        "ep4xtp2-qwen3-moe": ("qwen3-moe", 2, 4, 1, "actor"),
        "ep4xsp2xtp2-qwen3-moe": ("qwen3-moe", 2, 4, 2, "actor"),  # groups over sp x tp (dp 1)
        # expert groups inside the tp groups (verl's Qwen3-30B line: tp 4 x ep 2 with dp 1; Ulysses beside ep = tp)
        "ep2intp4-qwen3-moe": ("qwen3-moe+kv4", 4, 2, 1, "actor"),
        "ep2intp4-lora-qwen3-moe": ("qwen3-moe+kv4", 4, 2, 1, "lora"),
        "ep2intp2xsp2-qwen3-moe": ("qwen3-moe", 2, 2, 2, "actor"),
        # LoRA on the experts with expert groups over dp x tp (each tp rank dispatches its slice of the tokens)
        "ep4xtp2-lora-qwen3-moe": ("qwen3-moe", 2, 4, 1, "lora"),
        "ep2xtp2-lora-qwen3-moe": ("qwen3-moe", 2, 2, 1, "lora"),
        "sp2xtp2-qwen2": ("qwen2", 2, 1, 2, "actor"),
        "dp2xtp2-seqpar-llama3.1": ("llama3.1", 2, 1, 1, "actor+seqpar"),
        "sp2xtp2-seqpar-qwen2": ("qwen2", 2, 1, 2, "actor+seqpar"),
        "ep2xtp2-seqpar-deepseek-v3": ("deepseek-v3", 2, 2, 1, "actor+seqpar"),
        # the family table x sequence / tensor parallelism (issue 39 item 4): Ulysses sp2 inside dp2 for every family
        # (Gemma-2's soft-capped attention on the CPU path, Mistral's sliding window, DeepSeek-V3's MLA, Qwen3-MoE),
        # and tp2 inside dp2 for the families the 2-rank cases do not split
        "dp2xsp2-qwen3": ("qwen3", 1, 1, 2, "actor"),
        "dp2xsp2-llama3.1": ("llama3.1", 1, 1, 2, "actor"),
        "dp2xsp2-mistral": ("mistral", 1, 1, 2, "actor"),
        "dp2xsp2-gemma2": ("gemma2", 1, 1, 2, "actor"),
        "dp2xsp2-deepseek-v3": ("deepseek-v3", 1, 1, 2, "actor"),
        "dp2xsp2-qwen3-moe": ("qwen3-moe", 1, 1, 2, "actor"),
        "dp2xtp2-gemma2": ("gemma2", 2, 1, 1, "actor"),
        "dp2xtp2-mistral": ("mistral", 2, 1, 1, "actor"),
    },
}


# checkpoints: name -> (family, saving layout, {target name: layout or None (unsharded, in this process)})
CHECKPOINTS = {
    2: {
        "ckpt-tp2-qwen2": ("qwen2", {"tp": 2}, {"same": {"tp": 2}, "tp1": {}, "single": None}),
        "ckpt-ep2-qwen3-moe": ("qwen3-moe", {"ep": 2}, {"same": {"ep": 2}, "ep1": {}, "single": None}),
    },
    4: {
        "ckpt-dp2xtp2-qwen3": ("qwen3", {"tp": 2}, {"same": {"tp": 2}, "tp1": {}, "sp2": {"sp": 2}, "single": None}),
        "ckpt-ep2xtp2-qwen3-moe": ("qwen3-moe", {"tp": 2, "ep": 2}, {"same": {"tp": 2, "ep": 2}, "ep4": {"ep": 4},
                                                                    "tp2": {"tp": 2},
                                                                    "ep4xtp2": {"tp": 2, "ep": 4}}),
    },
}


def _load(name: str, file: str):
    spec = importlib.util.spec_from_file_location(name, HERE / file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _configs(model_dir: str):
    from hybridflow.launch.config import load_config

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = load_config([f"actor_rollout_ref.model.path={model_dir}", "trainer.device=cpu", "trainer.n_gpus_per_node=1",
                           "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1", "critic.ppo_micro_batch_size_per_gpu=1",
                           "actor_rollout_ref.actor.optim.lr=0.05"])
    optim = cfg.actor_rollout_ref.actor.optim
    optim.override_optimizer_config = {"eps": 1.0}  # an Adam step ~ linear in the gradient: comparable within 1e-5
    return cfg.actor_rollout_ref.actor.fsdp_config, optim


def _loss(out, weight, mask, tokens: int, dp: int):
    """Token-sum of out x weight over the global token count, times dp (FSDP averages over the data ranks)."""
    return (out * weight * mask).sum() / tokens * dp


def _full(t):
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


def _grads(module) -> dict[str, torch.Tensor]:
    return {n: _full(p.grad) for n, p in module.named_parameters() if p.grad is not None}


def _params(module) -> dict[str, torch.Tensor]:
    return {n: _full(p) for n, p in module.named_parameters()}


def _max_diff(a: dict, b: dict) -> float:
    if set(a) != set(b):
        raise AssertionError(f"parameter sets differ: {sorted(set(a) ^ set(b))[:5]}")
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _load_module(model_dir: str, role: str):
    from hybridflow.engine.model_loader import apply_lora, load_causal_lm, load_value_model

    if role == "lora":  # both copies get the same adapters, B non-zero (peft starts it at 0: A would get no gradient)
        module = apply_lora(load_causal_lm(model_dir), 4, 8.0, "all-linear")
        g = torch.Generator().manual_seed(7)
        with torch.no_grad():
            for name, p in module.named_parameters():
                if ".lora_" in name:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.1)
        return module
    if role == "critic":
        torch.manual_seed(0)  # the value head is freshly initialised: the same seed gives both copies the same
        return load_value_model(model_dir)
    return load_causal_lm(model_dir)


_INIT: dict[str, torch.Tensor] = {}


# ---------------------------------------------------------------------------------------------- sabotage
def _patch(module, name, value):
    old = getattr(module, name)
    setattr(module, name, value)
    return lambda: setattr(module, name, old)


def _break_head_norm_placement():
    """Qwen3's per-head q/k norms left as plain replicated weights (not declared sharded over the head dimension),
    so each rank's weight gradient misses the other ranks' heads."""
    import hybridflow.engine.tensor_parallel as tp

    real = tp.decoder_layer_split

    def split(layer):
        s = real(layer)
        return type(s)(s.colwise, s.rowwise, (), s.experts, s.shared_columns)

    return _patch(tp, "decoder_layer_split", split)


def _break_missing_allreduce():
    """The row-wise projections' partial sums used without the all-reduce over the group."""
    from torch.distributed.tensor import Partial
    from torch.distributed.tensor.parallel import RowwiseParallel

    import hybridflow.engine.tensor_parallel as tp

    class NoReduce(RowwiseParallel):
        def __init__(self, **kw):
            super().__init__(output_layouts=Partial(), **kw)

    return _patch(tp, "_ROWWISE", NoReduce)


def _break_vocab_normaliser():
    """The log-softmax normalised over the rank's vocabulary shard only (no all-reduce of the exp-sum)."""
    import hybridflow.engine.vocab_parallel as vp

    real = vp.dist.all_reduce

    class Dist:
        ReduceOp = vp.dist.ReduceOp

        @staticmethod
        def all_reduce(t, op=None, group=None):
            skip, Dist.after_max = Dist.after_max and op == vp.dist.ReduceOp.SUM, op == vp.dist.ReduceOp.MAX
            return None if skip else real(t, op=op, group=group)  # the sum right after the max: sum_v exp(z_v - m)

    Dist.after_max = False
    return _patch(vp, "dist", Dist)


def _break_expert_choice():
    """Each rank runs a token on the *next* local expert (a wrong expert id after the all-to-all)."""
    import hybridflow.engine.expert_parallel as epm

    real = epm.expert_forward

    def shifted(x, counts, gate_up, down, act_fn):
        return real(x, counts, gate_up.roll(1, dims=0), down.roll(1, dims=0), act_fn)

    return _patch(epm, "expert_forward", shifted)


def _break_expert_gradient_scale():
    """The experts' gradients averaged over their FSDP ranks only (the ep factor forgotten)."""
    import hybridflow.engine.parallel.parallelize as pz

    return _patch(pz, "expert_gradient_divide_factor", lambda fsdp_size, ep, tp_in_ep=1: fsdp_size)


def _break_expert_token_split():
    """Expert groups over dp x tp without the token split: every tp rank sends all of its (shared) tokens, so each
    token reaches its experts tp times."""
    import hybridflow.engine.parallel.parallelize as pz

    real = pz.apply_expert_parallel
    return _patch(pz, "apply_expert_parallel", lambda module, mesh, key, tp_split=None: real(module, mesh, key))


def _break_shared_rotary_key():
    """DeepSeek's shared rotary key without its gradient sum over the group."""
    import hybridflow.engine.tensor_parallel as tp

    return _patch(tp, "_sum_gradient_of_columns", lambda first, group: (lambda m, a, out: out))


def _break_seqpar_norm_gradient_sum():
    """Sequence parallelism's norms left as plain weights: each rank's weight gradient sees only its tokens."""
    import hybridflow.engine.tensor_parallel as tp

    real = tp.apply_tp_sequence_parallel

    def no_norm_plan(layer, mesh):
        real(layer, mesh)
        return {}

    return _patch(tp, "apply_tp_sequence_parallel", no_norm_plan)


def _break_lora_rowwise_sum():
    """The LoRA A of the row-wise projections split on its input features, its partial products not summed."""
    from torch.distributed.tensor import Partial
    from torch.distributed.tensor.parallel import RowwiseParallel

    import hybridflow.engine.tensor_parallel as tp

    real = tp._rowwise

    def rowwise(layer, name):
        plan = real(layer, name)
        return {k: (RowwiseParallel(output_layouts=Partial()) if ".lora_A." in k else v) for k, v in plan.items()}

    return _patch(tp, "_rowwise", rowwise)


def _break_lora_experts_slice():
    """Every ep rank folds the first experts' LoRA factors into its own experts."""
    import hybridflow.engine.expert_parallel as epm

    return _patch(epm, "_local_experts", lambda stack, spec: stack[:spec["local"]])


def _break_lora_experts_gradient_sum():
    """LoRA factors of experts whose groups span tp: each tp rank keeps the gradient of its token slice only."""
    import hybridflow.engine.expert_parallel as epm

    class Identity(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, group):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            return grad, None

    return _patch(epm, "SumGradient", Identity)


BREAKS = {
    "seqpar_norm_gradient_sum": (_break_seqpar_norm_gradient_sum, "tp2-seqpar-qwen3"),
    "head_norm_placement": (_break_head_norm_placement, "tp2-qwen3"),
    "missing_allreduce": (_break_missing_allreduce, "tp2-qwen2"),
    "vocab_normaliser": (_break_vocab_normaliser, "tp2-llama3.1"),
    "expert_choice": (_break_expert_choice, "ep2-qwen3-moe"),
    "expert_gradient_scale": (_break_expert_gradient_scale, "ep2-deepseek-v3"),
    "shared_rotary_key": (_break_shared_rotary_key, "tp2-deepseek-v3"),
    "expert_token_split": (_break_expert_token_split, "ep4xtp2-qwen3-moe"),
    "expert_token_split_in_tp": (_break_expert_token_split, "ep2intp4-qwen3-moe"),
    "lora_rowwise_sum": (_break_lora_rowwise_sum, "tp2-lora-qwen3"),
    "lora_experts_slice": (_break_lora_experts_slice, "ep2-lora-qwen3-moe"),
    "lora_experts_gradient_sum": (_break_lora_experts_gradient_sum, "ep4xtp2-lora-qwen3-moe"),
}


def check_case(model_dir: str, tp: int, ep: int, sp: int, role: str, batches) -> dict[str, float]:
    from hybridflow.engine.expert_parallel import EP_TRAFFIC
    from hybridflow.engine.forward import response_log_probs, response_values
    from hybridflow.engine.parallel_dims import ParallelDims
    from hybridflow.engine.train_engine import TrainEngine

    fsdp_cfg, optim_cfg = _configs(model_dir)
    role, seqpar = role.removesuffix("+seqpar"), role.endswith("+seqpar")
    ref_module, got_module = _load_module(model_dir, role).train(), _load_module(model_dir, role).train()
    _INIT.clear()
    _INIT.update(_params(ref_module))
    ref = TrainEngine(ref_module, fsdp_cfg, optim_cfg, role="actor", parallel_dims=ParallelDims(1))
    dims = ParallelDims(dist.get_world_size(), sp=sp, tp=tp, ep=ep, tp_sp=seqpar)
    engine = TrainEngine(got_module, fsdp_cfg, optim_cfg, role="actor", parallel_dims=dims)
    vocab = ref_module.config.vocab_size
    data = batches.make_update_batch(vocab, seed=3, rows=8, prompt_len=10, response_len=8)
    b = data.batch
    mask = b["response_mask"].float()
    tokens = int(mask.sum())
    dp, dp_rank = engine.dp_size, engine.dp_rank
    mine = data.chunk(dp)[dp_rank].batch
    m = mine["response_mask"].float()
    rows = slice(dp_rank * len(mine["responses"]), (dp_rank + 1) * len(mine["responses"]))
    EP_TRAFFIC.reset()
    result: dict[str, float] = {}
    if role == "critic":
        v_ref = response_values(ref.module, dict(b), use_remove_padding=False)
        _loss(v_ref, b["advantages"], mask, tokens, 1).backward()
        v = response_values(engine.module, dict(mine), sequence_parallel=engine.sequence_parallel,
                            use_remove_padding=sp > 1)
        _loss(v, mine["advantages"], m, tokens, dp).backward()
        result["out"] = float(((v_ref[rows] - v) * m).abs().max())
    else:
        lp_ref, ent_ref = response_log_probs(ref.module, dict(b), 0.9, calculate_entropy=True, packed=False)
        (_loss(lp_ref, b["advantages"], mask, tokens, 1) - 0.05 * _loss(ent_ref, 1.0, mask, tokens, 1)).backward()
        lp, ent = response_log_probs(engine.module, dict(mine), 0.9, calculate_entropy=True,
                                     sequence_parallel=engine.sequence_parallel, use_remove_padding=sp > 1)
        (_loss(lp, mine["advantages"], m, tokens, dp) - 0.05 * _loss(ent, 1.0, m, tokens, dp)).backward()
        result["out"] = float(((lp_ref[rows] - lp) * m).abs().max())
        result["entropy"] = float(((ent_ref[rows] - ent) * m).abs().max())
    ref_grads, got_grads = _grads(ref.module), _grads(engine.module)
    result["grad"] = _max_diff(ref_grads, got_grads)
    if os.environ.get("ND_DEBUG"):
        print({k: float((ref_grads[k] - got_grads[k]).abs().max()) for k in ref_grads}, flush=True)
        for k in ref_grads:
            if "experts" in k:
                r, g = ref_grads[k], got_grads[k]
                print(k, [(float(g[e].norm() / r[e].norm()) if r[e].norm() > 0 else (float(r[e].norm()), float(g[e].norm()))) for e in range(r.shape[0])], flush=True)
    result["grad_scale"] = max(float(g.abs().max()) for g in ref_grads.values())
    result["params"] = len(ref_grads)
    result["ep_bytes"] = EP_TRAFFIC.bytes
    # one AdamW step clipped at 0.05 (below every case's norm): the global norm over every mesh, then the update
    step_ref, step_got = ref.optimizer_step(grad_clip=0.05), engine.optimizer_step(grad_clip=0.05)
    result["grad_norm"] = step_ref.grad_norm
    result["grad_norm_diff"] = abs(step_ref.grad_norm - step_got.grad_norm)
    after_ref = _params(ref.module)
    result["param_after_step"] = _max_diff(after_ref, _params(engine.module))
    result["step_size"] = max(float((after_ref[k] - before[k]).abs().max()) for k in before) if (before := _INIT) else 0.0
    if role == "lora":
        result.update(_lora_sync_and_adapter(model_dir, ref.module, engine, dict(b)))
    return result


def saved_activation_bytes(model_dir: str, seqpar: bool, batches) -> tuple[float, float]:
    """Bytes autograd keeps for the backward of one actor forward (tp=2 over both ranks; parameters not counted),
    in all and in tensors of the hidden size (the residual stream, the norms' inputs and outputs, the projections'
    inputs): what megatron.sequence_parallel saves, measured."""
    from torch.distributed.tensor import DTensor

    from hybridflow.engine.forward import response_log_probs
    from hybridflow.engine.parallel_dims import ParallelDims
    from hybridflow.engine.train_engine import TrainEngine

    fsdp_cfg, optim_cfg = _configs(model_dir)
    engine = TrainEngine(_load_module(model_dir, "actor").train(), fsdp_cfg, optim_cfg, role="actor",
                         parallel_dims=ParallelDims(dist.get_world_size(), tp=2, tp_sp=seqpar))

    def local(t):  # the plain tensor under DTensor / functional-collective wrappers
        while isinstance(t, DTensor) or hasattr(t, "elem"):
            t = t._local_tensor if isinstance(t, DTensor) else t.elem
        return t

    params = {local(p).untyped_storage().data_ptr() for p in engine.module.parameters()}
    hidden = int(engine.module.config.hidden_size)
    seen: dict[int, tuple[int, bool]] = {}

    def pack(t):
        plain = local(t)
        storage = plain.untyped_storage()
        if storage.data_ptr() not in params:
            size = max(seen.get(storage.data_ptr(), (0, False))[0], storage.nbytes())
            seen[storage.data_ptr()] = (size, plain.dim() >= 2 and plain.shape[-1] == hidden
                                        and plain.numel() > hidden * hidden)
        return t

    data = batches.make_update_batch(engine.module.config.vocab_size, seed=5, rows=4, prompt_len=96, response_len=160)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        log_probs, _ = response_log_probs(engine.module, dict(data.batch), 1.0, use_remove_padding=False)
    log_probs.sum().backward()
    return float(sum(n for n, _ in seen.values())), float(sum(n for n, h in seen.values() if h))


def _lora_sync_and_adapter(model_dir: str, trained, engine, batch) -> dict[str, float]:
    """After the step: the split LoRA actor's weights resharded in buckets into an hf rollout engine's plain copy
    (adapters merged), and its adapter saved as a PEFT folder, each against the single-process LoRA model's
    log-probs."""
    from peft import PeftModel

    from hybridflow.engine.engine_checkpoint import export_hf_model
    from hybridflow.engine.forward import response_log_probs
    from hybridflow.engine.model_loader import load_causal_lm, load_tokenizer
    from hybridflow.engine.reshard import reshard_in_buckets
    from hybridflow.rollout.base import create_rollout_engine

    def log_probs(module):
        with torch.no_grad():
            return response_log_probs(module.eval(), dict(batch), 1.0, packed=False)[0]

    mask = batch["response_mask"].float()
    expected = log_probs(trained)
    rollout = create_rollout_engine("hf", model=load_causal_lm(model_dir).eval(), tokenizer=load_tokenizer(model_dir))
    stats = reshard_in_buckets(engine.module, rollout.update_weights, 40_000)
    out = {"sync": float(((log_probs(rollout.model) - expected) * mask).abs().max()), "sync_buckets": stats.buckets}
    folder = Path(os.environ["ND_OUT"]) / "lora_export"
    export_hf_model(engine, str(folder))
    if dist.get_rank() == 0:
        adapter = PeftModel.from_pretrained(load_causal_lm(model_dir), str(folder / "lora_adapter"))
        out["adapter"] = float(((log_probs(adapter) - expected) * mask).abs().max())
    else:
        out["adapter"] = 0.0
    dist.barrier()
    return out


def _max_over_ranks(result: dict[str, float]) -> dict[str, float]:
    keys = sorted(result)
    t = torch.tensor([float(result[k]) for k in keys], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return dict(zip(keys, t.tolist()))


def main(rank: int, world: int, port: int, models: dict[str, str], out_json: str, only: str = "") -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), HYBRIDFLOW_DEVICE="cpu",
                      ND_OUT=str(Path(out_json).parent))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=300))
    batches = _load("hf_test_batches", "batches.py")
    results = {}
    if only == "breaks" or only.startswith("break:"):  # "break:NAME" runs that sabotage alone (by hand)
        for name, (sabotage, case) in BREAKS.items():
            if case not in CASES[world] or only not in ("breaks", f"break:{name}"):
                continue
            family, tp, ep, sp, role = CASES[world][case]
            undo = sabotage()
            try:
                results[f"{name}:{case}"] = _max_over_ranks(check_case(models[family], tp, ep, sp, role, batches))
            finally:
                undo()
    for name, (family, tp, ep, sp, role) in CASES[world].items():
        if only and only != "breaks" and only not in name:
            continue
        results[name] = _max_over_ranks(check_case(models[family], tp, ep, sp, role, batches))
    if world == 2 and (only in ("", "breaks") or "memory" in only):
        model = models.get("qwen3")
        (plain, plain_hidden), (seqpar, seqpar_hidden) = (saved_activation_bytes(model, on, batches)
                                                          for on in (False, True))
        results["memory-seqpar"] = _max_over_ranks({"plain": plain, "seqpar": seqpar, "plain_hidden": plain_hidden,
                                                    "seqpar_hidden": seqpar_hidden})
    ckpt = _load("hf_test_nd_checkpoint", "nd_checkpoint.py")
    for name, (family, layout, targets) in CHECKPOINTS[world].items():
        if only and only != "breaks" and only not in name:
            continue
        folder = Path(out_json).parent / name
        results[name] = _max_over_ranks(ckpt.check_checkpoint(models[family], layout, targets, folder, batches,
                                                              _configs, _loss))
    if rank == 0:
        Path(out_json).write_text(json.dumps({"world": world, "results": results}, indent=1))
    exit_rank()  # barrier, destroy, and an exit that skips interpreter finalisation (tests/multirank.py)


if __name__ == "__main__":
    r, w, port = (int(x) for x in sys.argv[1:4])
    main(r, w, port, json.loads(Path(sys.argv[4]).read_text()), sys.argv[5], sys.argv[6] if len(sys.argv) > 6 else "")
