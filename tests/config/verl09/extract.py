"""Record verl 0.9's trainer command lines and key tree (a maintainer's tool, not a test).

    python tests/config/verl09/extract.py /path/to/verl-bare-git > tests/config/data/verl09_command_lines.txt
    python tests/config/verl09/extract.py /path/to/verl-bare-git keys EARLY_2026_YAML > tests/config/data/verl09_keys.txt
    python tests/config/verl09/extract.py /path/to/verl-recipe-bare-git recipe dapo > tests/config/data/verl_recipe_command_lines.txt

``keys``: every leaf of verl's ``_generated_ppo_trainer.yaml`` (``_target_`` lines dropped), one per line as
``key<TAB>default<TAB>new`` where ``new`` says whether hybridflow's early-2026 ``ppo_trainer.yaml`` (the file given,
e.g. ``git show 668fa6d:hybridflow/config/ppo_trainer.yaml``) lacked it.

Each ``examples/**/*.sh`` of the given verl checkout (a bare git directory; read with ``git show``) runs under
``bash`` with a PATH holding only stubs: ``python3``/``python``/``torchrun``/``uv`` record their arguments and every
other program the scripts call (``nvidia-smi``, ``ray``, ``hf``, ``pip``...) is a no-op, so nothing of the script
really runs. Defaults as the scripts ship them (GPU branch: ``import torch_npu`` fails; ``VERL_USE_UV=0``;
``HOME=/root``). Output: one ``## <script> :: <entry module>`` section per launch, one override per line.

``recipe FOLDER...``: the scripts of those folders of the verl-recipe repository instead (named ``recipe/FOLDER/...``,
as they sit in a verl checkout).
"""

from __future__ import annotations

import os
import re
import shlex
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

RECORDER = """#!/bin/bash
# stub: record a python launch, fail the 'python3 -c ...' probes
if [ "$1" = "-c" ]; then exit 1; fi
for a in "$@"; do printf '%s\\0' "$a"; done >> "$HF_RECORD"
printf '\\n\\0' >> "$HF_RECORD"
exit 0
"""
NOOP = "#!/bin/bash\nexit 0\n"
REAL = ("bash", "sh", "date", "dirname", "basename", "seq", "expr", "cat", "echo", "printf", "tr", "cut", "sed",
        "awk", "grep", "head", "tail", "wc", "realpath", "readlink", "mkdir", "pwd", "env", "true", "false", "sort")
STUBBED = ("nvidia-smi", "ray", "hf", "huggingface-cli", "pip", "pip3", "wget", "curl", "git", "nproc", "rm", "cp",
           "mv", "ln", "export", "hostname", "ifconfig", "ip", "ps", "kill", "pkill", "sleep", "npu-smi", "modelscope",
           "tee", "touch", "ls", "find", "xargs", "docker", "wandb", "jq", "scontrol", "srun", "ssh", "trap")


# variables some scripts require without a default (values a user would give)
REQUIRED_ENV = {"VERL_USE_UV": "0", "SLURM_JOB_NUM_NODES": "1", "INFER_BACKEND": "vllm", "HDFS_ROOT": "/root",
                "LORA_ADAPTER_PATH": "/root/lora_adapter"}
# given only to a script that records nothing without them (`set -u` on a variable it never defaults): giving them to
# every script would replace the defaults the others write (DATA_ROOT=${DATA_ROOT:-/data/verl} ...)
FALLBACK_ENV = {"DATA_ROOT": "/root/verl", "RAY_DATA_HOME": "/root/verl", "KIMI_K2_6_MODEL_PATH": "/root/model/Kimi-K2.6"}


def scripts(repo: str, folders: tuple[str, ...] = ("examples", "recipe")) -> list[str]:
    out = subprocess.run(["git", "-C", repo, "ls-tree", "-r", "--name-only", "HEAD"], capture_output=True, text=True,
                         check=True).stdout.split()
    return sorted(p for p in out if p.endswith(".sh") and p.split("/")[0] in folders)


def launches(repo: str, path: str, stubs: Path, home: Path, extra_env: dict | None = None) -> list[list[str]]:
    text = subprocess.run(["git", "-C", repo, "show", f"HEAD:{path}"], capture_output=True, text=True,
                          check=True).stdout
    with tempfile.TemporaryDirectory() as work:
        script = Path(work) / "script.sh"
        script.write_text("ulimit() { :; }\n" + text)  # raising limits is not permitted in a sandbox
        record = Path(work) / "record"
        record.write_bytes(b"")
        env = {"PATH": str(stubs), "HOME": str(home), "HF_RECORD": str(record), **REQUIRED_ENV, **(extra_env or {})}
        # the SFT scripts take `nproc_per_node save_path` as positional arguments (and `shift 2` them away)
        args = ["8", f"{home}/sft_out"] if re.search(r"^\s*shift 2\b", text, re.M) else []
        subprocess.run(["/bin/bash", str(script), *args], cwd=work, env=env, capture_output=True, timeout=60)
        parts = record.read_bytes().split(b"\0")
    runs, cur = [], []
    for p in parts:
        if p == b"\n":
            if cur:
                runs.append(cur)
            cur = []
        elif p:
            cur.append(p.decode())
    return [r for r in runs if "-m" in r]


def main(repo: str, folders: tuple[str, ...] = ("examples", "recipe"), prefix: str = "") -> None:
    with tempfile.TemporaryDirectory() as tmp:
        stubs = Path(tmp) / "bin"
        stubs.mkdir()
        # the recipes launch through `ray job submit ... -- python3 -m recipe...`: record ray there too
        recorded = ("python3", "python", "torchrun", "uv") + (("ray",) if prefix else ())
        for name in recorded:
            (stubs / name).write_text(RECORDER)
        for name in STUBBED:
            if name not in recorded:
                (stubs / name).write_text(NOOP)
        for p in stubs.iterdir():
            p.chmod(p.stat().st_mode | stat.S_IEXEC)
        for name in REAL:
            for d in ("/usr/bin", "/bin"):
                if os.path.exists(f"{d}/{name}") and not (stubs / name).exists():
                    (stubs / name).symlink_to(f"{d}/{name}")
        print(f"# verl{'-recipe' if prefix else ' 0.9 example'} launch command lines, recorded by "
              f"tests/config/verl09/extract.py from verl{'-recipe' if prefix else ''}")
        print("# commit " + subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], capture_output=True,
                                         text=True).stdout.strip() + " (HOME=/root, GPU defaults, VERL_USE_UV=0)")
        for path in scripts(repo, folders):
            runs = launches(repo, path, stubs, Path("/root")) or launches(repo, path, stubs, Path("/root"), FALLBACK_ENV)
            for run in runs:
                module = run[run.index("-m") + 1]
                args = run[run.index("-m") + 2:]
                print(f"\n## {prefix}{path} :: {module}")
                for a in args:
                    print(a if "\n" not in a else shlex.quote(a))


def _flat(node, prefix=""):
    out = {}
    for k, v in node.items():
        path = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and v:
            out.update(_flat(v, path))
        elif k != "_target_":
            out[path] = v
    return out


def keys(repo: str, early_yaml: str) -> None:
    import yaml

    text = subprocess.run(["git", "-C", repo, "show", "HEAD:verl/trainer/config/_generated_ppo_trainer.yaml"],
                          capture_output=True, text=True, check=True).stdout
    verl = _flat(yaml.safe_load(text))
    early = _flat(yaml.safe_load(Path(early_yaml).read_text()))
    print("# verl 0.9 _generated_ppo_trainer.yaml leaves: key<TAB>default<TAB>new (not in hybridflow's early-2026 tree)")
    for key, value in verl.items():
        new = "new" if key not in early and not any(k.startswith(key + ".") for k in early) else "old"
        print(f"{key}\t{value!r}\t{new}")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[2] == "keys":
        keys(sys.argv[1], sys.argv[3])
    elif len(sys.argv) > 3 and sys.argv[2] == "recipe":
        main(sys.argv[1], tuple(sys.argv[3:]), prefix="recipe/")
    else:
        main(sys.argv[1])
