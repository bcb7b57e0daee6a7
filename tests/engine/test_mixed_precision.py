"""verl's ``fsdp_config.mixed_precision`` (param/reduce/buffer dtype) reaches the engine: the typed config accepts
verl's ``+...`` spelling, and the engine computes, reduces and keeps buffers in the dtypes it names (on CPU too,
where an explicit request is honoured while the default ``dtype: bfloat16`` stays a GPU setting)."""

from __future__ import annotations

import textwrap

import pytest
import torch
from multirank import run_ranks

from hybridflow.config import ConfigError
from hybridflow.launch.config import load_config

A = "actor_rollout_ref"
BASE = [f"{A}.actor.ppo_micro_batch_size_per_gpu=4", "critic.ppo_micro_batch_size_per_gpu=4"]


def test_verl_spellings_load():
    cfg = load_config([*BASE, f"+{A}.actor.fsdp_config.mixed_precision.param_dtype=bf16",
                       f"+{A}.actor.fsdp_config.mixed_precision.reduce_dtype=fp32",
                       f"{A}.ref.fsdp_config.mixed_precision.buffer_dtype=fp32",
                       "critic.model.fsdp_config.mixed_precision.param_dtype=bfloat16"])
    mp = cfg.actor_rollout_ref.actor.fsdp_config.mixed_precision
    assert (mp.param_dtype, mp.reduce_dtype, mp.buffer_dtype) == ("bf16", "fp32", None)
    assert cfg.actor_rollout_ref.ref.fsdp_config.mixed_precision.buffer_dtype == "fp32"
    assert cfg.critic.model.fsdp_config.mixed_precision.param_dtype == "bfloat16"
    with pytest.raises(ConfigError, match=r"mixed_precision.param_dtype='bf15' is not a dtype"):
        load_config([*BASE, f"+{A}.actor.fsdp_config.mixed_precision.param_dtype=bf15"])
    with pytest.raises(ConfigError, match=r"unknown config key .*mixed_precision.keep_low_precision_grads"):
        load_config([*BASE, f"+{A}.actor.fsdp_config.mixed_precision.keep_low_precision_grads=true"])


def test_config_and_engine_know_the_same_dtype_names():
    from hybridflow.config.checks.values import DTYPE_NAMES
    from hybridflow.engine.device import _DTYPES

    assert set(DTYPE_NAMES) == set(_DTYPES)


def _engine(model_dir, **mp):
    from hybridflow.engine.model_loader import load_causal_lm
    from hybridflow.engine.train_engine import TrainEngine

    cfg = load_config([*BASE] + [f"{A}.actor.fsdp_config.mixed_precision.{k}={v}" for k, v in mp.items()])
    return TrainEngine(load_causal_lm(model_dir), cfg.actor_rollout_ref.actor.fsdp_config, None, role="actor")


def test_param_dtype_computes_in_bf16_on_one_cpu_process(tiny_model_dir, batches):
    from hybridflow.engine.forward import response_log_probs

    fp32, bf16 = _engine(tiny_model_dir), _engine(tiny_model_dir, param_dtype="bf16")
    assert fp32.compute_dtype == torch.float32 and bf16.compute_dtype == torch.bfloat16
    data = batches.make_rollout_batch(fp32.module.config.vocab_size, batch_size=3, seed=1).batch
    outs = []
    for engine in (fp32, bf16):
        with torch.no_grad(), engine.autocast():
            outs.append(response_log_probs(engine.module, data, 1.0, False, False)[0])
    mask = data["response_mask"].bool()
    gap = (outs[0] - outs[1])[mask].abs().max().item()
    assert 1e-4 < gap < 0.2  # bf16 arithmetic: visibly different, still the same model
    assert all(p.dtype == torch.float32 for p in bf16.module.parameters())  # master weights stay fp32


def test_buffer_dtype_casts_floating_buffers(tiny_model_dir):
    engine = _engine(tiny_model_dir, buffer_dtype="bf16")
    floats = [b for b in engine.module.buffers() if b.is_floating_point()]
    assert floats and all(b.dtype == torch.bfloat16 for b in floats)


SCRIPT = textwrap.dedent('''
    import os, sys, torch
    rank, port, model = int(sys.argv[1]), sys.argv[3], sys.argv[4]
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    torch.distributed.init_process_group("gloo")
    from hybridflow.launch.config import load_config
    from hybridflow.engine.model_loader import load_causal_lm
    from hybridflow.engine.train_engine import TrainEngine
    A = "actor_rollout_ref.actor"
    cfg = load_config([f"{A}.ppo_micro_batch_size_per_gpu=4", "critic.ppo_micro_batch_size_per_gpu=4",
                       f"+{A}.fsdp_config.mixed_precision.param_dtype=bf16"]).actor_rollout_ref.actor
    engine = TrainEngine(load_causal_lm(model), cfg.fsdp_config, cfg.optim, total_training_steps=1)
    assert engine.is_sharded
    ids = torch.randint(5, 20, (2, 6))
    logits = engine.module(input_ids=ids).logits
    logits.float().sum().backward()
    grads = {p.grad.dtype for p in engine.module.parameters() if p.grad is not None}
    print("RESULT", rank, logits.dtype, sorted(str(g) for g in grads), flush=True)
    torch.distributed.destroy_process_group()
    os._exit(0)  # skip interpreter teardown: gloo's threads occasionally abort it ("terminate called ...")
''')


@pytest.mark.slow
def test_fsdp2_on_two_gloo_ranks_uses_the_policy(tiny_model_dir, tmp_path):
    script = tmp_path / "mp.py"
    script.write_text(SCRIPT)
    logs = run_ranks(script, 2, [tiny_model_dir], tmp_path / "logs", timeout=300, env={"HYBRIDFLOW_DEVICE": "cpu"})
    for out in logs:
        line = [x for x in out.splitlines() if x.startswith("RESULT")][0]
        # computed in bf16, gradients reduced into the fp32 shards (reduce_dtype defaults to fp32)
        assert "torch.bfloat16" in line and "['torch.float32']" in line
