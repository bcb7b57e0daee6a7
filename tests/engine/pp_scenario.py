"""One rank of the pipeline-parallel equality scenario (run as a script by test_pipeline_parallel.py).

usage: python pp_scenario.py RANK WORLD PORT MODELS_JSON OUT_JSON [ONLY]

For every case of this world size (``CASES``) every rank builds two engines from the same tiny checkpoint (four
decoder layers): a plain one in this process on the whole batch, and a ``TrainEngine`` whose layout cuts the
decoder into pipeline stages (with tp / dp / ep around them).  Both run the same passes the workers run --
``TrainEngine.forward_passes`` for the log-probs / entropies / values of every micro-batch, ``backward_passes``
for a loss per micro-batch normalised by the global token count (as the actor and critic normalise theirs) -- and
the scenario compares the last stage's outputs, every parameter's gradient this rank holds, the global gradient
norm of a clipped AdamW step and the parameters after it.  The checkpoint case saves a pp2 engine after one
step, loads it on pp2, on two data-parallel ranks without a pipeline and unsharded in this process, and checks
that one more step lands every one of them on the same parameters; rank 0 writes the saved weights to
``expected.pt`` for the parent's ``hybridflow merge`` check.

``BREAKS`` are sabotages (tests of the tests), each run on one case before the cases when ONLY is ``breaks``.
Rank 0 writes the max abs differences (max over ranks) to OUT_JSON.
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
ROWS, PROMPT, RESPONSE, MICRO = 8, 10, 8, 2  # 8 rows in micro-batches of 2: 4 micro-batches at dp 1, 2 at dp 2

# name -> (family, layout kwargs of ParallelDims, PipelineSpec kwargs, role, remove padding)
CASES = {
    2: {
        "pp2-qwen2": ("qwen2", {"pp": 2}, {}, "actor", False),
        "pp2-gpipe-llama3.1": ("llama3.1", {"pp": 2}, {"schedule": "gpipe"}, "actor", False),
        "pp2-vpp2-qwen2": ("qwen2", {"pp": 2, "vpp": 2}, {}, "actor", False),
        "pp2-split1-llama3.1": ("llama3.1", {"pp": 2}, {"first": 1}, "actor", False),
        "pp2-packed-qwen3": ("qwen3", {"pp": 2}, {}, "actor", True),
        "pp2-critic-qwen2": ("qwen2", {"pp": 2}, {}, "critic", False),
        "pp2-lora-qwen3": ("qwen3", {"pp": 2}, {}, "lora", False),
    },
    4: {
        "pp2xtp2-qwen2": ("qwen2", {"pp": 2, "tp": 2}, {}, "actor", False),
        "pp2xdp2-llama3.1": ("llama3.1", {"pp": 2}, {}, "actor", False),
        "pp2xep2-qwen3-moe": ("qwen3-moe", {"pp": 2, "ep": 2}, {}, "actor", False),
        "pp2xdp2-critic-qwen3": ("qwen3", {"pp": 2}, {}, "critic", True),
        # Ulysses inside each stage: the hidden states between stages are this rank's slice of the packed row
        "pp2xsp2-qwen2": ("qwen2", {"pp": 2, "sp": 2}, {}, "actor", False),
        "pp2xsp2-critic-llama3.1": ("llama3.1", {"pp": 2, "sp": 2}, {}, "critic", False),
    },
}
CHECKPOINTS = {2: {"ckpt-pp2-qwen2": "qwen2"}, 4: {}}


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
                           "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
                           "critic.ppo_micro_batch_size_per_gpu=1", "actor_rollout_ref.actor.optim.lr=0.05"])
    optim = cfg.actor_rollout_ref.actor.optim
    optim.override_optimizer_config = {"eps": 1.0}  # an Adam step ~ linear in the gradient: comparable within 1e-5
    return cfg.actor_rollout_ref.actor.fsdp_config, optim


def _full(t):
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


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


def _engine(model_dir: str, role: str, dims, spec=None):
    from hybridflow.engine.train_engine import TrainEngine

    fsdp_cfg, optim_cfg = _configs(model_dir)
    return TrainEngine(_load_module(model_dir, role).train(), fsdp_cfg, optim_cfg, role="actor", parallel_dims=dims,
                       pipeline=spec)


def run_passes(engine, data, role: str, packed: bool, tokens: int, backward: bool):
    """The engine's passes over its dp share of ``data`` in micro-batches of MICRO rows: outputs of every micro-batch
    (forward) or the loss's gradients (backward); the loss of micro-batch i is its token sum of
    (output x advantage - 0.05 entropy) over the global token count, times dp (FSDP averages over data ranks)."""
    from hybridflow.engine.forward import response_token_outputs, response_values, token_outputs_pass, values_pass

    mine = data.chunk(engine.dp_size)[engine.dp_rank]
    batches = [dict(mb.batch) for mb in mine.chunk(len(mine) // MICRO)]
    if role == "critic":
        spec = values_pass(engine.module, RESPONSE, use_remove_padding=packed,
                           sequence_parallel=engine.sequence_parallel)

        def run_one(i):
            return {"values": response_values(engine.module, batches[i], use_remove_padding=packed)}
    else:
        spec = token_outputs_pass(engine.module, RESPONSE, 0.9, calculate_entropy=True, use_remove_padding=packed,
                                  sequence_parallel=engine.sequence_parallel)

        def run_one(i):
            return response_token_outputs(engine.module, batches[i], 0.9, calculate_entropy=True,
                                          use_remove_padding=packed)

    def loss(out, i):
        b = batches[i]
        mask = b["response_mask"].float()
        main = out["values"] if role == "critic" else out["log_probs"]
        term = (main * b["advantages"] * mask).sum()
        if role != "critic":
            term = term - 0.05 * (out["entropy"] * mask).sum()
        return term / tokens * engine.dp_size

    if backward:
        engine.backward_passes(batches, spec, run_one, loss)
        return None
    with torch.no_grad():
        return engine.forward_passes(batches, spec, run_one), batches


def _outputs_diff(ref_outs, got_outs, got_batches, dp_rank: int) -> dict[str, float]:
    """Max abs difference of each output kind over this rank's micro-batches (masked to response tokens)."""
    per_mb = len(got_outs)
    diffs: dict[str, float] = {}
    for j, (out, b) in enumerate(zip(got_outs, got_batches)):
        want = ref_outs[dp_rank * per_mb + j]
        mask = b["response_mask"].float()
        for key, value in out.items():
            diffs[key] = max(diffs.get(key, 0.0), float(((want[key] - value) * mask).abs().max()))
    return diffs


def check_case(model_dir: str, layout: dict, spec_kwargs: dict, role: str, packed: bool, batches) -> dict[str, float]:
    from hybridflow.engine.parallel.parallelize import PipelineSpec
    from hybridflow.engine.parallel_dims import ParallelDims

    ref = _engine(model_dir, role, ParallelDims(1))
    engine = _engine(model_dir, role, ParallelDims(dist.get_world_size(), **layout), PipelineSpec(**spec_kwargs))
    data = batches.make_update_batch(ref.module.config.vocab_size, seed=3, rows=ROWS, prompt_len=PROMPT,
                                     response_len=RESPONSE)
    tokens = int(data.batch["response_mask"].sum())
    before = {n: _full(p) for n, p in ref.module.named_parameters()}
    ref_outs, _ = run_passes(ref, data, role, packed, tokens, backward=False)
    got_outs, got_batches = run_passes(engine, data, role, packed, tokens, backward=False)
    result: dict[str, float] = {"out": 0.0, "entropy": 0.0}
    if engine.parallel_dims.is_collect(engine.rank):  # the last stage holds the outputs
        diffs = _outputs_diff(ref_outs, got_outs, got_batches, engine.dp_rank)
        result["out"] = diffs.get("values", diffs.get("log_probs", 0.0))
        result["entropy"] = diffs.get("entropy", 0.0)
    run_passes(ref, data, role, packed, tokens, backward=True)
    run_passes(engine, data, role, packed, tokens, backward=True)
    ref_grads = {n: _full(p.grad) for n, p in ref.module.named_parameters() if p.grad is not None}
    tied = {engine.tied_head_weight} if engine.tied_head_weight else set()
    tied |= {n for n in ref_grads if tied and "embed_tokens" in n}  # each stage holds half of a tied gradient
    got_grads = {n: _full(p.grad) for n, p in engine.module.named_parameters() if p.grad is not None}
    missing = [n for n, p in engine.module.named_parameters() if p.requires_grad and p.grad is None and n in ref_grads]
    if missing and os.environ.get("PP_DEBUG"):
        print("no gradient:", missing, flush=True)
    result["missing_grads"] = float(len(missing))
    unknown = set(got_grads) - set(ref_grads) - tied
    if unknown:
        raise AssertionError(f"parameters the plain model does not have: {sorted(unknown)[:5]}")
    compared = [n for n in got_grads if n not in tied]
    result["grad"] = max(float((ref_grads[n] - got_grads[n]).abs().max()) for n in compared)
    result["grad_scale"] = max(float(g.abs().max()) for g in ref_grads.values())
    result["params"] = float(_covered(set(compared) | (set(got_grads) & tied), set(ref_grads) | tied))
    step_ref, step_got = ref.optimizer_step(grad_clip=0.05), engine.optimizer_step(grad_clip=0.05)
    result["grad_norm_diff"] = abs(step_ref.grad_norm - step_got.grad_norm)
    after = {n: _full(p) for n, p in ref.module.named_parameters()}
    result["step_size"] = max(float((after[n] - before[n]).abs().max()) for n in after)
    embedding = next((n for n in after if "embed_tokens" in n), None)
    got_after = {n: _full(p) for n, p in engine.module.named_parameters()}
    result["param_after_step"] = max(float((after[n if n in after else embedding] - p).abs().max())
                                     for n, p in got_after.items())
    result["stage_params"] = float(len(got_after))
    result["stages_per_rank"] = float(len(engine.pipeline.stages))
    return result


def _covered(mine: set[str], every: set[str]) -> bool:
    """Whether the pipeline's ranks together hold every parameter of the plain model (a collective)."""
    names: list = [None] * dist.get_world_size()
    dist.all_gather_object(names, sorted(mine))
    held = set().union(*map(set, names))
    return len(held) if held >= (every - {n for n in every if n.endswith("lm_head.weight")}) else 0


def check_checkpoint(model_dir: str, out_dir: Path, batches) -> dict[str, float]:
    """pp2 saves after one step; pp2, two data ranks without a pipeline and an unsharded engine load it; one more
    step must take each to the saver's parameters (full state dicts compared on rank 0)."""
    from hybridflow.engine.engine_checkpoint import load_engine_checkpoint, save_engine_checkpoint
    from hybridflow.engine.parallel_dims import ParallelDims

    world = dist.get_world_size()
    vocab = _load_module(model_dir, "actor").config.vocab_size
    first, second = (batches.make_update_batch(vocab, seed=s, rows=ROWS, prompt_len=PROMPT, response_len=RESPONSE)
                     for s in (11, 12))

    def step(engine, data):
        run_passes(engine, data, "actor", False, int(data.batch["response_mask"].sum()), backward=True)
        engine.optimizer_step(grad_clip=1.0)

    saver = _engine(model_dir, "actor", ParallelDims(world, pp=2))
    step(saver, first)
    saved = saver.full_state_dict()
    save_engine_checkpoint(saver, str(out_dir), field="test")
    if dist.get_rank() == 0:
        torch.save(saved, out_dir / "expected.pt")
    dist.barrier()
    targets = {"same": ParallelDims(world, pp=2), "pp1": ParallelDims(world), "single": ParallelDims(1)}
    resumed = {name: _engine(model_dir, "actor", dims) for name, dims in targets.items()}
    result: dict[str, float] = {}
    for name, engine in resumed.items():
        load_engine_checkpoint(engine, str(out_dir), field="test")
        result[f"{name}:params"] = _state_diff(saved, engine.full_state_dict())
    step(saver, second)
    after = saver.full_state_dict()
    result["step_size"] = _state_diff(after, saved)
    for name, engine in resumed.items():
        step(engine, second)
        result[f"{name}:next_step"] = _state_diff(after, engine.full_state_dict())
    return result


def _state_diff(a: dict, b: dict) -> float:
    if dist.get_rank() != 0:
        return 0.0
    if set(a) != set(b):
        raise AssertionError(f"state dicts name different tensors: {sorted(set(a) ^ set(b))[:5]}")
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


# ---------------------------------------------------------------------------------------------- sabotage
def _patch(owner, name, value):
    old = getattr(owner, name)
    setattr(owner, name, value)
    return lambda: setattr(owner, name, old)


def _break_stage_boundary():
    """The second stage starts one layer late: a decoder layer runs on no stage."""
    import hybridflow.engine.parallel.parallelize as parallelize

    real = parallelize.stage_layer_ranges

    def off_by_one(*args, **kwargs):
        ranges = real(*args, **kwargs)
        return [ranges[0], *(range(r.start + 1, r.stop) for r in ranges[1:])]

    return _patch(parallelize, "stage_layer_ranges", off_by_one)


def _break_loss_scaled_twice():
    """torch's schedule divides the gradients by the micro-batch count on top of the loss's own normalisation."""
    import torch.distributed.pipelining as pipelining

    real = pipelining.Schedule1F1B

    class Scaled(real):
        def __init__(self, *args, **kwargs):
            kwargs["scale_grads"] = True
            super().__init__(*args, **kwargs)

    return _patch(pipelining, "Schedule1F1B", Scaled)


def _break_tied_gradient_sum():
    """The tied embedding's two copies step on their own halves of its gradient."""
    from hybridflow.engine.train_engine import TrainEngine

    return _patch(TrainEngine, "_sum_tied_embedding_gradients", lambda self: frozenset())


def _break_last_stage_outputs():
    """The outputs are read from the first stage's ranks instead of the last's (zeros there)."""
    from hybridflow.engine.parallel_dims import ParallelDims

    return _patch(ParallelDims, "is_collect", lambda self, rank: self.pp_rank(rank) == 0)


def _break_sequence_slices():
    """Every rank of the sequence-parallel group runs the first slice of the row."""
    import hybridflow.engine.parallel.pipeline_forward as pipeline_forward

    real = pipeline_forward._run_options

    def first_slice(spec, layouts):
        options = real(spec, layouts)
        if options.seq_slices is not None:
            options.seq_slices = [slice(0, s.stop - s.start) for s in options.seq_slices]
        return options

    return _patch(pipeline_forward, "_run_options", first_slice)


BREAKS = {
    "stage_boundary_off_by_one": (_break_stage_boundary, "pp2-qwen2"),
    "loss_scaled_twice": (_break_loss_scaled_twice, "pp2-qwen2"),
    "tied_gradients_not_summed": (_break_tied_gradient_sum, "pp2-qwen2"),
    "outputs_from_the_first_stage": (_break_last_stage_outputs, "pp2-qwen2"),
    "every_sp_rank_on_the_first_slice": (_break_sequence_slices, "pp2xsp2-qwen2"),
}


def _max_over_ranks(result: dict[str, float]) -> dict[str, float]:
    keys = sorted(result)
    t = torch.tensor([float(result[k]) for k in keys], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return dict(zip(keys, t.tolist()))


def main(rank: int, world: int, port: int, models: dict[str, str], out_json: str, only: str = "") -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), HYBRIDFLOW_DEVICE="cpu")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=300))
    batches = _load("hf_test_batches", "batches.py")
    results = {}
    if only == "breaks":
        for name, (sabotage, case) in BREAKS.items():
            if case not in CASES[world]:
                continue
            family, layout, spec, role, packed = CASES[world][case]
            undo = sabotage()
            try:
                results[f"{name}:{case}"] = _max_over_ranks(check_case(models[family], layout, spec, role, packed,
                                                                       batches))
            finally:
                undo()
    for name, (family, layout, spec, role, packed) in CASES[world].items():
        if only and only != "breaks" and only not in name:
            continue
        results[name] = _max_over_ranks(check_case(models[family], layout, spec, role, packed, batches))
    for name, family in CHECKPOINTS[world].items():
        if only and only != "breaks" and only not in name:
            continue
        folder = Path(out_json).parent / name
        folder.mkdir(parents=True, exist_ok=True)
        results[name] = _max_over_ranks(check_checkpoint(models[family], folder, batches))
    if rank == 0:
        Path(out_json).write_text(json.dumps({"world": world, "results": results}, indent=1))
    exit_rank()  # barrier, destroy, and an exit that skips interpreter finalisation (tests/multirank.py)


if __name__ == "__main__":
    r, w, port = (int(x) for x in sys.argv[1:4])
    main(r, w, port, json.loads(Path(sys.argv[4]).read_text()), sys.argv[5], sys.argv[6] if len(sys.argv) > 6 else "")
