"""User modules first: ``trainer.import_modules`` (and verl's ``VERL_USE_EXTERNAL_MODULES``) are imported before any
name is checked, so the advantage estimators, policy losses, reward managers and agent loops they register are
found by name (see :mod:`hybridflow.utils.user_modules`)."""

from __future__ import annotations

from hybridflow.utils.load_object import LoadObjectError
from hybridflow.utils.user_modules import import_from_environment, resolve_entry

__all__ = ["check_import_modules"]


def check_import_modules(cfg, errors: list[str]) -> None:
    """Import every entry in this process; a missing or failing module is an error naming its key."""
    try:
        import_from_environment()
    except LoadObjectError as e:
        errors.append(str(e))
    entries = cfg.trainer.import_modules or []
    if isinstance(entries, str):
        entries = [entries]
        cfg.trainer.import_modules = entries
    for i, entry in enumerate(entries):
        try:
            resolve_entry(str(entry), f"trainer.import_modules[{i}]")
        except LoadObjectError as e:
            errors.append(f"{e}. trainer.import_modules lists modules (a.b.c) or files (path/to/file.py) imported in "
                          "every process of the run")
