"""Unique and UniqueConsecutive: distinct values (or slices) of a tensor (ONNX ``Unique``).

>>> import jax.numpy as jnp, jaxops
>>> y, idx, inv, cnt = jaxops.unique(jnp.array([2, 1, 1, 3, 2]), return_index=True,
...                                  return_inverse=True, return_counts=True)
>>> [a.tolist() for a in jaxops.refresh((y, idx, inv, cnt))]
[[1, 2, 3], [1, 0, 3], [1, 0, 0, 2, 1], [2, 2, 1]]
>>> jaxops.refresh(jaxops.unique(jnp.array([2, 1, 1, 3, 2]), sorted=False)).tolist()
[2, 1, 3]
>>> jaxops.refresh(jaxops.unique_consecutive(jnp.array([1, 1, 2, 2, 1]))).tolist()
[1, 2, 1]

Equality and order are those of :mod:`jaxops.ops.order_keys`: ``-0.0 == 0.0``; with
``equal_nan=True`` (the default, numpy's) all NaNs are one value sorted after ``+inf``;
with ``equal_nan=False`` (torch's ``unique`` and ``unique_consecutive``) every NaN is a
value of its own, the NaNs sorted after ``+inf`` in order of position. A float unique value
is returned as it appears at its first occurrence (so ``-0.0`` if that came first). ONNX
Runtime's CPU Unique does not order NaN consistently; we do not follow it there.

Algorithm (1-D): group order-preserving integer keys (:mod:`jaxops.ops.grouping`: a
counting pass for a narrow key range, else XLA's fast single-operand sort plus a bucketed
search), then take the first occurrence of each group with a scatter-min. Parts a caller does not use are
removed by XLA inside ``jit``. Slices (``axis``) are first ranked lexicographically, then
the ranks go through the 1-D path.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxops.capacity import documents_policy_args, run_with_policy
from jaxops.core.dtypes import DataType, REAL
from jaxops.core.dynarray import DynArray
from jaxops.core.errors import OpArgumentError
from jaxops.core.registry import AttrDef, Input, OpDef, Output, register_op
from jaxops.ops._conventions import (INDEX_FILL, VALUE_FILL, capacity_attr, index_datatype,
                                     index_dtype, read_input, with_upstream_loss)
from jaxops.ops.compaction import compact_indices, gather_valid
from jaxops.ops.grouping import group_dense_ranks, group_keys, split_last_group
from jaxops.ops.order_keys import (nan_rows, rows_differ_from_previous, sortable_keys,
                                   values_from_keys)

__all__ = [
    "COUNT_FILL", "UNIQUE", "UNIQUE_CONSECUTIVE", "UNIQUE_DTYPES", "unique",
    "unique_consecutive",
]

COUNT_FILL = VALUE_FILL  # padding of counts
UNIQUE_DTYPES = REAL | {DataType.BOOL}
_INDEX_TYPES = {DataType.INT32, DataType.INT64}


def _axis(op: str, shape, axis):
    if axis is None:
        return None
    if not -len(shape) <= axis < len(shape):
        raise OpArgumentError(op, "axis", f"None or an int in [{-len(shape)}, {len(shape)})"
                              f" for x of shape {tuple(shape)}", axis)
    return axis % len(shape)


def _max_shapes(op: str, shape, size, axis):
    """(y max shape, unique capacity, length of the inverse) of a Unique-family op."""
    axis = _axis(op, shape, axis)
    n = math.prod(shape) if axis is None else shape[axis]
    cap = n if size is None else size
    y_shape = (cap,) if axis is None else tuple(shape[:axis]) + (cap,) + tuple(shape[axis + 1:])
    return y_shape, cap, n


def _unique_infer(ctx):
    y, cap, n = _max_shapes("Unique", ctx.inputs[0].shape, ctx.attrs["size"], ctx.attrs["axis"])
    return [y, (cap,), (n,), (cap,)]


def _consecutive_infer(ctx):
    y, cap, n = _max_shapes("UniqueConsecutive", ctx.inputs[0].shape, ctx.attrs["size"],
                            ctx.attrs["axis"])
    return [y, (n,), (cap,)]


def _index_dtypes(k):
    return lambda ctx: [ctx.inputs[0].dtype] + [index_datatype()] * k


_AXIS = AttrDef("axis", "int", None, optional=True, doc="unique slices along this axis; None: flatten")
_EQUAL_NAN = AttrDef("equal_nan", "bool", True,
                     doc="all NaNs are one value (numpy); False: each NaN is distinct (torch)")

UNIQUE = register_op(OpDef(
    name="Unique",
    inputs=[Input("x", UNIQUE_DTYPES)],
    outputs=[Output("y", UNIQUE_DTYPES, doc="unique values / slices; padding 0"),
             Output("indices", _INDEX_TYPES, doc="first occurrence of each; padding -1"),
             Output("inverse_indices", _INDEX_TYPES, doc="unique id of every element (full length)"),
             Output("counts", _INDEX_TYPES, doc="occurrences of each; padding 0")],
    attrs=[capacity_attr("max number of unique values; None: all elements (or slices)"),
           AttrDef("sorted", "bool", True, doc="ascending order; False: first-occurrence order"),
           _AXIS, _EQUAL_NAN],
    infer_shape=_unique_infer,
    infer_dtype=_index_dtypes(3),
    data_dependent=True,
    fill_values=[VALUE_FILL, INDEX_FILL, INDEX_FILL, COUNT_FILL],
    doc="Unique values or slices with first indices, inverse indices and counts (ONNX Unique).",
))

UNIQUE_CONSECUTIVE = register_op(OpDef(
    name="UniqueConsecutive",
    inputs=[Input("x", UNIQUE_DTYPES)],
    outputs=[Output("y", UNIQUE_DTYPES, doc="first value / slice of each run; padding 0"),
             Output("inverse_indices", _INDEX_TYPES, doc="run id of every element (full length)"),
             Output("counts", _INDEX_TYPES, doc="length of each run; padding 0")],
    attrs=[capacity_attr("max number of runs; None: all elements (or slices)"), _AXIS,
           _EQUAL_NAN],
    infer_shape=_consecutive_infer,
    infer_dtype=_index_dtypes(2),
    data_dependent=True,
    fill_values=[VALUE_FILL, INDEX_FILL, COUNT_FILL],
    doc="Collapses runs of equal consecutive values or slices (torch.unique_consecutive).",
))


class _Items:
    """The things being made unique: the flattened values, or the slices along ``axis``."""

    def __init__(self, op, x, axis, equal_nan):
        self.shape, self.dtype = x.shape, x.dtype
        self.axis = _axis(op, x.shape, axis)
        if self.axis is None:
            self.rows = x.reshape(-1)
        else:
            moved = jnp.moveaxis(x, self.axis, 0)
            self.rest = moved.shape[1:]
            self.rows = moved.reshape(moved.shape[0], math.prod(self.rest))  # -1 fails on 0-size
        self.n = self.rows.shape[0]
        self.keys = sortable_keys(self.rows)  # [n] or [n, slice size]; NaNs all equal
        # equal_nan=False: an item holding a NaN equals no other item
        self.nan = None if equal_nan or not jnp.issubdtype(self.dtype, jnp.floating) else \
            nan_rows(self.rows)

    def keys_nans_apart(self) -> jax.Array:
        """``keys`` (slices, ``[n, r]``) with a last column that is 0, or ``position + 1``
        for a slice holding a NaN under ``equal_nan=False``: such slices then equal no
        other and sort after their equals, in order of position."""
        if self.nan is None:
            return self.keys
        tag = jnp.where(self.nan, jnp.arange(1, self.n + 1), 0).astype(self.keys.dtype)
        return jnp.concatenate([self.keys, tag[:, None]], axis=1)

    def take(self, positions, count, cap) -> DynArray:
        """Items at ``positions`` (valid where slot < count) as the ``y`` DynArray."""
        found = jnp.minimum(count, cap)
        if self.axis is None:
            data = gather_valid(self.rows, positions, count, VALUE_FILL)
            return DynArray(data, found[None], true_shape=count[None], fill_value=VALUE_FILL)
        valid = (jnp.arange(cap) < count)[:, None]
        taken = self.rows[jnp.clip(positions, 0, max(self.n - 1, 0))] if self.n else \
            jnp.zeros((cap, self.rows.shape[1]), self.dtype)
        data = jnp.where(valid, taken, jnp.zeros((), self.dtype)).reshape((cap,) + self.rest)
        dims = [jnp.asarray(d, jnp.int32) for d in self.shape]
        actual, true = list(dims), list(dims)
        actual[self.axis], true[self.axis] = found, count
        return DynArray(jnp.moveaxis(data, 0, self.axis), jnp.stack(actual),
                        true_shape=jnp.stack(true), fill_value=VALUE_FILL)


def _lexicographic_ranks(keys: jax.Array) -> jax.Array:
    """Dense rank of each row of ``keys`` ``[m, r]`` in lexicographic order (int32)."""
    m, r = keys.shape
    def by_column(i, perm):  # LSD: stable sorts from the last column to the first
        column = lax.dynamic_index_in_dim(keys, r - 1 - i, axis=1, keepdims=False)[perm]
        return lax.sort((column, perm), num_keys=1, is_stable=True)[1]
    perm = jnp.arange(m, dtype=jnp.int32)
    if r:  # empty slices are all equal: no column to sort by
        perm = lax.fori_loop(0, r, by_column, perm)
    group = jnp.cumsum(rows_differ_from_previous(keys[perm]), dtype=jnp.int32) - 1
    return jnp.zeros((m,), jnp.int32).at[perm].set(group, unique_indices=True)


def _fit(a: jax.Array, cap: int, fill) -> jax.Array:
    """``a`` cut or padded (with ``fill``) to length ``cap``."""
    if a.shape[0] >= cap:
        return a[:cap]
    return jnp.pad(a, (0, cap - a.shape[0]), constant_values=fill)


def _index_dyn(data, count, cap, fill):
    return DynArray(data.astype(index_dtype()), jnp.minimum(count, cap)[None],
                    true_shape=count[None], fill_value=fill)


@UNIQUE.kernel("xla")
def _unique_xla(x, *, size, sorted, axis, equal_nan):
    items = _Items("Unique", x, axis, equal_nan)
    n = items.n
    cap = n if size is None else size
    if items.axis is not None:
        groups = group_dense_ranks(_lexicographic_ranks(items.keys_nans_apart()))
    elif items.nan is not None:  # the NaNs are the last group: one group each
        groups = split_last_group(group_keys(items.keys), items.nan)
    else:
        groups = group_keys(items.keys)
    unique_keys, n_unique, counts, group = groups  # group: sorted unique id
    position = jnp.arange(n, dtype=jnp.int32)
    first = jnp.full((n,), n, jnp.int32).at[group].min(position)

    if sorted:
        rank_of_group, order = None, first
    else:  # first-occurrence order: the first occurrences, ascending, are the new order
        order, _ = compact_indices(first[group] == position, n, fill_value=n)
        by_rank = group[jnp.minimum(order, max(n - 1, 0))]
        rank_of_group = jnp.zeros((n,), jnp.int32).at[
            jnp.where(order < n, by_rank, n)].set(position, mode="drop")
        counts = counts[by_rank]

    valid = jnp.arange(cap) < n_unique
    order_cap = _fit(order, cap, n)
    if sorted and items.axis is None and not jnp.issubdtype(x.dtype, jnp.floating):
        y_values = values_from_keys(_fit(unique_keys, cap, 0), x.dtype)  # no gather needed
        y = DynArray(jnp.where(valid, y_values, jnp.zeros((), x.dtype)),
                     jnp.minimum(n_unique, cap)[None], true_shape=n_unique[None],
                     fill_value=VALUE_FILL)
    else:
        y = items.take(order_cap, n_unique, cap)
    uid = group if sorted else rank_of_group[group]
    inverse = jnp.where(uid < cap, uid, INDEX_FILL).astype(index_dtype())
    return (y,
            _index_dyn(jnp.where(valid, order_cap, INDEX_FILL), n_unique, cap, INDEX_FILL),
            inverse,
            _index_dyn(jnp.where(valid, _fit(counts, cap, COUNT_FILL), COUNT_FILL), n_unique, cap,
                       COUNT_FILL))


@UNIQUE_CONSECUTIVE.kernel("xla")
def _unique_consecutive_xla(x, *, size, axis, equal_nan):
    items = _Items("UniqueConsecutive", x, axis, equal_nan)
    n = items.n
    cap = n if size is None else size
    run_start = rows_differ_from_previous(items.keys)
    if items.nan is not None:  # an item holding a NaN starts a run of its own
        run_start = run_start | items.nan
    starts, n_runs = compact_indices(run_start, cap + 1, fill_value=n)  # one more: run ends
    counts = jnp.where(jnp.arange(cap) < n_runs, starts[1:] - starts[:-1], COUNT_FILL)
    run = jnp.cumsum(run_start, dtype=jnp.int32) - 1
    inverse = jnp.where(run < cap, run, INDEX_FILL).astype(index_dtype())
    return (items.take(starts[:cap], n_runs, cap), inverse,
            _index_dyn(counts, n_runs, cap, COUNT_FILL))


def _valid_only(op: str, x, axis, equal_nan: bool, last: bool):
    """``(x_in, fix)``: what the kernel runs on, and what turns its outputs into those of a
    DynArray ``x``'s valid elements (row-major order of its exact array; ``axis`` must be
    None). The padding is set to a valid element (the first; for runs, the ``last``), which
    adds no value; ``fix`` takes back what it added — to that element's count, or, when it
    is a NaN that equals nothing, the unique values or runs it made (the last ones) — makes
    ``inverse`` a DynArray, and counts what ``x`` lost upstream in the true shapes. A plain
    ``x`` comes back as it is, with no fix."""
    if not isinstance(x, DynArray):
        return x, None
    if axis is not None:
        raise OpArgumentError(op, "axis", "None for a DynArray x (its valid region is read "
                              "flattened)", axis, "Pass axis=None, or refresh the DynArray "
                              "into an exact array first.")
    given = read_input(op, "x", x.ravel())
    flat, n, total = given.data, given.rows, given.data.shape[0]
    ids = jnp.arange(total, dtype=jnp.int32)
    at = jnp.maximum(n - 1, 0) if last else 0
    x_in = jnp.where(ids < n, flat, flat[at])
    padding = total - n
    floating = jnp.issubdtype(flat.dtype, jnp.floating)
    nan_apart = jnp.isnan(flat[at]) & (not equal_nan) if floating else jnp.bool_(False)
    counts_at, inverse_at = (3, 2) if op == "Unique" else (2, 1)

    def fix(outs: tuple) -> tuple:
        outs = list(outs)
        y = outs[0]
        cap = y.data.shape[0]
        made = y.actual_shape[0] if y.true_shape is None else y.true_shape[0]
        found = jnp.where(n > 0, made - jnp.where(nan_apart, padding, 0), 0)
        kept = jnp.minimum(found, cap)
        uid = outs[inverse_at][at]
        extra = (n > 0) & ~nan_apart & (uid >= 0) & (uid < cap)
        counts = outs[counts_at]
        outs[counts_at] = DynArray.tree_unflatten(counts._fill, (
            counts.data.at[jnp.clip(uid, 0, cap - 1)].add(
                jnp.where(extra, -padding, 0).astype(counts.dtype)) if cap else counts.data,
            counts.actual_shape, counts.true_shape))
        for k, out in enumerate(outs):
            if k == inverse_at:
                outs[k] = DynArray(jnp.where(ids < n, out, jnp.asarray(INDEX_FILL, out.dtype)),
                                   n[None], fill_value=INDEX_FILL,
                                   true_shape=None if given.true_rows is None
                                   else given.true_rows[None])
                continue
            inside = (jnp.arange(cap) < kept).reshape((cap,) + (1,) * (out.data.ndim - 1))
            outs[k] = with_upstream_loss(DynArray(
                jnp.where(inside, out.data, jnp.asarray(out.fill_value, out.dtype)),
                kept[None], fill_value=out.fill_value,
                true_shape=None if out.true_shape is None else found[None]), given.lost, 0)
        return tuple(outs)
    return x_in, fix


def _returns(y, extras):
    chosen = [v for want, v in extras if want]
    return (y, *chosen) if chosen else y


@documents_policy_args
def unique(x: jax.Array, *, size: int | None = None, sorted: bool = True, axis: int | None = None,
           equal_nan: bool = True, return_index: bool = False, return_inverse: bool = False,
           return_counts: bool = False, overflow: str = "expand", record: bool | str = False,
           backend: str | None = None):
    """Unique values of ``x`` (or unique slices along ``axis``) (op "Unique", ONNX semantics).

    Args:
      x: array of a bool, integer or float dtype; or a :class:`DynArray` (with ``axis``
        None), of which only the valid elements count, in the row-major order of its exact
        array: ``inverse`` is then a DynArray too, and what ``x`` lost upstream counts in
        the outputs' ``true_shape`` (each lost element could have been a new value), so
        ``overflowed()`` reports it.
      size: capacity, the max number of unique values (``jnp.unique``'s ``size``). ``None``
        means the number of elements (slices) and cannot overflow. With a smaller capacity
        the first ``size`` unique values (in output order) are kept; ``true_shape`` holds
        the full number so ``.overflowed()`` / ``.lost()`` report the cut inside ``jit``.
      sorted: ascending order (NaN last) if True, else the order of first occurrence.
      axis: ``None`` flattens ``x``; an int selects unique slices ``x.take(i, axis)``,
        compared element by element with the same equality rules, ordered
        lexicographically.
      equal_nan: NaN rule (``-0.0 == 0.0`` always). True (default, numpy's): every NaN,
        whatever its sign or payload, is one value, sorted after ``+inf``. False (torch's
        ``unique``): NaN equals nothing, so each NaN is a unique value with count 1, the
        NaNs sorted after ``+inf`` in order of position; with ``axis`` a slice holding a
        NaN equals no other slice. (``np.unique`` with ``axis`` always behaves as False.)
      return_index, return_inverse, return_counts: also return the first-occurrence index
        of each unique value, the unique id of every element, the number of occurrences.
      {policy_args}

    Returns:
      ``y`` alone, or a tuple ``(y, [indices], [inverse], [counts])`` in numpy's order.
      ``y`` is a DynArray of ``x``'s dtype: max shape ``[size]`` (with ``axis``: ``x``'s
      shape with ``size`` on ``axis``), padding 0. ``indices`` (padding -1) and ``counts``
      (padding 0) are 1-D DynArrays. ``inverse`` is a plain array of length ``x.size`` (or
      ``x.shape[axis]``), as ONNX's ``inverse_indices``; entries whose unique value was cut
      by the capacity hold -1. Index dtype: int32, or int64 (ONNX's) with
      ``jax_enable_x64``.

    Examples:
      >>> import jax.numpy as jnp, jaxops
      >>> x = jnp.array([[1, 0], [1, 0], [0, 2]])
      >>> jaxops.refresh(jaxops.unique(x, axis=0)).tolist()
      [[0, 2], [1, 0]]
      >>> y = jaxops.unique(jnp.array([3.0, jnp.nan, -0.0, 0.0, jnp.nan]))
      >>> jaxops.refresh(y).tolist()
      [-0.0, 3.0, nan]
      >>> y = jaxops.unique(jnp.array([3.0, jnp.nan, -0.0, 0.0, jnp.nan]), equal_nan=False)
      >>> jaxops.refresh(y).tolist()
      [-0.0, 3.0, nan, nan]
    """
    x, fix = _valid_only("Unique", x, axis, equal_nan, last=False)

    def run(capacity: int | None, rerun_backend: str | None):
        outs = UNIQUE(x, size=capacity, sorted=sorted, axis=axis, equal_nan=equal_nan,
                      backend=rerun_backend or backend)
        return outs if fix is None else fix(outs)

    y, indices, inverse, counts = run_with_policy(
        run, op="Unique", size=size, theoretical_max=_max_shapes("Unique", np.shape(x), None, axis)[1],
        policy=overflow, record=record, input_shapes=[np.shape(x)],
        capacity_axis=_axis("Unique", np.shape(x), axis) or 0)
    return _returns(y, [(return_index, indices), (return_inverse, inverse), (return_counts, counts)])


def unique_consecutive(x: jax.Array, *, size: int | None = None, axis: int | None = None,
                       equal_nan: bool = True, return_inverse: bool = False,
                       return_counts: bool = False,
                       overflow: str = "expand", record: bool | str = False,
                       backend: str | None = None):
    """Collapses runs of equal consecutive values (or slices along ``axis``).

    Same equality rules (``equal_nan`` included), capacity contract, DynArray inputs,
    ``overflow`` and ``record`` and padding as :func:`unique`; the outputs are
    ``torch.unique_consecutive``'s: ``y`` (first item of each run), ``inverse`` (run id of
    every element, plain array, -1 where the run was cut) and ``counts`` (run lengths).
    NaN rule: with ``equal_nan=True`` (default) consecutive NaNs form one run; with
    ``equal_nan=False`` (torch's rule: NaN equals nothing) each NaN, or each slice holding
    a NaN, is a run of its own.

    Returns:
      ``y`` alone, or ``(y, [inverse], [counts])``.

    Examples:
      >>> import jax.numpy as jnp, jaxops
      >>> y, c = jaxops.unique_consecutive(jnp.array([5, 5, 1, 5]), return_counts=True)
      >>> jaxops.refresh(y).tolist(), jaxops.refresh(c).tolist()
      ([5, 1, 5], [2, 1, 1])
      >>> x = jnp.array([jnp.nan, jnp.nan, 1.0])
      >>> [jaxops.refresh(jaxops.unique_consecutive(x, return_counts=True, equal_nan=e)[1]).tolist()
      ...  for e in (True, False)]
      [[2, 1], [1, 1, 1]]
    """
    x, fix = _valid_only("UniqueConsecutive", x, axis, equal_nan, last=True)

    def run(capacity: int | None, rerun_backend: str | None):
        outs = UNIQUE_CONSECUTIVE(x, size=capacity, axis=axis, equal_nan=equal_nan,
                                  backend=rerun_backend or backend)
        return outs if fix is None else fix(outs)

    y, inverse, counts = run_with_policy(
        run, op="UniqueConsecutive", size=size,
        theoretical_max=_max_shapes("UniqueConsecutive", np.shape(x), None, axis)[1], policy=overflow,
        record=record, input_shapes=[np.shape(x)],
        capacity_axis=_axis("UniqueConsecutive", np.shape(x), axis) or 0)
    return _returns(y, [(return_inverse, inverse), (return_counts, counts)])
