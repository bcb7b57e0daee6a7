"""``merge_checkpoint`` exports a trained actor (full or LoRA) that ``from_pretrained`` loads with the same logits.

The reference is the engine's own HF export (``checkpoint.save_contents`` with ``hf_model``; LoRA merged by
peft's ``merge_and_unload``): an independent code path from the merger's shard assembly + ``W + alpha/r BA``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from .conftest import run, small_overrides

DENSE_REWARD = f"custom_reward_function.path={Path(__file__).with_name('reward_fns.py')}"
A = "actor_rollout_ref"


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True])
def test_merged_checkpoint_reproduces_logits(lora, nano_model_dir, addition_data, tmp_path):
    from transformers import AutoModelForCausalLM

    from hybridflow.cli.merge import merge_checkpoint

    extra = [DENSE_REWARD, "reward_model.num_workers=0", "algorithm.adv_estimator=grpo", "trainer.save_freq=1",
             f"{A}.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]"]
    if lora:
        extra += [f"{A}.model.lora_rank=4", f"{A}.model.lora_alpha=8", f"{A}.model.target_modules=all-linear",
                  f"{A}.actor.optim.lr=5e-2"]
    run(small_overrides(nano_model_dir, addition_data, tmp_path, steps=1, extra=extra), tmp_path)
    step_dir = tmp_path / "ckpt" / "global_step_1"
    out = merge_checkpoint(str(step_dir), str(tmp_path / "merged"))

    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    reference = AutoModelForCausalLM.from_pretrained(step_dir / "actor" / "huggingface", dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(nano_model_dir, dtype=torch.float32)
    ids = torch.randint(4, 60, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got, want, before = merged(ids).logits, reference(ids).logits, base(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got, before)  # the training step (and the adapters) changed the model
    assert (Path(out) / "tokenizer_config.json").is_file()
