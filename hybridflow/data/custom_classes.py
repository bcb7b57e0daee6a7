"""User-supplied dataset and sampler classes (``data.custom_cls`` and ``data.sampler``), as in verl."""

from __future__ import annotations

from typing import Any


def load_class(path: str, name: str, field: str, name_key: str | None = None) -> type:
    """Class ``name`` from ``path`` (a .py file or a dotted module); errors name the config key ``field``."""
    from hybridflow.utils.load_object import load_object

    if not name:
        raise ValueError(f"{field}={path!r} needs the class name beside it ({name_key or 'name'})")
    return load_object(path, name=name, key=field, kind="class", expect=_must_be_class)


def _must_be_class(obj: Any) -> str | None:
    return None if isinstance(obj, type) else f"is a {type(obj).__name__}, not a class"


def custom_dataset_class(data_config) -> type | None:
    """``data.custom_cls.{path,name}`` when set (the class must accept RLHFDataset's arguments)."""
    path = data_config.custom_cls.path
    return load_class(path, data_config.custom_cls.name, "data.custom_cls.path", "data.custom_cls.name") if path else None


def custom_sampler(data_config, dataset: Any):
    """Instance of ``data.sampler.{class_path,class_name}``, built as verl does: ``cls(data_source=, data_config=)``."""
    path = data_config.sampler.class_path
    if not path:
        return None
    cls = load_class(path, data_config.sampler.class_name, "data.sampler.class_path", "data.sampler.class_name")
    return cls(data_source=dataset, data_config=data_config)
