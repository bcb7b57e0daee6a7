"""User-supplied dataset and sampler classes (``data.custom_cls`` and ``data.sampler``), as in verl."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from typing import Any


def load_class(path: str, name: str, field: str) -> type:
    """Class ``name`` from ``path`` (a .py file or a dotted module); errors name the config ``field``."""
    if not name:
        raise ValueError(f"{field}: a class name is required next to the path '{path}'")
    if path.endswith(".py"):
        full = os.path.abspath(os.path.expanduser(path))
        if not os.path.isfile(full):
            raise FileNotFoundError(f"{field} path '{path}' does not exist (resolved to {full})")
        module_name = "hybridflow_user_" + hashlib.sha1(full.encode()).hexdigest()[:12]
        module = sys.modules.get(module_name)
        if module is None:
            spec = importlib.util.spec_from_file_location(module_name, full)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            sys.modules[module_name] = module
    else:
        module = importlib.import_module(path)
    cls = getattr(module, name, None)
    if not isinstance(cls, type):
        raise ValueError(f"{field}: '{name}' is not a class in '{path}'")
    return cls


def custom_dataset_class(data_config) -> type | None:
    """``data.custom_cls.{path,name}`` when set (the class must accept RLHFDataset's arguments)."""
    path = data_config.custom_cls.path
    return load_class(path, data_config.custom_cls.name, "data.custom_cls") if path else None


def custom_sampler(data_config, dataset: Any):
    """Instance of ``data.sampler.{class_path,class_name}``, built as verl does: ``cls(data_source=, data_config=)``."""
    path = data_config.sampler.class_path
    if not path:
        return None
    cls = load_class(path, data_config.sampler.class_name, "data.sampler")
    return cls(data_source=dataset, data_config=data_config)
