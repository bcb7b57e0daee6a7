"""The heap keeps freed tensor memory between micro-batches (``hybridflow.utils.host_memory``): where a large block
comes from and the page faults per step, in a fresh process each (the thresholds are process-wide)."""

import os
import subprocess
import sys
import textwrap

import pytest

from hybridflow.utils import host_memory

_STEPS = textwrap.dedent("""
    import ctypes, resource, statistics, torch
    torch.set_num_threads(1)
    from hybridflow.engine.train_engine import TrainEngine
    from hybridflow.sft.trainer import _engine_configs, load_sft_config
    fsdp, _ = _engine_configs(load_sft_config([]), 1)  # the SFT trainer's engine settings (defaults)
    TrainEngine(torch.nn.Linear(4, 4), fsdp)  # the engine a training step runs in, on CPU

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                          "fsmblks", "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
    held = libc.mallinfo2().hblks
    block = libc.malloc(30 << 20)  # over glibc's starting threshold (128 KiB), under the one set (32 MiB)
    mapped = libc.mallinfo2().hblks - held
    libc.free(block)

    x = torch.randn(1024, 256)
    w = torch.randn(256, 1024)

    def step():  # a forward keeps 16 activations of 4 MiB for the backward, which frees them all
        saved = [x @ w]
        for _ in range(15):
            saved.append(torch.nn.functional.silu(saved[-1]))
        return float(saved[-1].sum())

    for _ in range(3):  # warm-up
        step()
    faults = []
    for _ in range(20):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        step()
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    print(mapped, statistics.median(faults))
""")


def _blocks_and_faults(tuning: str) -> tuple[int, float]:
    """(fresh mmaps for a 30 MiB block, median page faults of a training-like step) in a new process."""
    env = {**os.environ, host_memory.ENV_MALLOC_TUNING: tuning, "HYBRIDFLOW_DEVICE": "cpu",
           "PYTHONHASHSEED": "0"}  # the same small allocations every run
    out = subprocess.run([sys.executable, "-c", _STEPS], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    mapped, faults = out.stdout.split()[-2:]
    return int(mapped), float(faults)


@pytest.mark.skipif(host_memory._glibc() is None, reason="glibc's mallopt only")
def test_a_cpu_train_engine_keeps_freed_memory_for_the_next_step():
    """A CPU ``TrainEngine`` raises glibc's mmap threshold: a 30 MiB block comes from the heap instead of its own
    ``mmap`` (glibc's defaults map it; a fresh process has freed no block that large, which would raise them), and
    the steps of a training-like loop fault no page (median over 20 steps).  Without the tuning glibc faulted 50 to
    16,000 pages a step in that loop on this machine, and sometimes none: what sits at the heap's top decides, so
    the faults are asserted on the tuned side only."""
    assert _blocks_and_faults("0")[0] == 1
    assert _blocks_and_faults("1") == (0, 0.0)


def test_the_switch_turns_the_tuning_off():
    code = "from hybridflow.utils.host_memory import keep_freed_host_memory as k; print(k())"
    for value, expected in (("0", "False"), ("1", str(host_memory._glibc() is not None))):
        env = {**os.environ, host_memory.ENV_MALLOC_TUNING: value}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        assert out.stdout.split()[-1] == expected, out.stderr[-2000:]
