"""The GPU path (issue 15, item 7): bf16 autocast, FSDP2 over NCCL on one GPU, the packed flash-attention layout,
and the rollout's KV-cache footprint.  Marked ``gpu``: skipped, with the reason, where CUDA is absent (CPU CI).
These have not run in the session that wrote them (no GPU there); run ``pytest -m gpu tests/gpu`` on a GPU
machine and record the outcome with the date in benchmarks/RESULTS.md.
"""

from __future__ import annotations

import importlib.util
import socket

import pytest
import torch

pytestmark = pytest.mark.gpu

A = "actor_rollout_ref"
# Qwen2.5-0.5B's shape (hidden 896, intermediate 4864, 24 layers, 14 heads, 2 kv heads), random init, char vocab
LAYERS = 24


@pytest.fixture(scope="module")
def qwen05b_dir(tmp_path_factory):
    from hybridflow.utils.tiny_model import make_tiny_checkpoint

    return str(make_tiny_checkpoint(tmp_path_factory.mktemp("qwen05b"), size="qwen2.5-0.5b"))


def _batch(vocab, rows=4, prompt=24, response=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (rows, prompt + response), generator=g)
    attn = torch.ones_like(ids)
    attn[0, :5] = 0  # one left-padded prompt
    attn[1, -4:] = 0  # one short response
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": ids, "attention_mask": attn, "position_ids": pos, "responses": ids[:, -response:],
            "response_mask": attn[:, -response:]}


def _fsdp_config(**overrides):
    from hybridflow.launch.config import load_config

    cfg = load_config([f"{A}.actor.ppo_micro_batch_size_per_gpu=4", "critic.ppo_micro_batch_size_per_gpu=4",
                       *overrides])
    return cfg.actor_rollout_ref.actor


def test_bf16_autocast_on_one_gpu(qwen05b_dir):
    """The default ``fsdp_config.dtype=bfloat16`` computes in bf16 on a GPU (autocast on a one-process group):
    log-probs within bf16 error of fp32, master weights fp32."""
    from hybridflow.engine.forward import response_log_probs
    from hybridflow.engine.model_loader import load_causal_lm
    from hybridflow.engine.train_engine import TrainEngine

    actor = _fsdp_config()
    engine = TrainEngine(load_causal_lm(qwen05b_dir), actor.fsdp_config, actor.optim, total_training_steps=1)
    assert engine.compute_dtype == torch.bfloat16 and not engine.is_sharded
    batch = {k: v.cuda() for k, v in _batch(engine.module.config.vocab_size).items()}
    with torch.no_grad():
        fp32, _ = response_log_probs(engine.module, batch, 1.0, use_remove_padding=False)
        with engine.autocast():
            logits = engine.module(input_ids=batch["input_ids"]).logits
            bf16, _ = response_log_probs(engine.module, batch, 1.0, use_remove_padding=False)
    assert logits.dtype == torch.bfloat16
    mask = batch["response_mask"].bool()
    gap = (fp32 - bf16)[mask].abs().max().item()
    assert 0 < gap < 0.5
    assert all(p.dtype == torch.float32 for p in engine.module.parameters())
    loss = None
    with engine.autocast():
        lp, _ = response_log_probs(engine.module, batch, 1.0, use_remove_padding=False)
        loss = -(lp * mask).sum() / mask.sum()
    loss.backward()
    step = engine.optimizer_step(1.0)
    assert step.stepped and step.grad_norm > 0


def test_fsdp2_over_nccl_on_one_gpu(qwen05b_dir):
    """A one-rank NCCL group with an explicit FSDP2 mesh: bf16 mixed precision, a training step, full state dict
    and the unsharded-for-generation context."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from hybridflow.engine.fsdp import fsdp_modules
    from hybridflow.engine.model_loader import load_causal_lm
    from hybridflow.engine.train_engine import TrainEngine

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("cpu:gloo,cuda:nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        actor = _fsdp_config(f"+{A}.actor.fsdp_config.mixed_precision.param_dtype=bf16")
        model = load_causal_lm(qwen05b_dir)
        engine = TrainEngine(model, actor.fsdp_config, actor.optim, total_training_steps=1,
                             mesh=init_device_mesh("cuda", (1,), mesh_dim_names=("fsdp",)))
        assert engine.is_sharded and len(fsdp_modules(engine.module)) == LAYERS + 1
        batch = {k: v.cuda() for k, v in _batch(model.config.vocab_size).items()}
        logits = engine.module(input_ids=batch["input_ids"]).logits
        assert logits.dtype == torch.bfloat16
        logits.float().logsumexp(-1).mean().backward()
        assert engine.optimizer_step(1.0).stepped
        state = engine.full_state_dict()
        assert state and all(v.device.type == "cpu" for v in state.values())
        with engine.full_params() as full:
            assert full(input_ids=batch["input_ids"][:1]).logits.shape[0] == 1
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(importlib.util.find_spec("flash_attn") is None, reason="flash-attn is not installed")
def test_packed_flash_attention_layout_matches_the_padded_forward(qwen05b_dir):
    """``use_remove_padding=true`` packs the micro-batch into one row for flash-attention's varlen kernel; its
    log-probs must equal the padded (trimmed) layout's within bf16 noise."""
    from hybridflow.engine.forward import response_log_probs, use_packed_layout
    from hybridflow.engine.model_loader import load_causal_lm

    model = load_causal_lm(qwen05b_dir, dtype="bf16").cuda().eval()
    assert model.config._attn_implementation == "flash_attention_2"
    assert use_packed_layout(model, torch.device("cuda"), True)
    batch = {k: v.cuda() for k, v in _batch(model.config.vocab_size, rows=6).items()}
    with torch.no_grad():
        packed, _ = response_log_probs(model, batch, 1.0, use_remove_padding=True, packed=True)
        trimmed, _ = response_log_probs(model, batch, 1.0, use_remove_padding=True, packed=False)
    mask = batch["response_mask"].bool()
    assert (packed - trimmed)[mask].abs().max().item() < 0.05


def test_rollout_kv_cache_is_sized_from_the_batch_and_freed(qwen05b_dir, tmp_path):
    """The hf rollout's KV cache holds the batch it serves (not ``max_num_seqs`` rows at full length) and is
    released after generation with ``rollout.free_cache_engine=true``."""
    from hybridflow.launch.config import load_config
    from hybridflow.protocol import DataProto
    from hybridflow.workers.actor_rollout_ref import ActorRolloutRefWorker

    rows, prompt, response = 8, 24, 32
    cfg = load_config([f"{A}.model.path={qwen05b_dir}", f"critic.model.path={qwen05b_dir}",
                       f"{A}.actor.ppo_micro_batch_size_per_gpu=4", "critic.ppo_micro_batch_size_per_gpu=4",
                       "trainer.n_gpus_per_node=1", f"data.max_prompt_length={prompt}",
                       f"data.max_response_length={response}", f"{A}.rollout.n=1", f"{A}.rollout.free_cache_engine=true",
                       f"{A}.model.enable_gradient_checkpointing=false", f"{A}.rollout.ignore_eos=true"])
    worker = ActorRolloutRefWorker(cfg.actor_rollout_ref, "actor_rollout")
    worker.init_model()
    b = _batch(worker.actor_engine.module.config.vocab_size, rows=rows, prompt=prompt, response=response)
    prompts = DataProto.from_dict({"input_ids": b["input_ids"][:, :prompt],
                                   "attention_mask": torch.ones(rows, prompt, dtype=torch.long),
                                   "position_ids": torch.arange(prompt).expand(rows, prompt).clone()})
    torch.cuda.synchronize()
    baseline = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = worker.generate_sequences(prompts)
    torch.cuda.synchronize()
    assert out.batch["responses"].shape == (rows, response)
    mc = worker.actor_engine.module.config
    head_dim = mc.hidden_size // mc.num_attention_heads
    kv_bytes = 2 * mc.num_hidden_layers * mc.num_key_value_heads * head_dim * rows * (prompt + response) * 2  # bf16
    logits_bytes = rows * (prompt + response) * mc.vocab_size * 4
    peak = torch.cuda.max_memory_allocated() - baseline
    assert peak < 4 * kv_bytes + 2 * logits_bytes + (256 << 20), f"peak {peak / 2**20:.0f} MiB over the weights"
    assert torch.cuda.memory_allocated() - baseline < max(kv_bytes // 10, 8 << 20)  # the cache was freed


def test_short_grpo_run_on_the_gpu(qwen05b_dir, tmp_path):
    """Two GRPO steps of the Qwen2.5-0.5B-shaped model in bf16 through the whole framework (local backend, cuda)."""
    from hybridflow.launch.config import load_config
    from hybridflow.data.synthetic import write_synthetic
    from hybridflow.tracking import Tracking
    from hybridflow.trainer.main_ppo import train_ppo

    write_synthetic("addition", str(tmp_path / "data"), train_size=64, test_size=16, seed=0)
    cfg = load_config([
        f"{A}.model.path={qwen05b_dir}", f"data.train_files={tmp_path / 'data' / 'train.parquet'}",
        f"data.val_files={tmp_path / 'data' / 'test.parquet'}", "data.train_batch_size=16", "data.max_prompt_length=32",
        "data.max_response_length=16", "algorithm.adv_estimator=grpo", f"{A}.rollout.n=4",
        f"{A}.actor.ppo_mini_batch_size=16", f"{A}.actor.ppo_micro_batch_size_per_gpu=16",
        f"{A}.rollout.log_prob_micro_batch_size_per_gpu=32", f"{A}.actor.optim.lr=1e-5", "reward_model.num_workers=0",
        "trainer.backend=local", "trainer.device=cuda", "trainer.n_gpus_per_node=1", "trainer.total_training_steps=2",
        "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.logger=[file]", "trainer.report=false",
        f"trainer.default_local_dir={tmp_path / 'ckpt'}",
    ])
    history = train_ppo(cfg, logger=Tracking("gpu", "grpo", default_backend=["file"], output_dir=tmp_path))
    steps = [m for m in history.metrics if "timing_s/step" in m]
    assert len(steps) == 2
    for m in steps:
        assert m["actor/grad_norm"] > 0 and m["actor/pg_loss"] == m["actor/pg_loss"]  # finite, not NaN
        assert m["perf/max_memory_allocated_gb"] > 0
