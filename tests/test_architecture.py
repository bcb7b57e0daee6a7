"""The package's import graph has no cycles, and no file name is used twice for different jobs.

Function-level imports count: a lazy import still ties the two modules together, it only hides the cycle
until run time.  The graph is read from the source with ``ast`` (nothing is imported).
"""

from __future__ import annotations

import ast
import collections
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "hybridflow"
REPO = PACKAGE.parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:
                while target and target not in files:
                    target = target.rpartition(".")[0]
                if target and target != mod and not mod.startswith(target + "."):
                    graph[mod].add(target)
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; components of more than one module are import cycles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def test_the_checker_finds_a_cycle():
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles():
    cycles = strongly_connected(import_graph())
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


# Names that are the same on purpose: package markers, each package's own error types, and verl's public
# module paths.  Modules named after a dataset or task under the folders that say what they do with it
# (``data/preprocess/gsm8k.py`` writes it, ``rewards/scorers/gsm8k.py`` scores it) are left out.  A name may
# repeat across sibling rooms of one floor, where the folder says which (``rollout/hf/engine.py``,
# ``rollout/vllm/engine.py``): what must be unique is (folder, file name).
_SHARED_NAMES = {"__init__.py", "__main__.py", "errors.py", "base.py", "main_ppo.py", "tool_parser.py",
                 "tool_registry.py"}
_PER_TASK_FOLDERS = ("data/preprocess/", "rewards/scorers/")


def test_module_names_say_their_layer():
    by_name = collections.defaultdict(list)
    for path in PACKAGE.rglob("*.py"):
        rel = str(path.relative_to(PACKAGE))
        if not rel.startswith(_PER_TASK_FOLDERS):
            by_name[(path.parent.name, path.name)].append(rel)
    repeated = {n: sorted(p) for n, p in by_name.items() if len(p) > 1 and n[1] not in _SHARED_NAMES}
    assert not repeated, f"same folder/file name in several layers (rename so the name says which): {repeated}"


# The floors of docs/architecture.md, top to bottom.  A module may import modules of its own floor and of the
# floors below it, never above.  Entry modules (verl's public paths and the commands) sit on top, the launch (the one
# path from a config to a running controller, and the ordered check pipeline) below them.  The config floor (key
# tree, typed dataclasses, the rules on its own values, the step plan, the mode table) is the ground floor above
# utils, so every floor can type its sub-config; a rule that needs a floor's knowledge lives on that floor.
FLOORS: list[tuple[str, tuple[str, ...]]] = [
    ("entry points", ("cli", "__main__", "experimental", "recipe", "trainer.main_ppo", "trainer.fsdp_sft_trainer", "trainer.sft_trainer",
                      "quickstart", "data.preprocess")),
    ("launch", ("launch",)),
    ("single controller", ("trainer.controller",)),
    ("modes and hooks", ("trainer.modes", "trainer.hooks")),
    ("controller parts", ("trainer", "sft")),
    ("observability", ("tracking",)),
    ("agent loops", ("agents",)),
    ("role workers", ("workers",)),
    ("rollout engines", ("rollout.hf", "rollout.vllm", "rollout.sglang")),
    ("rollout service", ("rollout.service",)),
    ("weights", ("rollout.weights",)),
    ("rollout contracts", ("rollout",)),
    ("tools and interactions", ("tools", "interactions")),
    ("rewards", ("rewards",)),
    ("sandbox", ("sandbox",)),
    ("model engine", ("engine",)),
    ("data", ("data",)),
    ("algorithms", ("algorithms",)),
    ("worker groups", ("controller",)),
    ("batch container", ("protocol", "protocol_ops")),
    ("config", ("config",)),
    ("utilities", ("utils",)),
]
ENGINES = ("rollout.hf", "rollout.vllm", "rollout.sglang")


def floor_of(module: str) -> int:
    """Index in FLOORS of the longest prefix that names ``module`` (``hybridflow.`` stripped)."""
    name = module.removeprefix("hybridflow.")
    best, best_len = None, -1
    for i, (_, prefixes) in enumerate(FLOORS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = i, len(prefix)
    if best is None:
        raise AssertionError(f"{module} is on no floor: add it to FLOORS in tests/test_architecture.py and to "
                             "docs/architecture.md")
    return best


def _upward_imports(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for mod, targets in graph.items():
        if mod == "hybridflow":
            continue
        for target in targets:
            if target == "hybridflow":
                continue
            if floor_of(target) < floor_of(mod):
                bad.append(f"{mod} ({FLOORS[floor_of(mod)][0]}) imports {target} ({FLOORS[floor_of(target)][0]})")
    return sorted(bad)


# Imports that go up a floor today, each with the reason it is tolerated; the list may only shrink.
KNOWN_UPWARD: set[str] = set()


def test_imports_only_go_downwards_through_the_floors():
    bad = set(_upward_imports(import_graph())) - KNOWN_UPWARD
    assert not bad, "imports that go up a floor:\n" + "\n".join(sorted(bad))


def test_no_engine_imports_another_engine():
    graph = import_graph()
    crossing = []
    for mod, targets in graph.items():
        name = mod.removeprefix("hybridflow.")
        mine = next((e for e in ENGINES if name == e or name.startswith(e + ".")), None)
        if mine is None:
            continue
        for target in targets:
            t = target.removeprefix("hybridflow.")
            other = next((e for e in ENGINES if t == e or t.startswith(e + ".")), None)
            if other is not None and other != mine:
                crossing.append(f"{mod} imports {target}")
    assert not crossing, crossing


def test_the_floor_check_catches_an_upward_import():
    """The check itself: a model-engine module importing the trainer is reported."""
    graph = {"hybridflow.engine.forward": {"hybridflow.trainer.stages"}, "hybridflow.trainer.stages": set()}
    assert _upward_imports(graph) == ["hybridflow.engine.forward (model engine) imports hybridflow.trainer.stages "
                                      "(controller parts)"]


def test_the_sandbox_sits_below_rewards_and_tools():
    """hybridflow.sandbox imports nothing else from hybridflow; rewards and tools reach it, never the reverse
    (issue 22: the sandbox used to live in tools, and rewards -> tools -> data -> rewards was a cycle)."""
    graph = import_graph()
    upward = sorted((m, t) for m, targets in graph.items() if m.startswith("hybridflow.sandbox")
                    for t in targets if t.startswith("hybridflow") and not t.startswith("hybridflow.sandbox"))
    assert not upward, f"the sandbox imports upwards: {upward}"
    to_tools = sorted(m for m, targets in graph.items() if m.startswith("hybridflow.rewards")
                      for t in targets if t.startswith("hybridflow.tools"))
    assert not to_tools, f"rewards import tools: {to_tools}"


def test_docs_name_modules_that_exist():
    """A module path written in docs/ (``hybridflow/x/y.py`` or ``trainer/x.py``) names a file of the package:
    moving a room must move its description too."""
    import re

    floor_dirs = "|".join(sorted({p.name for p in PACKAGE.iterdir() if p.is_dir() and not p.name.startswith("_")}))
    missing = []
    for doc in (REPO / "docs").glob("*.md"):
        text = doc.read_text(encoding="utf-8")
        for m in re.finditer(r"hybridflow/([A-Za-z0-9_/]+\.py)", text):
            if not (PACKAGE / m.group(1)).exists():
                missing.append(f"{doc.name}: hybridflow/{m.group(1)}")
        for m in re.finditer(rf"`((?:{floor_dirs})/[A-Za-z0-9_/]+\.py)`", text):
            if not (PACKAGE / m.group(1)).exists():
                missing.append(f"{doc.name}: {m.group(1)}")
    assert not missing, "docs name modules that do not exist: " + ", ".join(sorted(set(missing)))


def _subclasses_of(name: str, sources: dict[str, str]) -> list[str]:
    """``module.Class`` of every class (in ``sources``: module -> source text) with ``name`` among its bases."""
    found = []
    for mod, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                bases = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", None) for b in node.bases]
                if name in bases:
                    found.append(f"{mod}.{node.name}")
    return found


def test_the_controller_is_never_subclassed():
    """One controller composed of a mode and hooks (issue 37): a subclass anywhere in the package or the tests is a
    mode or a stage written as an override -- write it as a file of trainer/modes/ or trainer/hooks/."""
    files = list(PACKAGE.rglob("*.py")) + list((REPO / "tests").rglob("*.py"))
    sources = {str(p.relative_to(REPO)): p.read_text(encoding="utf-8") for p in files}
    assert not _subclasses_of("RLController", sources)
    # the check itself, and the controller refusing it at run time
    assert _subclasses_of("RLController", {"m": "class Mine(RLController):\n    pass\n"}) == ["m.Mine"]
    from hybridflow.trainer.controller import RLController

    with pytest.raises(TypeError, match="never subclassed"):
        type("Mine", (RLController,), {})


def _config_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} imports {t}" for m, targets in graph.items() if m.startswith("hybridflow.config")
                  for t in targets if t.startswith("hybridflow.") and not t.startswith(("hybridflow.config",
                                                                                         "hybridflow.utils")))


def test_config_is_the_ground_floor():
    """config/ imports nothing of ours but utils (issue 37): a rule needing another floor's knowledge lives there."""
    assert not _config_imports(import_graph())
    assert _config_imports({"hybridflow.config.checks.x": {"hybridflow.engine.model_loader"}}) == [
        "hybridflow.config.checks.x imports hybridflow.engine.model_loader"]
