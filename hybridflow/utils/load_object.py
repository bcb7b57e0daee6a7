"""The one way hybridflow loads user code: ``load_object("pkg.mod:name" | "path/file.py:name", key=...)``.

Every place that runs code a user points at -- reward functions, reward managers, agent loops, tools,
interactions, dataset and sampler classes, ``trainer.import_modules``, a model's ``external_lib`` -- goes through
here, so they all accept the same spellings and fail the same way:

* ``pkg.mod:name`` or ``path/to/file.py:name`` (the attribute after the colon); verl's dotted ``pkg.mod.Name`` is
  accepted too (the last component is the attribute), as is a separate ``name=`` (verl's ``path`` + ``name`` keys);
* a ``.py`` path is read relative to ``base_dir`` (the folder of the YAML that named it) or the working folder, and
  imported once per process under a name derived from its absolute path (``hybridflow_user_<stem>_<hash>``), so an
  object defined there pickles by reference into every process that loads the same file;
* a module path starting with ``verl.`` is read as ``hybridflow.`` (hybridflow provides verl's module paths);
* every error names the config key, the path as written and what was missing, and is an instance of the exception
  Python would raise (``FileNotFoundError``, ``ModuleNotFoundError``, ``AttributeError``, ``TypeError``,
  ``ImportError``) as well as of :class:`LoadObjectError`.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

__all__ = ["LoadObjectError", "UserFileNotFoundError", "UserModuleNotFoundError", "UserModuleImportError",
           "UserObjectNotFoundError", "UserObjectTypeError", "load_object", "import_source", "split_spec",
           "file_module_name"]


class LoadObjectError(Exception):
    """User code named by the configuration cannot be loaded; the message names the key, the path and the fix."""


class UserFileNotFoundError(LoadObjectError, FileNotFoundError):
    """The ``.py`` file does not exist."""


class UserModuleNotFoundError(LoadObjectError, ModuleNotFoundError):
    """The dotted module is not importable from this process."""


class UserModuleImportError(LoadObjectError, ImportError):
    """The module exists but raised while it was imported (its own error is chained)."""


class UserObjectNotFoundError(LoadObjectError, AttributeError):
    """The module has no attribute of that name."""


class UserObjectTypeError(LoadObjectError, TypeError):
    """The attribute exists but is not what the key needs (a class of the right base, a function...)."""


def split_spec(spec: str, name: str | None = None) -> tuple[str, str | None]:
    """``(source, attribute)`` of a spec: ``a.b:c`` / ``f.py:c`` / ``a.b.C`` (verl's dotted form) / ``f.py`` + name."""
    spec = str(spec).strip()
    if name:
        return spec, str(name)
    if ":" in spec and not _is_drive(spec):
        source, _, attr = spec.rpartition(":")
        return source, attr or None
    if spec.endswith(".py"):
        return spec, None
    source, _, attr = spec.rpartition(".")
    return (source, attr) if source else (spec, None)


def _is_drive(spec: str) -> bool:  # a Windows drive letter is not an attribute separator
    return len(spec) > 1 and spec[1] == ":" and spec.count(":") == 1


def _is_file(source: str) -> bool:
    return source.endswith(".py") or os.sep in source or source.startswith(".")


def file_module_name(path: str | os.PathLike) -> str:
    """The module name a ``.py`` file is imported under (the same in every process on the machine)."""
    full = os.path.abspath(os.path.expanduser(str(path)))
    stem = "".join(c if c.isalnum() else "_" for c in Path(full).stem)
    return f"hybridflow_user_{stem}_{hashlib.sha1(full.encode()).hexdigest()[:10]}"


def _resolve_file(source: str, base_dir: str | os.PathLike | None) -> Path:
    path = Path(os.path.expanduser(source))
    if not path.is_absolute() and base_dir is not None and not path.exists():
        candidate = Path(base_dir) / path
        if candidate.exists():
            return candidate.resolve()
    return path.resolve()


def _import_file(source: str, key: str, base_dir) -> ModuleType:
    full = _resolve_file(source, base_dir)
    if not full.is_file():
        where = f"resolved to {full}" + (f"; also looked in {base_dir}" if base_dir else "")
        raise UserFileNotFoundError(f"{key}='{source}' does not exist ({where}); fix the path (a relative path is "
                                    "read from the working folder)")
    name = file_module_name(full)
    module = sys.modules.get(name)
    if module is not None:
        return module
    spec = importlib.util.spec_from_file_location(name, full)
    if spec is None or spec.loader is None:
        raise UserModuleImportError(f"{key}='{source}' is not an importable Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before running it: dataclasses and pickling look the module up by name
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:
        sys.modules.pop(name, None)
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        raise UserModuleImportError(f"importing {key}='{source}' failed: {type(exc).__name__}: {exc}") from exc
    return module


def _verl_to_hybridflow(module: str) -> str:
    if module == "verl" or module.startswith("verl."):
        return "hybridflow" + module[len("verl"):]
    return module


def _import_module(source: str, key: str) -> ModuleType:
    module = _verl_to_hybridflow(source)
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if module == missing or module.startswith(missing + "."):
            raise UserModuleNotFoundError(
                f"{key}='{source}': cannot import module '{module}': it is not on the import path (install it, run from "
                f"its folder, or add that folder to PYTHONPATH), or give the file itself, e.g. "
                f"'path/to/{module.rsplit('.', 1)[-1]}.py'", name=module) from exc
        raise UserModuleImportError(f"importing {key}='{source}' failed: {type(exc).__name__}: {exc}",
                                    name=module) from exc
    except Exception as exc:  # noqa: BLE001 - the user's module raised while importing: say whose
        raise UserModuleImportError(f"importing {key}='{source}' failed: {type(exc).__name__}: {exc}",
                                    name=module) from exc


def import_source(source: str, *, key: str, base_dir: str | os.PathLike | None = None) -> ModuleType:
    """Import a dotted module or a ``.py`` file (once per process); errors name ``key``."""
    source = str(source).strip()
    if not source:
        raise UserModuleNotFoundError(f"{key} is empty; give 'package.module' or 'path/to/file.py'")
    if _is_file(source):
        return _import_file(source, key, base_dir)
    return _import_module(source, key)


def load_object(spec: str, *, key: str, name: str | None = None, kind: str = "object",
                expect: type | Callable[[Any], str | None] | None = None,
                base_dir: str | os.PathLike | None = None) -> Any:
    """The object ``spec`` names (see the module docstring for the spellings).

    ``key`` is the config key (or file and entry) that named it, used in every message; ``kind`` words what is
    expected ("a reward function"); ``expect`` is a base class the object must subclass, or a function returning a
    problem (a string) or ``None``.
    """
    source, attr = split_spec(spec, name)
    if not attr:
        raise UserObjectNotFoundError(f"{key}={spec!r}: say which {kind} in it to use, as 'module:name' or "
                                      "'path/to/file.py:name'")
    module = import_source(source, key=key, base_dir=base_dir)
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UserObjectNotFoundError(f"{key}='{source}' has no attribute '{attr}' (the {kind}); defined there: "
                                          f"{', '.join(_public_names(module)) or '(nothing public)'}")
        obj = getattr(obj, part)
    problem = _check(obj, expect)
    if problem:
        raise UserObjectTypeError(f"{key}: '{source}:{attr}' {problem}")
    return obj


def _check(obj: Any, expect) -> str | None:
    if expect is None:
        return None
    if isinstance(expect, type):
        if isinstance(obj, type) and issubclass(obj, expect):
            return None
        return (f"must be a subclass of {expect.__module__}.{expect.__qualname__}, got "
                f"{obj.__qualname__ if isinstance(obj, type) else type(obj).__name__}")
    return expect(obj)


def _public_names(module: ModuleType) -> list[str]:
    own = [k for k, v in vars(module).items() if not k.startswith("_")
           and (inspect.isfunction(v) or inspect.isclass(v)) and getattr(v, "__module__", None) == module.__name__]
    return sorted(own)[:20]
