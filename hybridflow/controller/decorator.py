"""``@register`` and the dispatch modes: how one controller call becomes N per-rank calls and back.

HybridFlow (Sheng et al., 2024, "HybridFlow: A Flexible and Efficient RLHF Framework", §4.1) lets the
single controller call ``actor.update_actor(batch)`` as if the actor were one object, while the actor
is really an SPMD group of ranks. Each worker method declares a *transfer protocol* -- how arguments
are split over ranks (dispatch) and how per-rank results are merged (collect) -- and the worker group
applies it around the remote calls. ``@register`` only records that declaration on the method; the
worker group (``worker_group.py``) reads it when it binds the method.

A dispatch function has the signature ``dispatch_fn(worker_group, *args, **kwargs)`` and returns a
:class:`DispatchPlan` (or, as in verl, a pair ``(args, kwargs)`` whose every value is a list with one
entry per rank). A collect function is ``collect_fn(worker_group, outputs) -> result``.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Sequence

from hybridflow.protocol import DataProto, DataProtoFuture, pad_for_data_parallel
from hybridflow.utils.registry import Registry

__all__ = [
    "Dispatch",
    "Execute",
    "DispatchMode",
    "DispatchPlan",
    "MethodSpec",
    "register",
    "register_dispatch_mode",
    "get_dispatch_mode",
    "make_nd_compute_dataproto_dispatch_fn",
    "registered_methods",
    "concat_collect",
]


class Dispatch(str, Enum):
    """Built-in transfer protocols (names as in verl). More can be added with ``register_dispatch_mode``."""

    ONE_TO_ALL = "ONE_TO_ALL"  # same arguments to every rank; list of outputs
    ALL_TO_ALL = "ALL_TO_ALL"  # per-rank lists split when every argument is one, else broadcast; list
    DP_COMPUTE = "DP_COMPUTE"  # every argument is already a per-rank list; list of outputs
    DP_COMPUTE_PROTO = "DP_COMPUTE_PROTO"  # DataProto args padded + chunked; outputs concatenated, unpadded
    DP_COMPUTE_PROTO_WITH_FUNC = "DP_COMPUTE_PROTO_WITH_FUNC"  # first arg (a function) broadcast, rest chunked
    DP_COMPUTE_METRIC = "DP_COMPUTE_METRIC"  # chunked like DP_COMPUTE_PROTO; list of outputs (metrics)
    RANK_ZERO = "RANK_ZERO"  # only rank 0 runs; its output is returned


class Execute(str, Enum):
    """Which ranks run the method: all of them, or rank 0 only (its output is returned unwrapped)."""

    ALL = "ALL"
    RANK_ZERO = "RANK_ZERO"


@dataclass
class DispatchPlan:
    """Per-rank arguments: ``args[j][r]`` is positional argument j for rank r (same for ``kwargs``).

    ``pad_size`` rows were appended to DataProto arguments (``padded_len`` rows in all) to make them
    divisible; collect drops the outputs of those rows.
    """

    args: tuple[list, ...]
    kwargs: dict[str, list]
    pad_size: int = 0
    padded_len: int = 0

    def for_rank(self, rank: int) -> tuple[tuple, dict]:
        return tuple(a[rank] for a in self.args), {k: v[rank] for k, v in self.kwargs.items()}


@dataclass(frozen=True)
class DispatchMode:
    """A named transfer protocol.

    ``returns_dataproto`` modes merge outputs with :func:`concat_collect` over ``collect_ranks(group)``
    (all ranks when ``None``), and their non-blocking calls return a ``DataProtoFuture``; other modes
    use ``collect_fn`` and return Ray refs when non-blocking. ``execute_mode`` forces which ranks run.
    """

    name: str
    dispatch_fn: Callable[..., Any]
    collect_fn: Callable[[Any, list], Any] | None = None
    returns_dataproto: bool = False
    collect_ranks: Callable[[Any], list[int]] | None = None
    execute_mode: Execute | None = None

    def plan(self, group, *args, **kwargs) -> DispatchPlan:
        out = self.dispatch_fn(group, *args, **kwargs)
        if isinstance(out, DispatchPlan):
            return out
        if isinstance(out, tuple) and len(out) == 2:
            p_args, p_kwargs = out
            plan = DispatchPlan(tuple(p_args), dict(p_kwargs))
            _check_per_rank(self.name, plan, group.world_size)
            return plan
        raise TypeError(
            f"dispatch function of mode '{self.name}' returned {type(out).__name__}; "
            "return a DispatchPlan or an (args, kwargs) pair of per-rank lists"
        )


def _check_per_rank(mode: str, plan: DispatchPlan, world_size: int) -> None:
    named = [(f"positional arg {i}", v) for i, v in enumerate(plan.args)] + list(plan.kwargs.items())
    for name, v in named:
        if not isinstance(v, (list, tuple)) or len(v) != world_size:
            raise ValueError(
                f"dispatch mode '{mode}' must give {name} as a list of {world_size} per-rank values, "
                f"got {type(v).__name__}{'' if not isinstance(v, (list, tuple)) else f' of length {len(v)}'}"
            )


# ---------------------------------------------------------------------------------------------- built-ins
def _broadcast(group, *args, **kwargs) -> DispatchPlan:
    n = group.world_size
    return DispatchPlan(tuple([a] * n for a in args), {k: [v] * n for k, v in kwargs.items()})


def _all_to_all(group, *args, **kwargs) -> DispatchPlan:
    n = group.world_size
    values = list(args) + list(kwargs.values())
    if values and all(isinstance(v, (list, tuple)) and len(v) == n for v in values):
        return DispatchPlan(tuple(list(a) for a in args), {k: list(v) for k, v in kwargs.items()})
    return _broadcast(group, *args, **kwargs)


def _dp_compute(group, *args, **kwargs) -> DispatchPlan:
    plan = DispatchPlan(tuple(args), dict(kwargs))
    _check_per_rank(Dispatch.DP_COMPUTE.value, plan, group.world_size)
    return DispatchPlan(tuple(list(a) for a in args), {k: list(v) for k, v in kwargs.items()})


def _split_proto(mode: str, name: str, value: Any, chunks: int) -> tuple[list, int, int]:
    """Pad ``value`` to a multiple of ``chunks`` and split it; returns (parts, pad_size, padded_len)."""
    if isinstance(value, DataProtoFuture):
        return value.chunk(chunks, auto_pad=True), -1, 0  # pad unknown here: the workers drop it themselves
    if isinstance(value, DataProto):
        padded, pad = pad_for_data_parallel(value, chunks)  # padding rows carry response_mask = 0
        return padded.chunk(chunks), pad, len(padded)
    raise TypeError(
        f"Dispatch.{mode} splits every argument over the data-parallel ranks, but {name} is a "
        f"{type(value).__name__}. Pass a DataProto (put scalar options in data.meta_info) or use "
        "Dispatch.ONE_TO_ALL for methods that take plain values."
    )


def _chunk_all(mode: str, chunks: int, args: Sequence, kwargs: dict) -> tuple[tuple[list, ...], dict[str, list], int, int]:
    pads: set[int] = set()
    padded_len = 0
    out_args = []
    for i, a in enumerate(args):
        parts, pad, padded_len = _split_proto(mode, f"positional argument {i}", a, chunks)
        out_args.append(parts)
        pads.add(pad)
    out_kwargs = {}
    for k, v in kwargs.items():
        out_kwargs[k], pad, padded_len = _split_proto(mode, f"argument '{k}'", v, chunks)
        pads.add(pad)
    known = pads - {-1}
    if known and -1 in pads:
        raise TypeError(
            f"Dispatch.{mode}: do not mix DataProto and DataProtoFuture arguments in one call; "
            "resolve the future with .get() first (padding is handled on different sides for the two)"
        )
    if len(known) > 1:
        raise ValueError(f"Dispatch.{mode}: DataProto arguments have different lengths (padding {sorted(known)})")
    return tuple(out_args), out_kwargs, known.pop() if known else 0, padded_len


def _dp_compute_proto(group, *args, **kwargs) -> DispatchPlan:
    return DispatchPlan(*_chunk_all(Dispatch.DP_COMPUTE_PROTO.value, group.world_size, args, kwargs))


def _dp_compute_proto_with_func(group, fn, *args, **kwargs) -> DispatchPlan:
    if not callable(fn):
        raise TypeError(f"Dispatch.DP_COMPUTE_PROTO_WITH_FUNC expects a function first, got {type(fn).__name__}")
    args_p, kwargs_p, pad, padded_len = _chunk_all(Dispatch.DP_COMPUTE_PROTO_WITH_FUNC.value, group.world_size, args, kwargs)
    return DispatchPlan(([fn] * group.world_size,) + args_p, kwargs_p, pad, padded_len)


def _collect_list(group, outputs: list) -> list:
    return list(outputs)


def _collect_first(group, outputs: list) -> Any:
    return outputs[0]


def drop_padding(out: DataProto, pad_rows: int, in_rows: int) -> DataProto:
    """Drop the outputs of the last ``pad_rows`` of ``in_rows`` input rows.

    A method may return k rows per input row (e.g. ``rollout.n`` interleaved samples), so the
    padding's outputs are the last ``pad_rows * k`` rows.
    """
    if pad_rows <= 0:
        return out
    if in_rows <= 0 or len(out) % in_rows:
        raise ValueError(
            f"cannot drop auto-padding: {len(out)} output rows for {in_rows} padded input rows. With auto-padding a "
            "method must return a fixed number of rows per input row; otherwise send a batch whose size divides "
            "the number of data-parallel ranks."
        )
    return out.slice(0, len(out) - pad_rows * (len(out) // in_rows))


def concat_collect(outputs: list, ranks: Sequence[int] | None = None, pad_size: int = 0, padded_len: int = 0) -> DataProto:
    """Concatenate the DataProto outputs of ``ranks`` (all when None) and drop the padding's outputs.

    Module-level (not a closure) so a ``DataProtoFuture`` holding it pickles to other workers.
    """
    picked = outputs if ranks is None else [outputs[r] for r in ranks]
    for r, o in zip(ranks if ranks is not None else range(len(picked)), picked):
        if not isinstance(o, DataProto):
            raise TypeError(
                f"a DataProto dispatch mode collects DataProto outputs, but rank {r} returned {type(o).__name__}"
            )
    return drop_padding(DataProto.concat(picked), pad_size, padded_len)


_DISPATCH_MODES: Registry[DispatchMode] = Registry("dispatch mode")


def register_dispatch_mode(
    name: str,
    dispatch_fn: Callable[..., Any],
    collect_fn: Callable[[Any, list], Any],
    *,
    override: bool = False,
) -> DispatchMode:
    """Add a transfer protocol usable as ``@register(dispatch_mode=name)``; returns the mode object."""
    mode = DispatchMode(name=name, dispatch_fn=dispatch_fn, collect_fn=collect_fn)
    _DISPATCH_MODES.register(name, mode, override=override)
    return mode


def _builtin(mode: Dispatch, dispatch_fn, collect_fn=None, returns_dataproto=False, execute_mode=None) -> None:
    _DISPATCH_MODES.register(
        mode,
        DispatchMode(mode.value, dispatch_fn, collect_fn, returns_dataproto, execute_mode=execute_mode),
    )


_builtin(Dispatch.ONE_TO_ALL, _broadcast, _collect_list)
_builtin(Dispatch.ALL_TO_ALL, _all_to_all, _collect_list)
_builtin(Dispatch.DP_COMPUTE, _dp_compute, _collect_list)
_builtin(Dispatch.DP_COMPUTE_PROTO, _dp_compute_proto, returns_dataproto=True)
_builtin(Dispatch.DP_COMPUTE_PROTO_WITH_FUNC, _dp_compute_proto_with_func, returns_dataproto=True)
_builtin(Dispatch.DP_COMPUTE_METRIC, _dp_compute_proto, _collect_list)
_builtin(Dispatch.RANK_ZERO, _broadcast, _collect_first, execute_mode=Execute.RANK_ZERO)


def get_dispatch_mode(mode: Dispatch | str | DispatchMode) -> DispatchMode:
    """Resolve a ``Dispatch`` member, a registered name or a ``DispatchMode`` object."""
    if isinstance(mode, DispatchMode):
        return mode
    return _DISPATCH_MODES.get(mode)


# ------------------------------------------------------------------------------------- N-D (mesh) dispatch
_ND_MODES: dict[str, DispatchMode] = {}


def make_nd_compute_dataproto_dispatch_fn(mesh_name: str) -> DispatchMode:
    """Dispatch over a named device mesh: split over DP ranks, replicate over TP/SP, collect from collect ranks.

    Each worker declares its place with ``self._register_dispatch_collect_info(mesh_name, dp_rank,
    is_collect)``; the group asks every rank once and caches the answer. Ranks that share a
    ``dp_rank`` (tensor/sequence-parallel peers) receive the same chunk, and only the rank marked
    ``is_collect`` in each DP group contributes to the result, so the controller sees one row per input row.
    """
    if mesh_name not in _ND_MODES:
        _ND_MODES[mesh_name] = DispatchMode(
            name=f"nd_compute_dataproto[{mesh_name}]",
            dispatch_fn=functools.partial(_nd_dispatch, mesh_name),
            returns_dataproto=True,
            collect_ranks=functools.partial(_nd_collect_ranks, mesh_name),
        )
    return _ND_MODES[mesh_name]


def _nd_dispatch(mesh_name: str, group, *args, **kwargs) -> DispatchPlan:
    info = group.dispatch_info(mesh_name)
    dp_size = len({dp for dp, _ in info})
    args_p, kwargs_p, pad, padded_len = _chunk_all(f"nd[{mesh_name}]", dp_size, args, kwargs)
    ranks = range(group.world_size)
    return DispatchPlan(
        tuple([parts[info[r][0]] for r in ranks] for parts in args_p),
        {k: [parts[info[r][0]] for r in ranks] for k, parts in kwargs_p.items()},
        pad,
        padded_len,
    )


def _nd_collect_ranks(mesh_name: str, group) -> list[int]:
    info = group.dispatch_info(mesh_name)
    collect = sorted((dp, r) for r, (dp, is_collect) in enumerate(info) if is_collect)
    return [r for _, r in collect]


def validate_dispatch_info(mesh_name: str, info: list[tuple[int, bool]]) -> None:
    """Each DP rank 0..D-1 must be present and have exactly one collect rank; else the mesh is misdeclared."""
    dps = sorted({dp for dp, _ in info})
    if dps != list(range(len(dps))):
        raise ValueError(f"mesh '{mesh_name}': dp ranks must be 0..{len(dps) - 1}, workers declared {dps}")
    for dp in dps:
        n = sum(1 for d, c in info if d == dp and c)
        if n != 1:
            raise ValueError(
                f"mesh '{mesh_name}': dp rank {dp} has {n} collect ranks, needs exactly 1 "
                "(mark e.g. tp_rank == 0 as is_collect in _register_dispatch_collect_info)"
            )


# ---------------------------------------------------------------------------------------------- @register
METHOD_SPEC_ATTR = "__hybridflow_method_spec__"


@dataclass(frozen=True)
class MethodSpec:
    """What ``@register`` recorded: the transfer protocol, who executes, and whether the call waits."""

    dispatch_mode: Any = Dispatch.ALL_TO_ALL
    execute_mode: Execute = Execute.ALL
    blocking: bool = True
    materialize_futures: bool = True


def register(
    dispatch_mode: Dispatch | str | DispatchMode = Dispatch.ALL_TO_ALL,
    execute_mode: Execute = Execute.ALL,
    blocking: bool = True,
    materialize_futures: bool = True,
):
    """Expose a worker method on the worker group with the given transfer protocol.

    With ``materialize_futures`` the method receives resolved ``DataProto`` objects even when the
    controller passed futures from a previous non-blocking call; rows that auto-padding added to a
    chunk are then dropped from a ``DataProto`` result here, on the worker, because the controller
    does not know the chunk sizes of data it never saw.
    """
    if not isinstance(execute_mode, Execute):
        raise TypeError(f"register: execute_mode must be an Execute member, got {execute_mode!r}")
    spec = MethodSpec(dispatch_mode, execute_mode, bool(blocking), bool(materialize_futures))

    def deco(fn):
        if inspect.iscoroutinefunction(fn):
            raise TypeError(f"register: {fn.__qualname__} is async; registered worker methods must be plain functions")

        @functools.wraps(fn)
        def inner(*args, **kwargs):
            padded_rows, in_rows = 0, 0
            if spec.materialize_futures:
                args, kwargs, padded_rows, in_rows = _materialize(args, kwargs)
            out = fn(*args, **kwargs)
            if padded_rows and isinstance(out, DataProto):
                out = drop_padding(out, padded_rows, in_rows)
            return out

        setattr(inner, METHOD_SPEC_ATTR, spec)
        return inner

    return deco


def _materialize(args: tuple, kwargs: dict) -> tuple[tuple, dict, int, int]:
    """Resolve future arguments; returns (args, kwargs, padding rows in this chunk, chunk rows)."""
    padded, rows = 0, 0

    def one(v):
        nonlocal padded, rows
        if isinstance(v, DataProtoFuture):
            data, pad = v.resolve()
            if pad > padded:
                padded, rows = pad, len(data)
            return data
        return v

    return tuple(one(a) for a in args), {k: one(v) for k, v in kwargs.items()}, padded, rows


def registered_methods(cls: type) -> dict[str, MethodSpec]:
    """Every ``@register``-ed method of ``cls`` (including inherited ones), by name."""
    out = {}
    for name in dir(cls):
        fn = inspect.getattr_static(cls, name, None)
        spec = getattr(fn, METHOD_SPEC_ATTR, None)
        if isinstance(spec, MethodSpec):
            out[name] = spec
    return out
