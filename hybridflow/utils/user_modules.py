"""User modules imported in every process of a run: ``trainer.import_modules`` and verl's ``VERL_USE_EXTERNAL_MODULES``.

A user module registers its own advantage estimators, policy losses, reward managers, agent loops or tools with
hybridflow's registries at import time (``@register_adv_est("my_est")``, ``@register_policy_loss("my_loss")``...);
``hybridflow train`` then finds them by name. Each entry is a dotted module (``my_pkg.plugins``) or a ``.py`` file.

The controller imports them while the configuration is checked (so ``algorithm.adv_estimator=my_est`` validates),
and :func:`export_user_modules` writes them into the environment variable ``HYBRIDFLOW_IMPORT_MODULES`` before any
worker starts: every process that imports ``hybridflow`` -- Ray workers, agent-loop workers, scoring processes --
imports them again from there (:func:`import_from_environment`, run by ``hybridflow/__init__``), with the folder
each was found in put on the import path, so a module next to the launch folder is found on every node that shares
it. ``VERL_USE_EXTERNAL_MODULES`` (comma-separated module names, verl's mechanism) is honoured the same way.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import ModuleType

from hybridflow.utils.load_object import LoadObjectError, import_source

__all__ = ["ENV_IMPORT_MODULES", "ENV_VERL_MODULES", "import_user_modules", "export_user_modules",
           "import_from_environment", "resolve_entry"]

ENV_IMPORT_MODULES = "HYBRIDFLOW_IMPORT_MODULES"
ENV_VERL_MODULES = "VERL_USE_EXTERNAL_MODULES"
KEY = "trainer.import_modules"


def resolve_entry(entry: str, key: str) -> dict:
    """``{"source": ..., "root": ...}``: a file made absolute; a module with the folder its import path starts in."""
    entry = str(entry).strip()
    module = import_source(entry, key=key)
    if entry.endswith(".py") or os.sep in entry:
        return {"source": str(Path(module.__file__).resolve()), "root": None, "key": key}
    root = None
    file = getattr(module, "__file__", None)
    if file:  # a.b.c at <root>/a/b/c.py (or c/__init__.py): the root is what must be on sys.path elsewhere
        path = Path(file).resolve().parent
        depth = entry.count(".") + (1 if Path(file).name == "__init__.py" else 0)
        for _ in range(depth):
            path = path.parent
        root = str(path)
    return {"source": entry, "root": root, "key": key}


def import_user_modules(entries: list[str] | tuple[str, ...], key: str = KEY) -> list[dict]:
    """Import each entry in this process (errors name ``key[i]``); returns what :func:`export_user_modules` needs."""
    return [resolve_entry(entry, f"{key}[{i}]") for i, entry in enumerate(entries or ())]


def export_user_modules(resolved: list[dict], ray_init: dict | None = None) -> None:
    """Make every later process of this run import the modules: the environment variable (inherited by processes
    started from here, Ray included when it starts here) and, when given, Ray's job ``runtime_env`` (a cluster this
    run attaches to)."""
    if not resolved:
        return
    value = json.dumps(resolved)
    os.environ[ENV_IMPORT_MODULES] = value
    if ray_init is not None:
        runtime_env = dict(ray_init.get("runtime_env") or {})
        env_vars = dict(runtime_env.get("env_vars") or {})
        env_vars[ENV_IMPORT_MODULES] = value
        runtime_env["env_vars"] = env_vars
        ray_init["runtime_env"] = runtime_env


_IMPORTED = False


def import_from_environment() -> list[ModuleType]:
    """Import the modules named by ``HYBRIDFLOW_IMPORT_MODULES`` and ``VERL_USE_EXTERNAL_MODULES`` (once per process)."""
    global _IMPORTED
    if _IMPORTED:
        return []
    _IMPORTED = True
    entries: list[dict] = []
    verl = os.environ.get(ENV_VERL_MODULES, "")
    entries += [{"source": m.strip(), "root": None, "key": f"{ENV_VERL_MODULES}={verl}"}
                for m in verl.split(",") if m.strip()]
    raw = os.environ.get(ENV_IMPORT_MODULES, "")
    if raw:
        try:
            entries += json.loads(raw)
        except ValueError:
            raise LoadObjectError(f"{ENV_IMPORT_MODULES}={raw!r} is not the JSON list hybridflow writes there; "
                                  "unset it (set trainer.import_modules instead)") from None
    modules = []
    for entry in entries:
        root = entry.get("root")
        if root and root not in sys.path:
            sys.path.append(root)
        modules.append(import_source(entry["source"], key=entry.get("key", KEY)))
    return modules
