"""``Tensor``: the value every whole-program rule takes and returns (the dual shape, per axis).

A :class:`~jaxops.DynArray` carries its actual shape as one traced vector. A whole program
needs to know more, per axis, at trace time: which axes are *static* (the actual size is
the max size, known), and for integer tensors that feed shapes (``Shape``, ``Size``, the
arithmetic on them), an *interval* ``[lo, hi]`` for each element beside its traced value,
so a downstream ``Reshape`` or ``TopK`` gets a static max shape. That is this class:

- ``data``: the buffer at the max shape; the valid region is the leading block
  ``data[:d0, :d1, ...]``. **The padding is unspecified**: a rule that reads across a
  dynamic axis (a reduction, a contraction, a sort) masks it with its own identity first,
  as XLA's dynamic padder does; elementwise rules never need to.
- ``dims``: per axis, a Python ``int`` (static: the actual size is ``data.shape[k]``) or a
  traced int32 scalar (dynamic, in ``[0, data.shape[k]]``).
- ``lo``, ``hi``: static bounds of the values (numpy float64, broadcastable to the max
  shape; ``None``: the dtype's range); exact (``lo == hi``) where the value is known.
- ``syms``: for a small 1-D integer tensor, which element holds which traced dim (the
  object itself), so ``Reshape(x, Concat(Gather(Shape(x), 0), 2))`` knows that its first
  dim *is* ``x``'s first dim, and keeps the layout.
- ``lost``: elements that an overflowed capacity upstream may have cut (traced int32,
  an upper bound), or ``None``: it becomes the output DynArray's ``true_shape``.

>>> import jax.numpy as jnp
>>> from jaxops import DynArray
>>> t = Tensor.of(DynArray(jnp.zeros((5, 4)), [3, 4]), static_axes=(1,))
>>> t.shape, t.dims[1], t.is_static
((5, 4), 4, False)
>>> [a.tolist() for a in t.shape_bounds()]
[[0.0, 4.0], [5.0, 4.0]]
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.core.dynarray import DynArray
from jaxops.core.errors import OpArgumentError
from jaxops.core.memory import refuse_unless_fits
from jaxops.core.narrowing import check_fits

__all__ = ["Dim", "Tensor", "dim_bounds", "dims_product", "is_traced", "plan_shape"]

#: A dim: a static Python int, or a traced int32 scalar.
Dim = Any


def is_traced(x: Any) -> bool:
    return isinstance(x, jax.core.Tracer)


def dim_bounds(d: Dim, max_size: int) -> tuple[int, int]:
    """``(lo, hi)`` of one dim whose max size is ``max_size``."""
    return (d, d) if isinstance(d, (int, np.integer)) else (0, max_size)


def dims_product(dims) -> Dim:
    """The product of dims; a traced dim times static 1s is that dim itself (its identity
    tells a later Reshape that the axis stayed)."""
    static, traced = 1, []
    for d in dims:
        if isinstance(d, (int, np.integer)):
            static *= int(d)
        else:
            traced.append(d)
    if not traced:
        return static
    out = traced[0]
    for d in traced[1:]:
        out = out * d
    return out if static == 1 else out * static


def plan_shape(op: str, arg: str, shape: tuple[int, ...], dtype: Any) -> tuple[int, ...]:
    """A max shape about to be planned, checked: every dim a finite int >= 0, and the buffer
    fitting in memory (:func:`~jaxops.core.memory.refuse_unless_fits`), before anything is
    allocated or traced."""
    if any(not np.isfinite(d) or d < 0 for d in shape):
        raise OpArgumentError(op, arg, "a max shape bounded at trace time (finite dims >= 0)",
                              f"dims {list(shape)}", "Give the value a static bound, or a "
                              "capacity for the operator that makes it.")
    shape = tuple(int(d) for d in shape)
    refuse_unless_fits(op, arg, math.prod(shape) * np.dtype(dtype).itemsize,
                       f"the {list(shape)} {np.dtype(dtype).name} max-shape buffer")
    return shape


class Tensor:
    """A max-shape buffer with per-axis dims and value bounds (see the module docstring)."""

    __slots__ = ("data", "dims", "lo", "hi", "syms", "lost", "broadcast_of")

    def __init__(self, data, dims=None, *, lo=None, hi=None, syms=None, lost=None,
                 broadcast_of=None):
        self.data = data
        self.dims = tuple(data.shape) if dims is None else tuple(
            int(d) if isinstance(d, (int, np.integer)) else d for d in dims)
        if len(self.dims) != data.ndim:
            raise OpArgumentError("Tensor", "dims", f"{data.ndim} dims", len(self.dims))
        self.lo, self.hi, self.syms, self.lost = lo, hi, syms, lost
        # the tensor whose size-1 axes this one's data stretches (set by ``expand``), so a
        # scatter of broadcast indices can write whole rows instead of single elements
        self.broadcast_of = broadcast_of

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def of(cls, x: Any, static_axes: tuple[int, ...] = ()) -> "Tensor":
        """A DynArray (its axes dynamic unless listed in ``static_axes``), a Tensor, or an
        array (all static)."""
        if isinstance(x, Tensor):
            return x
        if isinstance(x, DynArray):
            if x.batch_shape:
                raise OpArgumentError("jaxops.dynamic", "x", "an unbatched DynArray",
                                      f"batch shape {x.batch_shape}")
            dims = [x.max_shape[k] if k in static_axes else x.actual_shape[k]
                    for k in range(x.ndim)]
            lost = None if x.true_shape is None else x.lost()
            return cls(x.data, dims, lost=lost)
        if not isinstance(x, (jax.Array, np.ndarray)):
            x = np.asarray(x)
        return cls(x)

    def with_data(self, data, **changes) -> "Tensor":
        """Same dims (and loss) over another buffer of the same shape; bounds dropped."""
        kw = dict(lost=self.lost)
        kw.update(changes)
        return Tensor(data, self.dims, **kw)

    # -- static facts ---------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        """The max shape."""
        return tuple(self.data.shape)

    @property
    def ndim(self) -> int:
        return self.data.ndim

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.data.dtype)

    @property
    def is_static(self) -> bool:
        """Every axis full (the tensor is a plain array)."""
        return all(isinstance(d, int) for d in self.dims)

    @property
    def concrete(self) -> bool:
        """Known at trace time: static and not traced."""
        return self.is_static and not is_traced(self.data)

    def dynamic_axes(self) -> list[int]:
        return [k for k, d in enumerate(self.dims) if not isinstance(d, int)]

    def np(self) -> np.ndarray:
        """The known value, on the host (raises if the tensor is traced)."""
        if not self.concrete:
            raise OpArgumentError("jaxops.dynamic", "value", "a value known at trace time",
                                  "a traced or dynamic-shape tensor")
        return np.asarray(self.data)

    def jax(self, op: str = "jaxops.dynamic", arg: str = "x") -> jax.Array:
        """The buffer as a JAX array; a 64-bit host value that JAX with x64 off would change
        is refused (:func:`~jaxops.core.narrowing.check_fits`), never narrowed."""
        if isinstance(self.data, (np.ndarray, np.generic)):
            check_fits(op, arg, self.data)
            return jnp.asarray(self.data)
        return self.data

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """``(lo, hi)`` of the values, float64, broadcastable to the max shape."""
        if self.concrete and self.data.dtype.kind in "biuf":
            v = np.asarray(self.data, np.float64)
            return v, v
        if self.lo is not None:
            return np.asarray(self.lo, np.float64), np.asarray(self.hi, np.float64)
        kind = self.dtype.kind
        if kind == "b":
            return np.zeros(()), np.ones(())
        if kind in "iu":
            info = np.iinfo(self.dtype)
            return np.full((), float(info.min)), np.full((), float(info.max))
        return np.full((), -np.inf), np.full((), np.inf)

    def shape_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """Bounds of the actual shape vector (what ``Shape`` of this tensor holds)."""
        pairs = [dim_bounds(d, m) for d, m in zip(self.dims, self.shape)]
        return (np.array([p[0] for p in pairs], np.float64),
                np.array([p[1] for p in pairs], np.float64))

    # -- traced queries -------------------------------------------------------------------
    def actual_shape(self) -> jax.Array:
        return jnp.stack([jnp.asarray(d, jnp.int32) for d in self.dims]) if self.dims \
            else jnp.zeros((0,), jnp.int32)

    def numel(self) -> Dim:
        return dims_product(self.dims)

    def axis_mask(self, axes=None) -> jax.Array | None:
        """Bool, broadcastable to the max shape: inside the valid block along ``axes``
        (default every axis); ``None`` when those axes are all static."""
        axes = range(self.ndim) if axes is None else axes
        mask = None
        for k in axes:
            d = self.dims[k]
            if isinstance(d, int):
                continue
            shape = [1] * self.ndim
            shape[k] = self.shape[k]
            m = (jnp.arange(self.shape[k], dtype=jnp.int32) < d).reshape(shape)
            mask = m if mask is None else mask & m
        return mask

    def masked(self, identity: Any, axes=None) -> jax.Array:
        """The buffer with the padding along ``axes`` replaced by ``identity``."""
        mask = self.axis_mask(axes)
        data = self.jax()
        if mask is None:
            return data
        return jnp.where(mask, data, jnp.asarray(identity, data.dtype))

    # -- out ------------------------------------------------------------------------------
    def to_public(self, fill_value: Any = 0) -> jax.Array | DynArray:
        """A plain array when static and nothing was lost, else a DynArray whose padding
        holds ``fill_value`` and whose ``true_shape`` counts what was lost (on axis 0)."""
        if self.is_static and self.lost is None:
            return self.jax()
        data = self.masked(fill_value)
        actual = self.actual_shape()
        true = None
        if self.lost is not None and self.ndim:
            true = actual.at[0].add(jnp.asarray(self.lost, jnp.int32))
        return DynArray(data, actual, true_shape=true, fill_value=fill_value)

    def __repr__(self) -> str:
        dims = ", ".join(str(d) if isinstance(d, int) else f"<= {m}"
                         for d, m in zip(self.dims, self.shape))
        return f"Tensor({self.dtype}, dims=[{dims}]{', lost' if self.lost is not None else ''})"
