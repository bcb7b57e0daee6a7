"""Rank script of test_fused_head: the fused head over a vocabulary-split DTensor weight vs the whole head."""

import os
import sys

import torch
import torch.distributed as dist

rank, world, port = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
dist.init_process_group("gloo", rank=rank, world_size=world)
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import Shard, distribute_tensor  # noqa: E402

from hybridflow.engine.fused_head import fused_token_outputs  # noqa: E402
from multirank import exit_rank  # noqa: E402  (tests/ is on the path: tests/multirank.py)

g = torch.Generator().manual_seed(0)
hidden = torch.randn(13, 16, generator=g)
weight = torch.randn(300, 16, generator=g) * 0.5
labels = torch.randint(0, 300, (13,), generator=g)
a, b = torch.randn(13, generator=g), torch.randn(13, generator=g)


def run(w, h):
    out = fused_token_outputs(h, w, labels, 0.9, calculate_entropy=True, sum_pi_squared=True, chunk_rows=5)
    ((a * out["log_probs"]).sum() + (b * out["entropy"]).sum()).backward()
    return out


h1, w1 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
ref = run(w1, h1)
mesh = init_device_mesh("cpu", (world,))
h2 = hidden.clone().requires_grad_()
w2 = distribute_tensor(weight.clone(), mesh, [Shard(0)]).requires_grad_()
out = run(w2, h2)
for k in ("log_probs", "entropy", "sum_pi_squared"):
    assert torch.allclose(out[k], ref[k], atol=1e-5), (k, (out[k] - ref[k]).abs().max())
assert torch.allclose(h2.grad, h1.grad, atol=1e-5), (h2.grad - h1.grad).abs().max()
assert torch.allclose(w2.grad.full_tensor(), w1.grad, atol=1e-5)
print("OK", flush=True)
exit_rank()
