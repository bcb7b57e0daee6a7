"""The package's import graph has no cycles, and no file name is used twice for different jobs.

Function-level imports count: a lazy import still ties the two modules together, it only hides the cycle
until run time.  The graph is read from the source with ``ast`` (nothing is imported).
"""

from __future__ import annotations

import ast
import collections
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "hybridflow"


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
# (``data/preprocess/gsm8k.py`` writes it, ``rewards/scorers/gsm8k.py`` scores it) are left out.
_SHARED_NAMES = {"__init__.py", "__main__.py", "errors.py", "base.py", "main_ppo.py", "tool_parser.py"}
_PER_TASK_FOLDERS = ("data/preprocess/", "rewards/scorers/")


def test_module_names_say_their_layer():
    by_name = collections.defaultdict(list)
    for path in PACKAGE.rglob("*.py"):
        rel = str(path.relative_to(PACKAGE))
        if not rel.startswith(_PER_TASK_FOLDERS):
            by_name[path.name].append(rel)
    repeated = {n: sorted(p) for n, p in by_name.items() if len(p) > 1 and n not in _SHARED_NAMES}
    assert not repeated, f"same file name in several layers (rename so the name says which): {repeated}"


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
