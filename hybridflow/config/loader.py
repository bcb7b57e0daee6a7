"""Load the trainer config: YAML defaults + verl's Hydra override grammar -> typed ``PPOConfig``.

Steps: (1) split ``--config-path/--config-name`` from the key=value overrides, (2) check every plain
override names an existing key (a typo gets the closest valid key, not Hydra's generic message),
(3) compose with Hydra so ``a.b=v``, ``+a.b=v``, ``++a.b=v``, ``~a.b`` and lists behave exactly as in
verl, (4) resolve interpolations, (5) build the dataclasses with type checks. Semantic rules
(batch sizes, supported choices) live in ``validate.py``.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from functools import lru_cache
from pathlib import Path
from typing import Any, Union

from omegaconf import DictConfig, ListConfig, OmegaConf

from hybridflow.config import yaml_cache
from hybridflow.config.aliases import KEY_ALIASES, PATH_ALIASES, canonical_key  # noqa: F401 - re-exported
from hybridflow.config.errors import ConfigError
from hybridflow.config.schema import PPOConfig
from hybridflow.config.targets import drop_config_targets
from hybridflow.utils.registry import closest

CONFIG_DIR = Path(__file__).resolve().parent
DEFAULT_CONFIG_NAME = "ppo_trainer"
# verl's Megatron trainer configs -> the config here they equal once every role has strategy=megatron
MEGATRON_CONFIG_NAMES = {"ppo_megatron_trainer": "ppo_trainer",
                         "one_step_off_ppo_megatron_trainer": "one_step_off_ppo_trainer",
                         "fully_async_ppo_megatron_trainer": "fully_async_ppo_trainer",
                         "dapo_megatron_trainer": "dapo_trainer"}
MEGATRON_ROLES = ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic")


@dataclasses.dataclass
class CommandLine:
    """A trainer command line split into its parts."""

    overrides: list[str]
    config_path: str | None = None
    config_name: str | None = None
    dry_run: bool = False


def parse_command_line(argv: list[str]) -> CommandLine:
    """Separate ``--config-path``, ``--config-name`` and ``--dry-run`` from Hydra overrides."""
    cl = CommandLine(overrides=[])
    it = iter(argv)
    for arg in it:
        for flag, attr in (("--config-path", "config_path"), ("--config-name", "config_name"),
                           ("--config_path", "config_path"), ("--config_name", "config_name"),
                           ("-cp", "config_path"), ("-cn", "config_name")):
            if arg == flag:
                try:
                    setattr(cl, attr, next(it))
                except StopIteration:
                    raise ConfigError([f"{flag} needs a value"]) from None
                break
            if arg.startswith(flag + "="):
                setattr(cl, attr, arg.split("=", 1)[1])
                break
        else:
            if arg == "--dry-run":
                cl.dry_run = True
            elif arg.startswith("-"):
                raise ConfigError([f"unknown option '{arg}'. Options: --config-path, --config-name, --dry-run; "
                                   "everything else must be a key=value override"])
            else:
                cl.overrides.append(arg)
    return cl


def compose_config(
    overrides: list[str] | None = None,
    config_path: str | None = None,
    config_name: str | None = None,
) -> PPOConfig:
    """Compose, resolve and type the trainer config (no rule checked: ``hybridflow.launch.config.load_config`` runs
    the check pipeline on it). Raises ``ConfigError`` for a key that does not exist or a value of the wrong type."""
    raw, untouched = compose_with_provenance(overrides or [], config_path, config_name)
    cfg = build_dataclass(PPOConfig, OmegaConf.to_container(raw, resolve=True), "")
    cfg.__dict__["_untouched_interpolations"] = untouched  # key_policy: a key following its default expression
    return cfg


def compose_raw(overrides: list[str], config_path: str | None = None, config_name: str | None = None) -> DictConfig:
    """Hydra compose with our defaults on the search path; returns the resolved DictConfig."""
    return compose_with_provenance(overrides, config_path, config_name)[0]


def compose_with_provenance(overrides: list[str], config_path: str | None = None,
                            config_name: str | None = None) -> tuple[DictConfig, frozenset[str]]:
    """:func:`compose_raw`, plus the keys that still hold their default interpolation (``${...}`` as in the
    defaults file): they follow another key, so a changed value there does not mean the user set them."""
    name, config_path, overrides = _megatron_config_name(config_name or DEFAULT_CONFIG_NAME, config_path, overrides)
    cfg_dir = _config_dir(config_path, name)
    _refuse_engine_nodes(overrides)
    overrides = _apply_aliases(_role_group_choices(list(overrides)))
    overrides = _check_override_keys(overrides, cfg_dir, name)
    # verl scripts write '+key=v' for keys that may or may not exist; Hydra rejects '+' on an existing
    # key, so treat '+' as '++' (add or override), which is what those command lines mean.
    overrides = ["+" + o if o.startswith("+") and not o.startswith("++") else o for o in overrides]
    cfg = _plain(_hydra_compose(cfg_dir, name, overrides))
    drop_config_targets(cfg)
    _migrate_alias_nodes(cfg, {ov.partition("=")[0].lstrip("+~") for ov in overrides if "=" in ov})
    untouched = _untouched_interpolations(cfg)
    try:
        OmegaConf.resolve(cfg)
    except Exception as e:  # interpolation to a missing key, etc.
        raise ConfigError([f"could not resolve the config: {_first_line(e)}"]) from None
    return cfg, untouched


def _megatron_config_name(name: str, config_path: str | None, overrides: list[str]):
    """verl's Megatron trainer configs are its other ones with every role on the Megatron engine: here that config
    with strategy=megatron (the torch-native N-D engine), the command line's overrides after."""
    stem = name.removesuffix(".yaml")
    if stem not in MEGATRON_CONFIG_NAMES:
        return name, config_path, list(overrides)
    return (MEGATRON_CONFIG_NAMES[stem], None,
            [f"{role}.strategy=megatron" for role in MEGATRON_ROLES] + list(overrides))


def _config_dir(config_path: str | None, name: str) -> Path:
    """The folder ``--config-path`` names (a verl-style path to verl's own folder finds ours), holding ``name``."""
    cfg_dir = CONFIG_DIR
    if config_path is not None:
        cfg_dir = Path(os.path.expanduser(config_path))
        if not cfg_dir.is_absolute():
            cfg_dir = Path.cwd() / cfg_dir
        stem = name.removesuffix(".yaml")
        if not (cfg_dir / f"{stem}.yaml").exists() and (CONFIG_DIR / f"{stem}.yaml").exists():
            cfg_dir = CONFIG_DIR  # a verl-style --config-path pointing at verl's own folder (ppo_trainer,
            # one_step_off_ppo_trainer, fully_async_ppo_trainer ship here)
        if not cfg_dir.is_dir():
            raise ConfigError([f"--config-path '{config_path}' is not a directory"])
    if not (cfg_dir / f"{name.removesuffix('.yaml')}.yaml").exists():
        raise ConfigError([f"--config-name '{name}': no file {name.removesuffix('.yaml')}.yaml in {cfg_dir}"])
    return cfg_dir


def _hydra_compose(cfg_dir: Path, name: str, overrides: list[str]) -> DictConfig:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException

    extra = [] if cfg_dir == CONFIG_DIR else [f"hydra.searchpath=[file://{CONFIG_DIR}]"]
    yaml_cache.install()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(cfg_dir), version_base=None):
            return compose(config_name=name, overrides=list(overrides) + extra)
    except HydraException as e:
        raise ConfigError([f"could not apply the overrides: {_first_line(e)}"]) from None
    finally:
        GlobalHydra.instance().clear()


def _plain(cfg: DictConfig) -> DictConfig:
    """Hydra's composed config as a plain, writable tree without the ``hydra`` node: the flags Hydra set (struct,
    read-only) cleared in place on every node -- a rebuild from a container (~60 ms on the trainer's tree) gives the
    same tree."""
    for node in _containers(cfg):
        node._set_flag(["struct", "readonly"], [None, None])
    cfg.pop("hydra", None)
    return cfg


def _containers(node: DictConfig | ListConfig):
    yield node
    for key in (node.keys() if isinstance(node, DictConfig) else range(len(node))):
        child = node._get_node(key)
        if isinstance(child, (DictConfig, ListConfig)) and not (child._is_none() or child._is_missing()
                                                                or child._is_interpolation()):
            yield from _containers(child)


def _parsed_value(value: str) -> Any:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        return OverridesParser.create().parse_overrides([f"k={value}"])[0].value()
    except Exception:  # noqa: BLE001 - compare the text when Hydra cannot read it (it reports that later)
        return value


def _apply_aliases(overrides: list[str]) -> list[str]:
    """Rewrite old and verl 0.9 spellings to the key read here; two spellings of one key with different values are
    an error naming both (the same value twice is fine)."""
    import warnings

    from hybridflow.config.checks import ConfigWarning

    out, given, conflicts = [], {}, []
    for ov in overrides:
        key, sep, value = ov.partition("=")
        prefix = key[:len(key) - len(key.lstrip("+~"))]
        bare = key.lstrip("+~")
        new_key = canonical_key(bare)
        if sep and new_key != bare:
            if not any(bare == old or bare.startswith(old + ".") for old in PATH_ALIASES):
                warnings.warn(f"{bare} is an old spelling; using {new_key}", ConfigWarning, stacklevel=3)
            ov = f"{prefix}{new_key}={value}"
        if sep:
            earlier = given.get(new_key)
            if earlier is not None and earlier[0] != bare and _parsed_value(earlier[1]) != _parsed_value(value):
                conflicts.append(f"{earlier[0]}={earlier[1]} and {bare}={value} set the same setting ({new_key}) to "
                                 f"different values; keep one of the two")
            given[new_key] = (bare, value)
        out.append(ov)
    if conflicts:
        raise ConfigError(conflicts)
    return out


# Nodes of verl engines hybridflow does not have: refused as a whole, with the engine it does have (VeOmni's node is
# read: config/checks/engines.py).
_FOREIGN_ENGINES = {
    "torchtitan": "TorchTitan",
    "automodel": "NeMo Automodel",
}
# verl's defaults-list choice of a role's config group (``actor@actor_rollout_ref.actor=mlite_actor``): the group and
# its package -> the role whose ``model_engine`` the choice sets
_ROLE_GROUPS = {"actor@actor_rollout_ref.actor": "actor_rollout_ref.actor", "ref@actor_rollout_ref.ref":
                "actor_rollout_ref.ref", "critic@critic": "critic"}


def _role_group_choices(overrides: list[str]) -> list[str]:
    """``actor@actor_rollout_ref.actor=<engine>_actor`` -> ``actor_rollout_ref.actor.model_engine=<engine>`` (the role's
    engine; config/checks/engines.py reads it); any other choice of those groups is an error naming the ones known."""
    out, errors = [], []
    for ov in overrides:
        key, sep, value = ov.partition("=")
        role = _ROLE_GROUPS.get(key.lstrip("+~"))
        if role is None or not sep:
            out.append(ov)
            continue
        kind = key.lstrip("+~").split("@")[0]
        engine = value.strip().removesuffix(f"_{kind}")
        if engine not in ("dp", "megatron", "veomni", "mlite"):
            errors.append(f"{key}={value}: choose dp_{kind}, megatron_{kind}, veomni_{kind} or mlite_{kind} (verl's "
                          "engines that run here)")
            continue
        out.append(f"{role}.model_engine={engine}")
    if errors:
        raise ConfigError(errors)
    return out


def _refuse_engine_nodes(overrides: list[str]) -> None:
    found: dict[str, list[str]] = {}
    for ov in overrides:
        parts = ov.partition("=")[0].lstrip("+~").split(".")
        for node, engine in _FOREIGN_ENGINES.items():
            if node in parts[:-1]:
                found.setdefault(engine, []).append(".".join(parts))
    if found:
        raise ConfigError([f"{', '.join(keys[:3])}{' ...' if len(keys) > 3 else ''}: these configure verl's {engine} "
                           "training engine, which hybridflow does not have: it trains with FSDP2 (verl's "
                           "model_engine=dp). Drop them and size the run with *.fsdp_config.* and the batch sizes"
                           for engine, keys in found.items()])


def _leaves(node: Any, prefix: str) -> list[tuple[str, Any]]:
    if isinstance(node, dict) and node:
        return [leaf for k, v in node.items() for leaf in _leaves(v, f"{prefix}.{k}")]
    return [(prefix, node)]


def _migrate_alias_nodes(cfg: DictConfig, given: set[str] = frozenset()) -> None:
    """A config file that uses verl 0.9's nodes (``reward:``, top-level ``sandbox_fusion:``, ``critic.fsdp:``) or the
    first DAPO recipe's ``reward_model.overlong_buffer:``: each value that is set (not null) lands on the key read
    here; a conflicting value already there is an error, unless the command line set it (``given``: the override
    keys, in the spelling read here), which wins over the file as any override does."""
    raw = OmegaConf.to_container(cfg, resolve=False)
    defaults = _defaults_raw()
    errors = []
    for old in ("reward", "sandbox_fusion", "critic.fsdp", "reward_model.overlong_buffer"):
        node = OmegaConf.select(cfg, old, default=None)
        if node is None:
            continue
        for path, value in _leaves(OmegaConf.to_container(node, resolve=False), old):
            if value is None or value == {}:
                continue
            target = canonical_key(path)
            if any(target == key or target.startswith(key + ".") for key in given):
                continue
            current = _select(raw, target)
            if current is not _MISSING and current != value and current != _select(defaults, target):
                errors.append(f"{path}={value!r} and {target}={current!r} set the same setting to different values; "
                              "keep one of the two")
                continue
            OmegaConf.update(cfg, target, value, force_add=True)
        parent, _, leaf = old.rpartition(".")
        (OmegaConf.select(cfg, parent) if parent else cfg).pop(leaf)
    if errors:
        raise ConfigError(errors)


_MISSING = object()


def _select(tree: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return _MISSING
        tree = tree[part]
    return tree


@lru_cache(maxsize=1)
def _defaults_raw() -> dict:
    return OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / f"{DEFAULT_CONFIG_NAME}.yaml"), resolve=False)


def _untouched_interpolations(cfg: DictConfig) -> frozenset[str]:
    """Keys whose value is still the interpolation the defaults file gives them."""
    defaults = dict(_leaves(_defaults_raw(), ""))
    current = dict(_leaves(OmegaConf.to_container(cfg, resolve=False), ""))
    return frozenset(k[1:] for k, v in current.items()
                     if isinstance(v, str) and "${" in v and defaults.get(k) == v)


def _first_line(e: Exception) -> str:
    msg = str(e).strip().splitlines()
    return msg[0] if msg else type(e).__name__


def _check_override_keys(overrides: list[str], cfg_dir: Path, name: str) -> list[str]:
    """A plain ``a.b=v`` must name an existing key: report the closest one instead of Hydra's error.

    Returns the overrides to compose. A plain override of a new key inside a free-form node (an empty
    mapping in the defaults, such as ``rollout.engine_kwargs.vllm``) is what verl's own scripts write, so
    it is turned into ``++key=v`` (add or override) rather than rejected by Hydra's struct mode.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(overrides=list(overrides))
    except Exception as e:
        raise ConfigError([f"could not parse the overrides: {_first_line(e)}"]) from None
    base = _base_tree(cfg_dir, name)
    if base is None:
        return list(overrides)  # the named config does not compose on its own: Hydra reports why
    user_config = not (cfg_dir == CONFIG_DIR and name.removesuffix(".yaml") == DEFAULT_CONFIG_NAME)
    known = _all_key_paths(base)
    errors, out = [], []
    for raw, ov in zip(overrides, parsed):
        key = ov.key_or_group
        if ov.is_add() or ov.is_force_add() or ov.is_delete() or key.startswith("hydra") or key in known:
            out.append(raw)
            continue
        if _under_free_form(base, key):
            out.append("++" + raw)
            continue
        if user_config and ("/" in key or "@" in key):
            out.append(raw)  # a config-group choice of the user's defaults list: Hydra resolves it
            continue
        hint = closest(key, sorted(known))
        msg = f"unknown config key '{key}'"
        if hint:
            msg += f"; did you mean '{hint}'?"
        msg += f" (to add a new key on purpose write '+{key}=...')"
        errors.append(msg)
    if errors:
        raise ConfigError(errors)
    return out


_BASE_TREES: dict[tuple, DictConfig | None] = {}


def _yaml_stamp(*dirs: Path) -> tuple:
    """Every YAML file under ``dirs`` with its modification time: a cached tree is reused only while none of
    the files it may have been composed from changed."""
    return tuple(sorted((str(p), p.stat().st_mtime_ns) for d in dirs for p in Path(d).rglob("*.yaml")))


def _base_tree(cfg_dir: Path, name: str) -> DictConfig | None:
    """The key tree overrides apply to (read-only, cached per config file and its YAML files' times): our
    defaults file, or the named config composed without overrides (``--config-path/--config-name``: its own keys
    and those its defaults list brings in)."""
    key = (str(cfg_dir), name, _yaml_stamp(cfg_dir, CONFIG_DIR))
    if key not in _BASE_TREES:
        tree = _compose_base_tree(cfg_dir, name)
        if tree is not None:
            OmegaConf.set_readonly(tree, True)
        _BASE_TREES[key] = tree
    return _BASE_TREES[key]


def _compose_base_tree(cfg_dir: Path, name: str) -> DictConfig | None:
    stem = name.removesuffix(".yaml")
    if cfg_dir == CONFIG_DIR and stem == DEFAULT_CONFIG_NAME:
        return OmegaConf.load(CONFIG_DIR / f"{DEFAULT_CONFIG_NAME}.yaml")
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    extra = [] if cfg_dir == CONFIG_DIR else [f"hydra.searchpath=[file://{CONFIG_DIR}]"]
    yaml_cache.install()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(cfg_dir), version_base=None):
            cfg = compose(config_name=stem, overrides=extra)
    except Exception:  # noqa: BLE001 - composing again with the overrides reports the problem
        return None
    finally:
        GlobalHydra.instance().clear()
    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    cfg.pop("hydra", None)
    return cfg


def _all_key_paths(node: Any, prefix: str = "") -> set[str]:
    out: set[str] = set()
    if isinstance(node, DictConfig):
        for k in node.keys():
            path = f"{prefix}.{k}" if prefix else str(k)
            out.add(path)
            child = node._get_node(k)
            if isinstance(child, DictConfig):
                out |= _all_key_paths(child, path)
    return out


def _under_free_form(base: DictConfig, key: str) -> bool:
    """True when ``key`` lies under a node that is an empty dict in the defaults (free-form)."""
    parts = key.split(".")
    node: Any = base
    for p in parts[:-1]:
        if not isinstance(node, DictConfig) or p not in node:
            return False
        node = node._get_node(p)
        if isinstance(node, DictConfig) and len(node) == 0:
            return True
    return False


# ----------------------------------------------------------------------------- dataclass building
def build_dataclass(cls: type, data: Any, path: str) -> Any:
    """Instantiate ``cls`` from a plain dict, checking unknown / missing keys and value types."""
    where = path or "<root>"
    if not isinstance(data, dict):
        raise ConfigError([f"'{where}' must be a mapping of keys, got {type(data).__name__}: {data!r}"])
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    errors: list[str] = []
    added = {k: v for k, v in data.items() if k not in fields} if getattr(cls, "ACCEPTS_ADDED_KEYS", False) else {}
    for key in data:
        if key not in fields and key not in added:
            full = f"{path}.{key}" if path else str(key)
            hint = closest(str(key), list(fields))
            msg = f"unknown config key '{full}'"
            if hint:
                msg += f"; did you mean '{path + '.' if path else ''}{hint}'?"
            else:
                msg += f"; valid keys under '{where}': {', '.join(sorted(fields))}"
            errors.append(msg)
    kwargs = {}
    for name, f in fields.items():
        full = f"{path}.{name}" if path else name
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                errors.append(f"missing config key '{full}' (the defaults file and schema disagree)")
            continue  # a field with a default (a key verl gives some nodes only) takes it
        try:
            kwargs[name] = _coerce(hints[name], data[name], full)
        except ConfigError as e:
            errors.extend(e.messages)
    if errors:
        raise ConfigError(errors)
    obj = cls(**kwargs)
    if added:
        _keep_added_keys(obj, added, path)
    return obj


def _keep_added_keys(obj: Any, added: dict, path: str) -> None:
    """Attach keys a schemaless verl node (``data``) received through ``+key=v``, and say who reads them."""
    import warnings

    from hybridflow.config.checks import ConfigWarning

    for key, value in added.items():
        setattr(obj, key, value)
        warnings.warn(f"{path}.{key} is not a hybridflow key; it is kept for a custom dataset ({path}.custom_cls) "
                      f"to read as config.{path}.{key}, and the built-in dataset ignores it", ConfigWarning,
                      stacklevel=4)
    obj._added_keys = tuple(added)


def _coerce(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _coerce(args[0], value, path)
    if dataclasses.is_dataclass(tp):
        return build_dataclass(tp, value, path)
    if value is None:
        raise ConfigError([f"'{path}' must not be null (expected {getattr(tp, '__name__', tp)})"])
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError([f"'{path}' expects true/false, got {value!r}"])
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError([f"'{path}' expects an integer, got {value!r}"])
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError([f"'{path}' expects a number, got {value!r}"])
    if tp is str:
        if isinstance(value, (dict, list)):
            raise ConfigError([f"'{path}' expects a string, got {value!r}"])
        return str(value)
    if tp is list or origin is list:
        if isinstance(value, (list, tuple, ListConfig)):
            return list(value)
        raise ConfigError([f"'{path}' expects a list like [a,b], got {value!r}"])
    if tp is dict or origin is dict:
        if isinstance(value, dict):
            return dict(value)
        raise ConfigError([f"'{path}' expects a mapping like {{k: v}}, got {value!r}"])
    return value


def config_to_dict(cfg: Any) -> dict:
    """Plain nested dict of a typed config (for logging, checkpoints and the dry run), ``+``-added keys included."""
    out = dataclasses.asdict(cfg)
    for f in dataclasses.fields(cfg):
        node = getattr(cfg, f.name)
        for key in getattr(node, "_added_keys", ()):
            out[f.name][key] = getattr(node, key)
    return out
