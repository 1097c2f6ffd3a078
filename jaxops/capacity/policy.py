"""Overflow policies: what happens when a data-dependent output exceeds its capacity.

Every data-dependent operator reports an overflow inside jit through its DynArrays'
``true_shape`` (:meth:`~jaxops.DynArray.overflowed`, :meth:`~jaxops.DynArray.lost`). On an
eager call (outside jit) a policy decides what to do with it:

- ``"error"``: raise :class:`~jaxops.errors.CapacityOverflowError` (operator, capacity, true size);
- ``"truncate"``: keep the first ``capacity`` results (for NMS the highest-scoring), warn once
  per call site with :class:`CapacityOverflowWarning`; the DynArrays still carry the flag and
  the lost count;
- ``"expand"``: rerun at the next power-of-two capacity ≥ the true size (capped at the
  theoretical max), so the result is complete and compilations stay bounded — at most
  ⌈log2(max)⌉ + 1 distinct capacities ever run;
- ``"host"``: rerun this call with the numpy/host kernel at that capacity.

Inside jit nothing can rerun: the flag travels with the result and :func:`check_overflow`
raises or warns on the host afterwards.

>>> import jax.numpy as jnp
>>> from jaxops import DynArray
>>> d = DynArray(jnp.array([1, 2]), [2], true_shape=[5])
>>> check_overflow(d, policy="warn")  # doctest: +SKIP
>>> next_capacity(5, theoretical_max=100), next_capacity(70, theoretical_max=100)
(8, 100)
"""

from __future__ import annotations

import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from jaxops.capacity import stats
from jaxops.core.dynarray import DynArray, lost_elements
from jaxops.core.errors import CapacityOverflowError, CapacityOverflowWarning, OpArgumentError

__all__ = [
    "EXPAND_POLICY_ARGS", "KEEP", "POLICIES", "check_overflow", "check_policy",
    "documents_policy_args", "next_capacity", "reset_warnings", "run_with_policy", "settle",
    "warn_once",
]

POLICIES = ("error", "truncate", "expand", "host")

_warned_lock = threading.Lock()
_warned_sites: set[tuple[str, int]] = set()


def next_capacity(true_size: int, theoretical_max: int | None = None) -> int:
    """The power-of-two capacity bucket that holds ``true_size`` (capped at the max)."""
    cap = 1 << max(int(true_size) - 1, 0).bit_length()
    return min(cap, theoretical_max) if theoretical_max is not None else cap


#: The ``overflow``, ``record`` and ``backend`` entries of the docstring of an operator whose
#: default policy is ``"expand"``; :func:`documents_policy_args` puts them in.
EXPAND_POLICY_ARGS = """\
      overflow: what an eager call does when the results exceed ``size``
        (:mod:`jaxops.capacity.policy`): ``"expand"`` (default: rerun at the next power-of-two
        capacity, so nothing is lost), ``"error"``, ``"truncate"`` (keep the first ``size``,
        warn once per call site) or ``"host"``. Inside jit the flag travels with the result.
      record: record the size this call needed in :mod:`jaxops.capacity.stats` (``True``:
        under the operator and input shapes; a string: under that call-site name), on the
        host or, inside jit, through an unordered ``io_callback``.
      backend: kernel backend (default: automatic).
"""


def documents_policy_args(fn):
    """Decorator: replaces the ``{policy_args}`` line of ``fn``'s docstring (Args section,
    six-space indent) with :data:`EXPAND_POLICY_ARGS`, so every operator says it the same."""
    placeholder = "      {policy_args}\n"
    if fn.__doc__ is None:  # python -OO strips docstrings
        return fn
    if placeholder not in fn.__doc__:
        raise ValueError(f"documents_policy_args: {fn.__qualname__}'s docstring has no "
                         "'{policy_args}' line in its Args section")
    fn.__doc__ = fn.__doc__.replace(placeholder, EXPAND_POLICY_ARGS)
    return fn


def check_policy(op: str, policy: str) -> str:
    if policy not in POLICIES:
        raise OpArgumentError(op, "overflow", "one of " + ", ".join(repr(p) for p in POLICIES),
                              repr(policy))
    return policy


def _dyns(tree: Any) -> list[DynArray]:
    leaves = jax.tree_util.tree_leaves(tree, is_leaf=lambda x: isinstance(x, DynArray))
    return [d for d in leaves if isinstance(d, DynArray)]


def _is_traced(tree: Any) -> bool:
    return any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(tree))


def _overflowed_examples(dyns: list[DynArray]) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(actual, true)`` shape rows of every example that overflowed, over the DynArrays
    that track a true shape (batched ones example by example), fetched in one transfer."""
    shapes = jax.device_get([(d.actual_shape, d.true_shape) for d in dyns if d.true_shape is not None])
    cut = []
    for actual, true in shapes:
        rank = np.shape(actual)[-1]
        if rank:  # a rank-0 result has no dim to overflow
            for a, t in zip(np.reshape(actual, (-1, rank)), np.reshape(true, (-1, rank))):
                if (t > a).any():
                    cut.append((a, t))
    return cut


def _needed_size(cut: list[tuple[np.ndarray, np.ndarray]]) -> int:
    """The capacity the result would have needed: the largest true dim over every axis an
    overflowed example (:func:`_overflowed_examples`) was cut on (0 when none was).
    Axis-free, so it serves every output layout."""
    return max((int(t[t > a].max()) for a, t in cut), default=0)


def _lost(cut: list[tuple[np.ndarray, np.ndarray]]) -> int:
    """Elements lost over the overflowed examples, as :meth:`DynArray.lost` counts them."""
    return sum(lost_elements(a, t) for a, t in cut)


def _lost_results(cut: list[tuple[np.ndarray, np.ndarray]]) -> int:
    """Results lost over the overflowed examples, in the unit of capacities and true sizes:
    along the axis each example was cut on (:meth:`DynArray.lost` with that ``axis``)."""
    return sum(int(t[t > a][0] - a[t > a][0]) for a, t in cut)


def _caller_site(skip_module: str) -> tuple[str, int]:
    """The first stack frame outside jaxops/tracing: the user's call site."""
    frame = sys._getframe(1)
    while frame is not None and (frame.f_globals.get("__name__", "").startswith(("jaxops", "tracing"))
                                 or frame.f_globals.get("__name__") == skip_module):
        frame = frame.f_back
    return (frame.f_code.co_filename, frame.f_lineno) if frame else ("?", 0)


def warn_once(message: str) -> None:
    """Warns with :class:`CapacityOverflowWarning` once per user call site."""
    site = _caller_site(__name__)
    with _warned_lock:
        if site in _warned_sites:
            return
        _warned_sites.add(site)
    warnings.warn_explicit(message, CapacityOverflowWarning, site[0], site[1])


def reset_warnings() -> None:
    """Forgets which call sites were already warned (for tests)."""
    with _warned_lock:
        _warned_sites.clear()


def run_with_policy(run: Callable[[int | None, str | None], Any], *, op: str, size: int | None,
                    theoretical_max: int, policy: str, record: bool | str = False,
                    input_shapes: Sequence[Sequence[int]] = (), capacity_axis: int = 0) -> Any:
    """Runs ``run(size, backend)`` and applies ``policy`` when its output overflowed.

    ``run`` returns a pytree whose DynArrays carry ``true_shape`` (the capacity is the dim
    where it exceeds ``actual_shape``). Inside jit (traced results) the result is returned
    as is: the flag travels with it.

    ``record``: also record the size the call needed (its first DynArray's true size along
    ``capacity_axis``) in :mod:`jaxops.capacity.stats` — under the given name, or for ``True``
    under :func:`~jaxops.capacity.stats.site_key` of ``op`` and ``input_shapes``. Eagerly on the
    host; inside jit through an unordered ``io_callback``.
    """
    check_policy(op, policy)
    result = _policy(run, op, size, theoretical_max, policy)
    if record:
        name = record if isinstance(record, str) else stats.site_key(op, input_shapes)
        first = _dyns(result)[0]
        if _is_traced(result):
            stats.record_in_jit(name, first, axis=capacity_axis, theoretical_max=theoretical_max)
        else:
            stats.record_tree(name, first, axis=capacity_axis, theoretical_max=theoretical_max)
    return result


#: What a remedy returns to keep the result it was shown (``"truncate"``).
KEEP = object()


def settle(attempt: Callable[[Any], Any], setting: Any, *,
           shortfall: Callable[[Any], Any], remedy: Callable[[Any, Any], Any],
           tries: int = 3, give_up: Callable[[Any], Any] | None = None) -> Any:
    """The one rerun engine: operator capacities, routing capacities and hash-table load
    policies all run through it.

    Runs ``attempt(setting)``. While ``shortfall(result)`` says the result fell short (any
    value but None: a capacity overflowed, a table would pass its load limit),
    ``remedy(setting, shortfall)`` gives the setting to run again with (a larger capacity, a
    grown table), raises, or returns :data:`KEEP` to accept the result as it is. A result
    traced inside ``jit`` is returned at once: nothing can rerun there, and the result
    carries its own report (a DynArray's ``true_shape``, an info's counts). A result still
    short after ``tries`` remedies goes to ``give_up(shortfall)``, which raises.

    >>> settle(lambda cap: min(cap, 5), 2, shortfall=lambda r: 5 if r < 5 else None,
    ...        remedy=lambda cap, needed: next_capacity(needed))
    5
    """
    result = attempt(setting)
    for _ in range(tries):
        if _is_traced(result):
            return result
        short = shortfall(result)
        if short is None:
            return result
        setting = remedy(setting, short)
        if setting is KEEP:
            return result
        result = attempt(setting)
    short = None if _is_traced(result) else shortfall(result)
    if short is None:
        return result
    if give_up is not None:
        give_up(short)
    raise RuntimeError(f"settle: still short after {tries} remedies ({short!r})")


def _policy(run, op: str, size: int | None, theoretical_max: int, policy: str) -> Any:
    def shortfall(result):
        if size is None or size >= theoretical_max:
            return None
        dyns = _dyns(result)
        true_size = _needed_size(_overflowed_examples(dyns))
        return (true_size, dyns) if true_size > size else None

    def remedy(setting, short):
        true_size, dyns = short
        first = _overflowed_examples(dyns[:1])  # of the first output (y of Unique, ...)
        lost, lost_results = _lost(first), _lost_results(first)
        if policy == "error":
            raise CapacityOverflowError(op, size, true_size,
                                        "Pass a larger size=, or overflow='expand'/'truncate'.",
                                        lost=lost, lost_results=lost_results)
        if policy == "truncate":
            warn_once(f"{op}: output truncated to capacity {size} (true size {true_size}): "
                      f"{lost_results} results lost ({lost} elements; the first output's "
                      "DynArray.lost(axis=) and lost() report them inside jit too, with "
                      "overflowed()).")
            return KEEP
        return (next_capacity(true_size, theoretical_max), "host" if policy == "host" else None)

    return settle(lambda setting: run(*setting), (size, None), shortfall=shortfall,
                  remedy=remedy, tries=1)


def check_overflow(tree: Any, policy: str = "error", op: str | None = None) -> int:
    """Host side, after a jitted call: raise (``"error"``) or warn (``"warn"``) when any
    DynArray in ``tree`` overflowed its capacity. Returns the total number of lost elements
    over the tree (as :meth:`~jaxops.DynArray.lost` counts them); batched DynArrays are
    checked example by example. ``op`` names the operator (or pipeline) in the error or
    warning; a DynArray does not carry it."""
    if policy not in ("error", "warn"):
        raise OpArgumentError("check_overflow", "policy", "'error' or 'warn'", repr(policy))
    cut = _overflowed_examples(_dyns(tree))
    if not cut:
        return 0
    total, results = _lost(cut), _lost_results(cut)
    a, t = cut[0]
    over = int(np.flatnonzero(t > a)[0])
    first = (int(a[over]), int(t[over]))
    if policy == "error":
        raise CapacityOverflowError(op or "check_overflow", first[0], first[1],
                                    "(the first overflowed output; lost counts all of them)",
                                    lost=total, lost_results=results)
    warn_once(f"{op or 'check_overflow'}: outputs overflowed their capacity (first: capacity "
              f"{first[0]}, true size {first[1]} results); {results} results lost in all "
              f"({total} elements, DynArray.lost()).")
    return total
