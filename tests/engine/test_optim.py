"""LR schedules: hand-computed golden values; AdamW construction errors."""

import math
from types import SimpleNamespace

import pytest
import torch

from hybridflow.engine.optim import build_lr_scheduler, build_optimizer, constant_factor, cosine_factor, warmup_steps


def _optim(**kw):
    base = dict(optimizer="AdamW", optimizer_impl="torch.optim", lr=1.0, betas=[0.9, 0.999], weight_decay=0.0, override_optimizer_config=None,
                lr_warmup_steps=-1, lr_warmup_steps_ratio=0.0, total_training_steps=10, min_lr_ratio=0.0,
                num_cycles=0.5, lr_scheduler_type="constant", warmup_style=None)
    base.update(kw)
    return SimpleNamespace(**base)


def test_constant_with_warmup_golden():
    assert [constant_factor(s, 4) for s in range(6)] == [0.0, 0.25, 0.5, 0.75, 1.0, 1.0]
    assert constant_factor(0, 0) == 1.0


def test_cosine_golden():
    # W=2, T=10, m=0.1: warm-up 0.1 -> 0.55; then 0.1 + 0.9 * 0.5 * (1 + cos(pi * p)), p = (s-2)/8
    assert cosine_factor(0, 2, 10, 0.1) == pytest.approx(0.1)
    assert cosine_factor(1, 2, 10, 0.1) == pytest.approx(0.55)
    assert cosine_factor(2, 2, 10, 0.1) == pytest.approx(1.0)
    assert cosine_factor(6, 2, 10, 0.1) == pytest.approx(0.55)  # p = 0.5: cos(pi/2) = 0
    assert cosine_factor(10, 2, 10, 0.1) == pytest.approx(0.1)
    assert cosine_factor(4, 0, 8, 0.0) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.5)))


def test_scheduler_steps_follow_the_factor_and_warmup_ratio():
    cfg = _optim(lr_scheduler_type="cosine", lr_warmup_steps_ratio=0.2, min_lr_ratio=0.0)
    assert warmup_steps(cfg, 10) == 2
    assert warmup_steps(_optim(lr_warmup_steps=3, lr_warmup_steps_ratio=0.5), 10) == 3  # explicit steps win
    param = torch.nn.Parameter(torch.zeros(2))
    opt = build_optimizer([param], cfg)
    sched = build_lr_scheduler(opt, cfg)
    lrs = []
    for _ in range(11):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[:3] == pytest.approx([0.0, 0.5, 1.0])
    assert lrs[10] == pytest.approx(0.0, abs=1e-12)


def test_bad_optimizer_settings_name_the_field():
    param = torch.nn.Parameter(torch.zeros(2))
    with pytest.raises(ValueError, match="actor.optim.optimizer='AdamX' is not an optimizer class of torch.optim"):
        build_optimizer([param], _optim(optimizer="AdamX"))
    with pytest.raises(ValueError, match="actor.optim.optimizer_impl='no_such_pkg.optim': cannot import module 'no_such_pkg.optim'"):
        build_optimizer([param], _optim(optimizer_impl="no_such_pkg.optim"))
    with pytest.raises(ValueError, match="no trainable parameters"):
        build_optimizer([torch.nn.Parameter(torch.zeros(1), requires_grad=False)], _optim())
    opt = build_optimizer([param], _optim())
    with pytest.raises(ValueError, match="lr_scheduler_type"):
        build_lr_scheduler(opt, _optim(lr_scheduler_type="linear"))
    with pytest.raises(ValueError, match="total_training_steps"):
        build_lr_scheduler(opt, _optim(lr_scheduler_type="cosine", total_training_steps=-1))


def test_optimizer_impl_and_name_pick_the_class_as_verl():
    """``optim.optimizer_impl`` + ``optim.optimizer`` (verl's pair): any torch.optim class, any spelling of AdamW;
    ``betas`` only where the class takes them, ``override_optimizer_config`` last."""
    param = torch.nn.Parameter(torch.zeros(2))
    sgd = build_optimizer([param], _optim(optimizer="SGD", override_optimizer_config={"momentum": 0.5}))
    assert type(sgd) is torch.optim.SGD and sgd.defaults["momentum"] == 0.5 and "betas" not in sgd.defaults
    adam = build_optimizer([param], _optim(optimizer="adamw"))
    assert type(adam) is torch.optim.AdamW and adam.defaults["betas"] == (0.9, 0.999)


def test_zero_indexed_step_false_shifts_the_cosine_schedule_by_one_step():
    """verl's optim.zero_indexed_step=false counts optimizer steps from 1 (torchtitan's convention): the first step
    already uses the factor of step 1 (warm-up W=2, T=10, m=0.1: 0.55 instead of 0.1)."""
    lrs = {}
    for zero_indexed in (True, False):
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        sched = build_lr_scheduler(opt, _optim(lr_scheduler_type="cosine", lr_warmup_steps=2, min_lr_ratio=0.1,
                                               zero_indexed_step=zero_indexed))
        seen = []
        for _ in range(3):
            seen.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        lrs[zero_indexed] = seen
    assert lrs[True] == pytest.approx([0.1, 0.55, 1.0])
    assert lrs[False] == pytest.approx([0.55, 1.0, cosine_factor(3, 2, 10, 0.1)])


def test_adam_takes_the_fused_kernel_unless_the_config_names_one():
    """AdamW over plain CPU parameters runs torch's fused kernel (one kernel per parameter instead of a loop of
    temporaries); ``override_optimizer_config`` naming ``foreach`` or ``fused`` decides instead, and the fused
    update is the AdamW update (the loop's within float rounding)."""
    torch.manual_seed(0)
    start = [torch.randn(64, 48), torch.randn(48)]
    grads = [[torch.randn_like(p) for p in start] for _ in range(5)]
    weights = {}
    for name, override in (("fused", None), ("loop", {"foreach": False}), ("foreach", {"foreach": True})):
        params = [torch.nn.Parameter(p.clone()) for p in start]
        opt = build_optimizer(params, _optim(lr=1e-2, weight_decay=0.01, override_optimizer_config=override))
        assert opt.defaults["fused"] is (True if name == "fused" else None)
        assert opt.defaults["foreach"] is {"fused": None, "loop": False, "foreach": True}[name]
        for g in grads:
            for p, gi in zip(params, g):
                p.grad = gi.clone()
            opt.step()
        weights[name] = params
    for a, b in zip(weights["fused"], weights["loop"]):
        assert not torch.equal(a, start[0] if a.dim() == 2 else start[1])
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    sgd = build_optimizer([torch.nn.Parameter(torch.zeros(2))], _optim(optimizer="SGD"))
    assert not sgd.defaults.get("fused") and sgd.defaults["foreach"] is False  # other classes: the loop, as before
    integer = torch.nn.Parameter(torch.zeros(2, dtype=torch.int64), requires_grad=False)
    assert not __import__("hybridflow.engine.optim", fromlist=["_fused_kernels_fit"])._fused_kernels_fit([integer])
