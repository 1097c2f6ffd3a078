"""``DynArray``: a data-dependent-shape tensor inside jit (the "dual shape").

XLA needs static shapes, so an operator whose output size depends on the data returns its
buffer at the **max shape** (known at trace time) together with its **actual shape** (a
traced int32 vector). The valid elements are the leading block ``data[:a0, :a1, ...]``; the
rest is padding holding ``fill_value`` and must never be read as data.

>>> import jax, jax.numpy as jnp
>>> d = DynArray(jnp.array([3, 5, 7, -1, -1]), [3], fill_value=-1)
>>> d.max_shape, d.actual_shape.tolist(), int(d.numel())
((5,), [3], 3)
>>> jax.jit(lambda d: d.set_actual_shape([2]))(d).actual_shape.tolist()
[2]
>>> from jaxops import refresh
>>> refresh(d).tolist()
[3, 5, 7]

A DynArray is a pytree with the children ``data``, ``actual_shape`` and an optional
``true_shape``: the shape the output would have had with unlimited capacity, set by
operators whose capacity can be smaller than the theoretical maximum, so an overflow is
visible inside jit (:meth:`overflowed`, :meth:`lost`). ``fill_value`` is static metadata.

Under :func:`jax.vmap` a DynArray comes back *batched*: ``data`` gains leading batch axes
and ``actual_shape`` becomes ``[*batch, ndim]``; :attr:`batch_shape` says which.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from jaxops.core.errors import OpArgumentError

__all__ = [
    "DynArray", "dims_within", "lost_elements",
]


def lost_elements(actual: Any, true: Any) -> int:
    """What a capacity cut off, on the host: ``prod(true) - prod(actual)`` summed over rows
    of shapes (``[..., rank]``). The one definition of "lost" that :meth:`DynArray.lost`
    computes in JAX and every overflow message (policies, ``check_overflow``, ``refresh``,
    ``tracing.launch``) reports, in elements.

    >>> lost_elements([2, 4], [2, 20]), lost_elements([[3], [5]], [[3], [9]])
    (32, 4)
    """
    actual, true = np.asarray(actual, np.int64), np.asarray(true, np.int64)
    return int(np.sum(np.prod(true, axis=-1) - np.prod(actual, axis=-1)))


def _is_concrete(x: Any) -> bool:
    return not isinstance(x, jax.core.Tracer)


def _row_major_strides(shape: jax.Array) -> list[jax.Array]:
    """Strides (in elements) of a row-major array of the given (traced) shape vector."""
    n = shape.shape[-1]
    strides = [jnp.ones((), jnp.int32)] * n
    for k in range(n - 2, -1, -1):
        strides[k] = strides[k + 1] * shape[k + 1]
    return strides


class _Static:
    """A fill value as pytree metadata, compared bit for bit: a NaN fill equals itself, so
    jit caches and ``lax.cond`` branches agree on it."""

    __slots__ = ("value", "_key")

    def __init__(self, value: Any):
        self.value = value
        v = np.asarray(value)
        self._key = (type(value), v.dtype.str, v.tobytes())

    def __eq__(self, other):
        return isinstance(other, _Static) and self._key == other._key

    def __hash__(self):
        return hash(self._key)


def _on_host(shape: Any) -> bool:
    """Whether ``shape`` is host data (numpy or Python ints), checkable without a device sync."""
    if isinstance(shape, np.ndarray):
        return True
    return isinstance(shape, (list, tuple)) and all(
        isinstance(d, (int, np.integer)) or (isinstance(d, (list, tuple)) and _on_host(d))
        for d in shape)


def dims_within(dims: np.ndarray, max_shape: tuple[int, ...]) -> bool:
    """Whether every (batched) actual shape in host ``dims`` lies within ``[0, max_shape]``."""
    return bool(np.all((dims >= 0) & (dims <= np.asarray(max_shape, np.int64))))


def _check_dims(op: str, arg: str, dims: np.ndarray, max_shape: tuple[int, ...]) -> None:
    """Raises unless every (batched) actual shape in ``dims`` lies within ``[0, max_shape]``."""
    if dims.shape[-1:] == (len(max_shape),) and not dims_within(dims, max_shape):
        raise OpArgumentError(op, arg, f"dims in [0, max] with max shape {max_shape}",
                              dims.tolist())


@jax.tree_util.register_pytree_node_class
class DynArray:
    """A max-shape buffer plus its actual (traced) shape. See the module docstring."""

    __slots__ = ("data", "actual_shape", "true_shape", "_fill")

    def __init__(self, data, actual_shape, *, true_shape=None, fill_value: Any = 0):
        data = data if isinstance(data, (jax.Array, np.ndarray)) else jnp.asarray(data)
        given = actual_shape
        actual_shape = jnp.asarray(actual_shape, jnp.int32)
        batch_ndim = actual_shape.ndim - 1
        if actual_shape.ndim == 0 or data.ndim - batch_ndim != actual_shape.shape[-1] \
                or data.shape[:batch_ndim] != actual_shape.shape[:-1]:
            raise OpArgumentError("DynArray", "actual_shape", "one entry per axis of data "
                                  f"{tuple(data.shape)}", f"shape {tuple(actual_shape.shape)}")
        if _on_host(given):  # checked here; traced and device shapes are checked where used
            _check_dims("DynArray", "actual_shape", np.asarray(given, np.int64),
                        tuple(data.shape[batch_ndim:]))
        self.data = data
        self.actual_shape = actual_shape
        self.true_shape = None if true_shape is None else jnp.asarray(true_shape, jnp.int32)
        self._fill = _Static(fill_value)  # built once: flattening happens on every jit call

    @property
    def fill_value(self) -> Any:
        """What the padding holds (static metadata)."""
        return self._fill.value

    # -- pytree ---------------------------------------------------------------------------
    def tree_flatten(self):
        return (self.data, self.actual_shape, self.true_shape), self._fill

    @classmethod
    def tree_unflatten(cls, fill_value, children):
        obj = object.__new__(cls)  # children may be tracers, None or sentinels: no checks
        obj.data, obj.actual_shape, obj.true_shape = children
        obj._fill = fill_value if isinstance(fill_value, _Static) else _Static(fill_value)
        return obj

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def full(cls, x, fill_value: Any = 0) -> "DynArray":
        """Wraps a static array whose actual shape is its whole shape."""
        x = jnp.asarray(x)
        return cls(x, np.asarray(x.shape, np.int32), fill_value=fill_value)

    @classmethod
    def from_wire(cls, buffer, max_shape: Sequence[int], actual_shape, *,
                  fill_value: Any = 0) -> "DynArray":
        """Inverse of :meth:`to_wire`: a flat buffer whose first ``numel`` elements are the
        valid data in row-major order of ``actual_shape`` becomes a leading-block DynArray."""
        buffer = jnp.asarray(buffer).reshape(-1)
        max_shape = tuple(int(d) for d in max_shape)
        if buffer.shape[0] != math.prod(max_shape):
            raise OpArgumentError("DynArray.from_wire", "buffer", f"{math.prod(max_shape)} "
                                  f"elements (max shape {max_shape})", buffer.shape[0])
        if _on_host(actual_shape):
            _check_dims("DynArray.from_wire", "actual_shape", np.asarray(actual_shape, np.int64),
                        max_shape)
        actual = jnp.asarray(actual_shape, jnp.int32)
        if not max_shape:
            return cls(buffer.reshape(()), actual, fill_value=fill_value)
        grid = jnp.indices(max_shape, dtype=jnp.int32, sparse=True)
        inside = _leading_block_mask(grid, actual)
        flat = sum(g * s for g, s in zip(grid, _row_major_strides(actual)))
        vals = buffer[jnp.clip(flat, 0, max(buffer.shape[0] - 1, 0))] if buffer.shape[0] \
            else jnp.zeros(max_shape, buffer.dtype)
        data = jnp.where(inside, vals, jnp.asarray(fill_value, buffer.dtype))
        return cls(data, actual, fill_value=fill_value)

    # -- static facts ---------------------------------------------------------------------
    @property
    def batch_shape(self) -> tuple[int, ...]:
        """Leading vmap batch axes (``()`` for an unbatched DynArray)."""
        return tuple(self.actual_shape.shape[:-1])

    @property
    def max_shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape[len(self.batch_shape):])

    @property
    def shape(self) -> tuple[int, ...]:
        """Same as :attr:`max_shape` (the static shape XLA plans memory for)."""
        return self.max_shape

    @property
    def ndim(self) -> int:
        return len(self.max_shape)

    @property
    def dtype(self):
        return self.data.dtype

    def __repr__(self) -> str:
        return (f"DynArray(dtype={self.dtype}, max_shape={self.max_shape}, "
                f"actual_shape={self.actual_shape}, fill_value={self.fill_value!r}"
                + ("" if self.true_shape is None else f", true_shape={self.true_shape} "
                   "(overflowed where it exceeds actual_shape)")
                + (f", batch_shape={self.batch_shape}" if self.batch_shape else "") + ")")

    # -- traced queries -------------------------------------------------------------------
    def numel(self) -> jax.Array:
        """Number of valid elements (a traced int32 scalar, or ``[*batch]``)."""
        return _dims_product(self.actual_shape)

    def valid_mask(self) -> jax.Array:
        """Bool array at max shape (plus batch axes), True exactly inside the leading block."""
        return self._batched(lambda d: _leading_block_mask(
            jnp.indices(d.max_shape, dtype=jnp.int32, sparse=True), d.actual_shape)
            if d.ndim else jnp.ones((), bool))

    def valid_data(self, fill: Any = None) -> jax.Array:
        """``data`` with padding replaced by ``fill`` (default ``fill_value``).

        Reductions over a DynArray should go through this view: padding positions then get
        exactly zero gradient.
        """
        fill = self.fill_value if fill is None else fill
        return jnp.where(self.valid_mask(), self.data, jnp.asarray(fill, self.dtype))

    def overflowed(self) -> jax.Array:
        """Whether results were cut by the capacity (False when the op cannot overflow)."""
        if self.true_shape is None:
            return jnp.zeros(self.batch_shape, bool)
        return jnp.any(self.true_shape > self.actual_shape, axis=-1)

    def lost(self, axis: int | None = None) -> jax.Array:
        """What the capacity cut off (0 when nothing): with ``axis=None`` in elements,
        ``prod(true_shape) - prod(actual_shape)`` — the count every overflow message reports
        (:func:`lost_elements`); with an ``axis``, in results along it,
        ``true_shape[axis] - actual_shape[axis]`` (NonZero's ``[rank, n]`` indices: axis 1;
        NMS's ``[k, 3]`` triples: axis 0).

        >>> d = DynArray(jnp.zeros((2, 3)), [2, 3], true_shape=[2, 5])
        >>> int(d.lost()), int(d.lost(axis=1))
        (4, 2)
        """
        if self.true_shape is None:
            return jnp.zeros(self.batch_shape, jnp.int32)
        if axis is None:
            return _dims_product(self.true_shape) - self.numel()
        if not -self.ndim <= axis < self.ndim:
            raise OpArgumentError("DynArray.lost", "axis",
                                  f"an int in [{-self.ndim}, {self.ndim})", axis)
        return self.true_shape[..., axis] - self.actual_shape[..., axis]

    # -- elementwise ----------------------------------------------------------------------
    def map(self, fn) -> "DynArray":
        """``fn`` applied elementwise to the buffer: the same actual and true shape, the
        padding ``fn(fill_value)``. What the comparison and arithmetic operators do, so an
        expression of a DynArray stays one (``jaxops.nonzero(d > 2.5)`` reads only ``d``'s
        valid region and carries its overflow on; ``d.data > 2.5`` is a plain array that
        knows neither).

        >>> d = DynArray(jnp.array([1.0, 4.0, 0.0]), [2], true_shape=[5])
        >>> e = d > 2.5
        >>> e.data.tolist(), e.fill_value, e.true_shape.tolist()
        ([False, True, False], False, [5])
        """
        data = fn(self.data)
        with jax.ensure_compile_time_eval():
            fill = fn(jnp.asarray(self.fill_value, self.dtype))
        if isinstance(fill, jax.core.Tracer):  # fn holds a traced value: pad with zeros
            fill = np.zeros((), data.dtype).item()
            out = DynArray.tree_unflatten(_Static(fill), (data, self.actual_shape,
                                                          self.true_shape))
            data = jnp.where(out.valid_mask(), data, jnp.asarray(fill, data.dtype))
        else:
            fill = np.asarray(fill).item()
        return DynArray.tree_unflatten(_Static(fill), (data, self.actual_shape, self.true_shape))

    def _elementwise(op):
        def apply(self, other):
            if isinstance(other, DynArray):
                return NotImplemented  # two actual shapes: no single answer; use .map
            return self.map(lambda x: op(x, other))
        return apply

    import operator as _op
    __lt__, __le__ = _elementwise(_op.lt), _elementwise(_op.le)
    __gt__, __ge__ = _elementwise(_op.gt), _elementwise(_op.ge)
    __add__, __sub__, __mul__ = _elementwise(_op.add), _elementwise(_op.sub), _elementwise(_op.mul)
    __truediv__, __and__, __or__ = (_elementwise(_op.truediv), _elementwise(_op.and_),
                                    _elementwise(_op.or_))
    __radd__, __rmul__, __rand__, __ror__ = __add__, __mul__, __and__, __or__
    __rsub__ = _elementwise(lambda x, y: y - x)
    __rtruediv__ = _elementwise(lambda x, y: y / x)
    del _op, _elementwise

    def take(self, values, fill_value: Any = 0) -> "DynArray":
        """``values[self.data]`` for a 1-D DynArray of indices (``nonzero``'s, ``unique``'s):
        the rows of ``values`` it points to, as a DynArray with this one's actual and true
        length (padding ``fill_value``), so the rows an overflowed index list lost stay
        counted downstream (e.g. boxes and scores gathered for ``jaxops.batched_nms``).

        >>> i = DynArray(jnp.array([2, 0, -1]), [2], true_shape=[3])
        >>> r = i.take(jnp.array([[1, 1], [2, 2], [3, 3]]))
        >>> r.data.tolist(), r.actual_shape.tolist(), r.true_shape.tolist()
        ([[3, 3], [1, 1], [0, 0]], [2, 2], [3, 2])
        """
        if self.ndim != 1:
            raise OpArgumentError("DynArray.take", "self", "a 1-D DynArray of indices",
                                  f"max shape {self.max_shape}")
        values = jnp.asarray(values)
        rest = values.shape[1:]
        taken = jnp.take(values, jnp.clip(self.data, 0, max(values.shape[0] - 1, 0)), axis=0)
        inside = (jnp.arange(self.max_shape[0]) < self.actual_shape[..., :1]).reshape(
            self.batch_shape + (self.max_shape[0],) + (1,) * len(rest))
        tail = jnp.broadcast_to(jnp.asarray(rest, jnp.int32), self.batch_shape + (len(rest),))
        true = None if self.true_shape is None else \
            jnp.concatenate([self.true_shape, tail], axis=-1)
        return DynArray(jnp.where(inside, taken, jnp.asarray(fill_value, values.dtype)),
                        jnp.concatenate([self.actual_shape, tail], axis=-1), true_shape=true,
                        fill_value=fill_value)

    def __neg__(self) -> "DynArray":
        return self.map(lambda x: -x)

    def __invert__(self) -> "DynArray":
        return self.map(lambda x: ~x)

    # -- functional updates ---------------------------------------------------------------
    def set_actual_shape(self, shape) -> "DynArray":
        """A new DynArray with another actual shape over the same buffer.

        Outside jit a shape of the wrong rank, a negative dim or a dim above the max raises
        ``ValueError``. Inside jit the check is a :func:`checkify.debug_check`: a no-op in
        plain jit, where the shape is clamped into ``[0, max]``, and an error when the caller
        wraps the function in :func:`checkify.checkify`.
        """
        if self.batch_shape:
            raise ValueError("DynArray.set_actual_shape: use it inside jax.vmap for a batched "
                             f"DynArray (batch shape {self.batch_shape})")
        shape_arr = jnp.asarray(shape) if not isinstance(shape, (list, tuple)) else None
        rank = len(shape) if shape_arr is None else (shape_arr.shape[0] if shape_arr.ndim == 1 else -1)
        if rank != self.ndim:
            raise OpArgumentError("DynArray.set_actual_shape", "shape",
                                  f"{self.ndim} dims (max shape {self.max_shape})", rank)
        parts = list(shape) if shape_arr is None else [shape_arr[k] for k in range(rank)]
        if all(_is_concrete(p) for p in parts):
            dims = [int(p) for p in parts]
            _check_dims("DynArray.set_actual_shape", "shape", np.asarray(dims, np.int64),
                        self.max_shape)
            new = jnp.asarray(dims, jnp.int32).reshape(self.ndim)
        else:
            new = jnp.stack([jnp.asarray(p, jnp.int32) for p in parts]) if parts \
                else jnp.zeros((0,), jnp.int32)
            maxes = jnp.asarray(self.max_shape, jnp.int32)
            checkify.debug_check(jnp.all((new >= 0) & (new <= maxes)),
                                 "DynArray.set_actual_shape: actual shape {} outside [0, {}]",
                                 new, maxes)
            new = jnp.clip(new, 0, maxes)
        return DynArray.tree_unflatten(self._fill, (self.data, new, self.true_shape))

    def at(self, index) -> jax.Array:
        """Element access bounds-checked against the *actual* shape.

        Negative indices count from the actual end. Outside jit an index outside the actual
        shape raises ``IndexError``; inside jit it is a :func:`checkify.debug_check` and the
        result is ``fill_value``.
        """
        index = tuple(index) if isinstance(index, (tuple, list)) else (index,)
        if len(index) != self.ndim or self.batch_shape:
            raise IndexError(f"DynArray.at: expected {self.ndim} indices into an unbatched "
                             f"DynArray, got {len(index)} (batch shape {self.batch_shape})")
        if all(_is_concrete(i) for i in index) and _is_concrete(self.actual_shape):
            actual = [int(a) for a in np.asarray(self.actual_shape)]
            norm = [int(i) + a if int(i) < 0 else int(i) for i, a in zip(index, actual)]
            if any(not 0 <= i < a for i, a in zip(norm, actual)):
                raise IndexError(f"DynArray.at: index {index} is outside the actual shape "
                                 f"{tuple(actual)} (max shape {self.max_shape})")
            return self.data[tuple(norm)]
        idx = [jnp.asarray(i, jnp.int32) for i in index]
        idx = [jnp.where(i < 0, i + self.actual_shape[k], i) for k, i in enumerate(idx)]
        inside = jnp.all(jnp.stack([(i >= 0) & (i < self.actual_shape[k])
                                    for k, i in enumerate(idx)])) if idx else jnp.bool_(True)
        checkify.debug_check(inside, "DynArray.at: index {} outside actual shape {}",
                             jnp.stack(idx) if idx else jnp.zeros((0,), jnp.int32),
                             self.actual_shape)
        clipped = tuple(jnp.clip(i, 0, m - 1) for i, m in zip(idx, self.max_shape))
        return jnp.where(inside, self.data[clipped], jnp.asarray(self.fill_value, self.dtype))

    def ravel(self) -> "DynArray":
        """A 1-D DynArray of the valid elements in row-major order of the actual shape
        (:meth:`to_wire`'s layout): actual ``[numel]``, true ``[prod(true_shape)]``.

        >>> DynArray(jnp.array([[1, 2, 0], [3, 4, 0]]), [2, 2]).ravel().data.tolist()
        [1, 2, 3, 4, 0, 0]
        """
        true = None if self.true_shape is None else _dims_product(self.true_shape)[..., None]
        return DynArray.tree_unflatten(self._fill, (self.to_wire(), self.numel()[..., None], true))

    def to_wire(self) -> jax.Array:
        """Flat buffer of max numel: the valid data in row-major order of the actual shape,
        then ``fill_value`` — the layout an Ascend kernel writes. Inverse of :meth:`from_wire`.
        """
        return self._batched(_to_wire_one)

    def _batched(self, fn):
        """Applies an unbatched method body under as many vmaps as there are batch axes."""
        for _ in self.batch_shape:
            fn = jax.vmap(fn)
        return fn(self)


def _dims_product(dims: jax.Array) -> jax.Array:
    """Product over the last axis of int32 shape rows, as plain multiplies: under
    ``jax.grad`` a shape carries a symbolic-zero tangent, which ``jnp.prod``'s rule cannot
    reshape (TypeError on ``ad_util.Zero``)."""
    out = jnp.ones(dims.shape[:-1], dims.dtype)
    for k in range(dims.shape[-1]):
        out = out * dims[..., k]
    return out


def _leading_block_mask(grid: Sequence[jax.Array], actual: jax.Array) -> jax.Array:
    mask = None
    for k, g in enumerate(grid):
        m = g < actual[k]
        mask = m if mask is None else mask & m
    return mask


def _to_wire_one(d: DynArray) -> jax.Array:
    n = math.prod(d.max_shape)
    if d.ndim == 0:
        return d.data.reshape(1)
    pos = jnp.arange(n, dtype=jnp.int32)
    idx, rem = [], pos
    for k in range(d.ndim - 1, -1, -1):
        a = jnp.maximum(d.actual_shape[k], 1)
        idx.append(jnp.clip(rem % a, 0, d.max_shape[k] - 1))
        rem = rem // a
    vals = d.data[tuple(reversed(idx))] if n else d.data.reshape(0)
    return jnp.where(pos < d.numel(), vals, jnp.asarray(d.fill_value, d.dtype))
