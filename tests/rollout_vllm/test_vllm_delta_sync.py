"""Delta weight sync into vLLM: a server replica and the engine core in a child process reload only the tensor
groups that changed (partially reloaded fused layers included) and refuse weight files that are not what was
written; a LoRA fleet sends its adapter only when it moved."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from hybridflow.rollout import SamplingParams

GREEDY = SamplingParams(do_sample=False, max_tokens=12, ignore_eos=True)


def _model(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def _perturb(model, names, seed):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if any(n in name for n in names):
                p.add_(torch.randn(p.shape, generator=gen) * 0.4)


def _greedy(client, prompts):
    async def go():
        try:
            return await asyncio.gather(*(client.generate(f"r{i}", p, GREEDY) for i, p in enumerate(prompts)))
        finally:
            await client.aclose()

    return [o.token_ids for o in asyncio.run(go())]


def _hf(model, prompts, hf_greedy):
    return [hf_greedy(model, p, 12, None) for p in prompts]


def _corrupt_once(monkeypatch, module, name):
    """The next weight folder written by ``module.name`` gets one flipped byte in its file, after its digests
    were taken: what a reader sees is not what was written."""
    original = getattr(module, name)
    done = []

    def write(tensors, folder, *args, **kwargs):
        count = original(tensors, folder, *args, **kwargs)
        if not done:
            file = next(Path(folder).glob("*.safetensors"))
            data = bytearray(file.read_bytes())
            data[-5] ^= 0x01  # in the last tensor's bytes (the header is at the front)
            file.write_bytes(bytes(data))
            done.append(file)
        return count

    monkeypatch.setattr(module, name, write)
    return done


def test_server_reloads_only_the_changed_groups_and_refuses_a_corrupted_file(varied_model_dir, engine_args, prompts,
                                                                             hf_reference, monkeypatch, tmp_path):
    from hybridflow.rollout.vllm import server_fleet
    from hybridflow.rollout.vllm.server_fleet import VLLMServerFleet

    hf_greedy, _ = hf_reference
    model = _model(varied_model_dir)
    fleet = VLLMServerFleet(varied_model_dir, dict(engine_args), n_servers=1,
                            weights_source=lambda: model.named_parameters(), log_dir=str(tmp_path))
    try:
        fleet.update_weights()  # the first sync: everything
        first = fleet.sync_metrics()
        assert first["weight_sync/skipped"] == 0 and first["weight_sync/bytes_sent"] == first["weight_sync/bytes_total"]
        _perturb(model, ["layers.1.self_attn.q_proj."], seed=1)  # one part of a fused qkv parameter
        fleet.update_weights()
        m = fleet.sync_metrics()
        group = [n for n, _ in model.named_parameters() if n.startswith("model.layers.1.self_attn.")]
        assert m["weight_sync/tensors_sent"] == len(group)  # q, k, v, o (and biases): vLLM reloads them together
        assert m["weight_sync/skipped"] > 0 and m["weight_sync/bytes_sent"] < m["weight_sync/bytes_total"] / 2
        assert _greedy(fleet.replicas[0], prompts) == _hf(model, prompts, hf_greedy)
        _perturb(model, ["layers.0.mlp.", "norm"], seed=2)
        corrupted = _corrupt_once(monkeypatch, server_fleet, "write_safetensors_folder")
        fleet.update_weights()
        m = fleet.sync_metrics()
        assert corrupted and m["weight_sync/checksum_mismatch"] == 1 and m["weight_sync/checksum_mismatch_total"] == 1
        assert m["weight_sync/bytes_sent"] == m["weight_sync/bytes_total"]  # the repair wrote everything
        assert _greedy(fleet.replicas[0], prompts) == _hf(model, prompts, hf_greedy)
        fleet.update_weights()  # nothing changed since the verified repair
        assert fleet.sync_metrics()["weight_sync/bytes_sent"] == 0
    finally:
        fleet.shutdown()


def test_child_process_engine_refuses_a_corrupted_file_and_loads_the_delta(varied_model_dir, engine_args, tokenizer,
                                                                           prompts, hf_reference, monkeypatch):
    from hybridflow.rollout.vllm import engine as engine_module
    from hybridflow.rollout.vllm.engine import VLLMRolloutEngine
    from hybridflow.rollout.weights.delta import ChecksumMismatch, DeltaTracker, vllm_load_group

    hf_greedy, _ = hf_reference
    model = _model(varied_model_dir)
    tracker = DeltaTracker(group_of=vllm_load_group)
    with VLLMRolloutEngine(varied_model_dir, engine_args=engine_args, tokenizer=tokenizer,
                           multiprocess=True) as engine:
        engine.update_weights(list(tracker.select(model.named_parameters())))
        tracker.commit()
        _perturb(model, ["layers.0.mlp.up_proj."], seed=3)
        delta = list(tracker.select(model.named_parameters()))
        assert sorted(n for n, _ in delta) == sorted(n for n, _ in model.named_parameters()
                                                     if n.startswith("model.layers.0.mlp."))
        _corrupt_once(monkeypatch, engine_module, "write_safetensors_folder")
        with pytest.raises(ChecksumMismatch, match="did not match"):
            engine.update_weights(delta)
        engine.update_weights(delta)  # written again, intact this time
        tracker.commit()
        outs = engine.generate_batch(prompts, GREEDY)
        assert [o.token_ids for o in outs] == _hf(model, prompts, hf_greedy)


def test_lora_fleet_sends_the_adapter_only_when_it_moved(varied_model_dir, engine_args, tmp_path):
    from peft import LoraConfig, get_peft_model

    from hybridflow.rollout.vllm.server_fleet import VLLMServerFleet

    peft_model = get_peft_model(_model(varied_model_dir), LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj"],
                                                                     lora_dropout=0.0))
    fleet = VLLMServerFleet(varied_model_dir, dict(engine_args), n_servers=1, lora_rank=8, lora_alpha=16,
                            weights_source=lambda: peft_model.state_dict().items(), log_dir=str(tmp_path))
    try:
        first = fleet.sync_metrics()  # the fleet loads the adapter when it starts
        adapter = sum(p.numel() * 4 for n, p in peft_model.named_parameters() if "lora_" in n)
        assert first["weight_sync/bytes_sent"] == adapter  # the frozen base never travels
        fleet.update_weights()
        assert fleet.sync_metrics()["weight_sync/bytes_sent"] == 0 and fleet._lora_version == 1
        with torch.no_grad():
            next(p for n, p in peft_model.named_parameters() if "lora_B" in n).add_(0.5)
        fleet.update_weights()
        assert fleet.sync_metrics()["weight_sync/bytes_sent"] == adapter and fleet._lora_version == 2
    finally:
        fleet.shutdown()
