"""docs/migrating-from-verl.md lists every verl module path hybridflow provides, and the list is true.

* every row of the provided-paths table imports (``verl`` -> ``hybridflow``) and has the names it lists;
* every hybridflow module whose path is one of verl's module paths (``verl_module_paths.txt``: every Python
  module verl has had) is in that table or in the own-content list -- a new shim cannot go undocumented.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "migrating-from-verl.md"
VERL_PATHS = Path(__file__).with_name("verl_module_paths.txt")


def _section(tag: str) -> str:
    text = DOC.read_text(encoding="utf-8")
    match = re.search(rf"<!-- {tag} -->\n(.*?)<!-- /{tag} -->", text, re.DOTALL)
    assert match, f"{DOC.name} lacks the <!-- {tag} --> section"
    return match.group(1)


def provided_rows() -> dict[str, list[str]]:
    rows = {}
    for line in _section("verl-paths:provided").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].startswith("`verl"):
            continue
        rows[cells[0].strip("`")] = re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", cells[1])
    return rows


def own_paths() -> set[str]:
    return set(re.findall(r"`(verl[a-z0-9_.]*)`", _section("verl-paths:own")))


def as_hybridflow(path: str) -> str:
    return "hybridflow" + path[len("verl"):]


def hybridflow_modules() -> set[str]:
    package = REPO / "hybridflow"
    out = set()
    for file in package.rglob("*.py"):
        parts = file.relative_to(REPO).with_suffix("").parts
        out.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return out


def test_the_tables_parse():
    rows = provided_rows()
    assert len(rows) >= 20 and "verl.protocol" in rows and "DataProto" in rows["verl.protocol"]
    assert not set(rows) & own_paths()


@pytest.mark.parametrize("verl_path, names", sorted(provided_rows().items()))
def test_every_listed_path_imports_with_its_names(verl_path, names):
    module = importlib.import_module(as_hybridflow(verl_path))
    missing = [n for n in names if not hasattr(module, n)]
    assert names and not missing, f"{as_hybridflow(verl_path)} lacks {missing}"


def test_every_module_at_a_verl_path_is_listed():
    verl_paths = {line.strip() for line in VERL_PATHS.read_text().splitlines() if line and not line.startswith("#")}
    at_verl_paths = {m for m in hybridflow_modules() if "verl" + m[len("hybridflow"):] in verl_paths}
    documented = {as_hybridflow(p) for p in set(provided_rows()) | own_paths()}
    undocumented = sorted(at_verl_paths - documented)
    assert not undocumented, f"hybridflow modules at verl module paths missing from {DOC.name}: {undocumented}"
    stale = sorted(documented - hybridflow_modules())
    assert not stale, f"{DOC.name} lists modules that do not exist: {stale}"
    not_verl = sorted(p for p in set(provided_rows()) | own_paths() if p not in verl_paths)
    assert not not_verl, f"{DOC.name} lists paths verl never had: {not_verl}"


# ------------------------------------------------------------------ verl-recipe's entry points (recipe.<name>.*)
RECIPE_PATHS = Path(__file__).with_name("verl_recipe_module_paths.txt")


def recipe_rows() -> dict[str, list[str]]:
    rows = {}
    for line in _section("recipe-paths:provided").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].startswith("`recipe."):
            rows[cells[0].strip("`")] = re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", cells[1])
    return rows


@pytest.mark.parametrize("recipe_path, names", sorted(recipe_rows().items()))
def test_every_listed_recipe_path_imports_with_its_names(recipe_path, names):
    module = importlib.import_module("hybridflow." + recipe_path)
    missing = [n for n in names if not hasattr(module, n)]
    assert names and not missing, f"hybridflow.{recipe_path} lacks {missing}"


def test_every_module_at_a_recipe_path_is_listed():
    recipe_paths = {line.strip() for line in RECIPE_PATHS.read_text().splitlines() if line and not line.startswith("#")}
    ours = {m[len("hybridflow."):] for m in hybridflow_modules() if m.startswith("hybridflow.recipe.")}
    rows = set(recipe_rows())
    assert rows, "the recipe-paths table is empty"
    undocumented = sorted((ours & recipe_paths) - rows)
    assert not undocumented, f"hybridflow modules at verl-recipe paths missing from {DOC.name}: {undocumented}"
    assert not rows - ours, f"{DOC.name} lists recipe modules that do not exist: {sorted(rows - ours)}"
    assert not rows - recipe_paths, f"{DOC.name} lists paths verl's recipes never had: {sorted(rows - recipe_paths)}"
