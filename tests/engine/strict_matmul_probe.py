"""Child of test_batch_invariant: which row counts M give a row of ``F.linear`` other bits than inside M = 700, on two
threads, with MKL's strict mode as the environment sets it. Prints one JSON line."""

import json
import sys

import torch
import torch.nn.functional as F

from hybridflow.engine.batch_invariant import strict_matmul

torch.set_num_threads(2)
g = torch.Generator().manual_seed(0)
w, x = torch.randn(2048, 896, generator=g), torch.randn(700, 896, generator=g)
ref = F.linear(x, w)
bad = [m for m in (1, 2, 3, 5, 8, 15, 16, 17, 33, 64, 100, 255) if not torch.equal(F.linear(x[3:3 + m], w), ref[3:3 + m])]
print(json.dumps({"strict": strict_matmul(), "mismatched_row_counts": bad}), flush=True)
