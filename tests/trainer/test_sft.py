"""SFT: loss masks cover assistant tokens only (single and multi-turn), a short run lowers the loss, and
``use_remove_padding`` packs micro-batches with the same loss and gradients."""

from __future__ import annotations

import pytest
import torch

from hybridflow.sft.data import SFTDataError, collate_sft, multi_turn_example, single_turn_example, truncate_example
from hybridflow.sft.trainer import load_sft_config, run_sft, sft_loss


@pytest.fixture(scope="module")
def tok():
    from hybridflow.utils.tiny_model import build_char_tokenizer

    return build_char_tokenizer()


def _masked_text(tok, ex):
    return tok.decode([t for t, m in zip(ex.input_ids, ex.loss_mask) if m])


def test_single_turn_mask_is_response_plus_eos(tok):
    ex = single_turn_example(tok, "12+30=", "42", "row 0")
    assert _masked_text(tok, ex) == "42<|im_end|>"
    assert tok.decode(ex.input_ids).startswith("<|im_start|>user\n12+30=<|im_end|>\n<|im_start|>assistant\n")


def test_multi_turn_mask_covers_every_assistant_turn(tok):
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "1+1"},
            {"role": "assistant", "content": "2"}, {"role": "user", "content": "2+2"},
            {"role": "assistant", "content": "4"}]
    ex = multi_turn_example(tok, chat, "row 0")
    # the assistant content and its end-of-turn marker (ChatML renders "<|im_end|>\n" after each turn)
    assert _masked_text(tok, ex) == "2<|im_end|>\n4<|im_end|>\n"
    assert len(ex.input_ids) == len(ex.loss_mask)
    with pytest.raises(SFTDataError, match="no assistant message"):
        multi_turn_example(tok, chat[:2], "row 1")


def test_truncation_and_collate(tok):
    ex = single_turn_example(tok, "12+30=", "42", "row 0")
    with pytest.raises(SFTDataError, match="data.max_length=5"):
        truncate_example(ex, 5, "error", "row 0")
    assert len(truncate_example(ex, 5, "left", "row 0").input_ids) == 5
    batch = collate_sft([ex, truncate_example(ex, 5, "left", "row 0")], tok.pad_token_id)
    assert batch["input_ids"].shape == (2, len(ex.input_ids))
    # label-aligned mask: position t is trained when token t+1 is an assistant token
    assert batch["loss_mask"][0].sum() == sum(ex.loss_mask) and batch["loss_mask"][0, -1] == 0
    assert batch["attention_mask"][1].sum() == 5


def test_config_overrides_are_typed():
    cfg = load_sft_config(["data.train_batch_size=8", "optim.lr=0.01", "data.multiturn.enable=true"])
    assert cfg.data.train_batch_size == 8 and cfg.optim.lr == 0.01 and cfg.data.multiturn.enable
    with pytest.raises(ValueError, match="bad SFT override"):
        load_sft_config(["data.train_batchsize=8"])


@pytest.mark.parametrize("remove_padding", [False, True])
def test_short_sft_run_lowers_loss_and_exports(nano_model_dir, tmp_path, remove_padding):
    rows = [{"prompt": f"{a:02d}+{b:02d}=", "response": str(a + b)} for a in range(8) for b in range(8)]
    cfg = load_sft_config([f"model.partial_pretrain={nano_model_dir}", "data.train_batch_size=32",
                           "data.micro_batch_size_per_gpu=16", "optim.lr=3e-3", "optim.lr_scheduler=constant",
                           "trainer.total_training_steps=30", f"trainer.default_local_dir={tmp_path}",
                           f"use_remove_padding={str(remove_padding).lower()}"])
    result = run_sft(cfg, rows=rows)
    losses = [h["train/loss"] for h in result.history]
    assert len(losses) == 30 and losses[-1] < 0.6 * losses[0]
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(result.hf_dir, dtype=torch.float32)
    assert model.config.vocab_size > 0


def test_remove_padding_packs_the_micro_batch_with_the_same_loss_and_gradients(nano_model_dir, tok, monkeypatch):
    """``use_remove_padding=true``: the model sees one packed row of the examples' tokens (no padding), and the
    loss and every gradient equal the padded batch's; the padded batch runs when it is false."""
    from transformers import AutoModelForCausalLM

    import hybridflow.engine.forward as fwd

    examples = [single_turn_example(tok, [{"role": "user", "content": p}], r, "row")
                for p, r in (("12+30=", "42"), ("7+5=", "12"), ("123+456=", "579"), ("1+1=", "2"))]
    batch = collate_sft(examples, tok.pad_token_id)
    valid = int(batch["attention_mask"].sum())
    assert valid < batch["input_ids"].numel()  # the batch has padding to remove
    model = AutoModelForCausalLM.from_pretrained(nano_model_dir, dtype=torch.float32, attn_implementation="sdpa")
    shapes = []
    original = fwd.per_position_outputs

    def spy(module, input_ids, *a, **kw):
        head = a[2]

        def seen(m, ids, *rest, **extra):
            shapes.append(tuple(ids.shape))
            return head(m, ids, *rest, **extra)
        return original(module, input_ids, a[0], a[1], seen, *a[3:], **kw)

    monkeypatch.setattr(fwd, "per_position_outputs", spy)
    results = {}
    for packed in (False, True):
        model.zero_grad()
        loss, raw = sft_loss(model, batch, int(batch["loss_mask"].sum()), use_remove_padding=packed)
        loss.backward()
        results[packed] = (float(loss.detach()), raw, {n: p.grad.clone() for n, p in model.named_parameters()})
    assert shapes == [tuple(batch["input_ids"].shape), (1, valid)]
    assert results[True][0] == pytest.approx(results[False][0], rel=1e-5)
    assert results[True][1] == pytest.approx(results[False][1], rel=1e-5)
    for name, grad in results[False][2].items():
        torch.testing.assert_close(results[True][2][name], grad, rtol=1e-4, atol=1e-6, msg=name)
