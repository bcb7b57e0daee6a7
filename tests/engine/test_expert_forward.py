"""The experts' forward under expert parallelism keeps every rank's autograd graph the same shape: a rank whose
local experts receive no rows still returns a result joined to the rows it received, so its backward runs the
all-to-all that brought them (its peers wait in that all-to-all otherwise -- a hang seen with pipeline
micro-batches of a few rows)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hybridflow.engine.expert_parallel import expert_forward


def _weights(local: int = 2, hidden: int = 4, inter: int = 3):
    gen = torch.Generator().manual_seed(0)
    return torch.randn(local, 2 * inter, hidden, generator=gen), torch.randn(local, hidden, inter, generator=gen)


def test_no_rows_for_any_local_expert_stays_in_the_graph():
    gate_up, down = _weights()
    x = torch.zeros(0, 4, requires_grad=True)
    out = expert_forward(x, [0, 0], gate_up, down, F.silu)
    assert out.shape == (0, 4) and out.grad_fn is not None
    (grad,) = torch.autograd.grad(out.sum(), x)
    assert grad.shape == (0, 4)


def test_rows_go_through_their_experts():
    gate_up, down = _weights()
    x = torch.randn(3, 4)
    out = expert_forward(x, [1, 2], gate_up, down, F.silu)
    for row, e in ((0, 0), (1, 1), (2, 1)):
        gate, up = F.linear(x[row], gate_up[e]).chunk(2)
        torch.testing.assert_close(out[row], F.linear(F.silu(gate) * up, down[e]))
