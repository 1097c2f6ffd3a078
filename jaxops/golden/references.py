"""Independent references of the golden operators: plain numpy, written from each contract.

``golden check`` compares a case with these, never with the kernel that wrote it: a kernel
checked against itself passes its own bugs (issue 35: a 16M NonZero case held a wrong
index, and the recomputing check passed it). So this module imports no jaxops kernel and
no shared piece of one; each reference reads the contract it follows (the aclnn kernel's,
else ONNX, torchvision, TensorRT) and states it in a few lines of numpy. The NMS family's
are in :mod:`jaxops.golden.nms_references`, the hash-table operators' in
:mod:`jaxops.golden.table_references` (registered when imported, as :mod:`jaxops.golden.check`
does).

A reference takes the case's inputs (numpy, in OpDef order) and its attrs and returns
:class:`Expected`: each output at its exact shape (after the ``size`` attr's cut, as the
kernel must return it) in the contract's dtype (values keep their input's, indices are
int64 unless the kernel writes int32) and, per output that a capacity can cut, its true
shape. A reference models the impl modes it names; a case in another mode is refused.

>>> want = reference("NonZero")([np.array([0, 3, 0, 5])], {"size": None, "transpose": False})
>>> want.outputs[0].tolist(), want.true_shapes
([[1, 3]], [(1, 2)])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from jaxops.core.errors import OpArgumentError

__all__ = ["Expected", "has_reference", "reference", "register_reference", "takes_names"]


class Expected(NamedTuple):
    """What a kernel must return: exact-shape outputs and (``None`` where no capacity can
    cut it) each output's true shape. A reference registered ``named`` returns
    ``{name: output}`` and ``true_shapes=None``, and ``tolerances``: ``{name: array}`` of
    the absolute difference each float element may have (elements not named: bit for bit;
    a uint8 bucket table's tolerance is its rows', ``[bucket_size, embedding_dim]``)."""

    outputs: list | dict
    true_shapes: list | None
    tolerances: dict | None = None


_REFERENCES: dict[tuple[str, str | None], Callable[..., Expected]] = {}
#: The impl modes each reference models (a case in another mode is refused).
_MODES: dict[tuple[str, str | None], tuple[str, ...]] = {}
#: The references that take their inputs by name (``{name: array}``), not in OpDef order.
_NAMED: set[tuple[str, str | None]] = set()


def register_reference(op: str, contract: str | None = None,
                       modes: tuple[str, ...] = ("high_precision",), named: bool = False):
    """Decorator: registers ``fn(inputs, attrs, mode)`` as ``op``'s reference (for one
    ``contract`` name, or ``None``: every contract without its own), modelling ``modes``;
    ``named``: it takes and returns tensors by name (the hash-table operators, whose cases
    hold CANN's inputs, not the OpDef's)."""
    def register(fn):
        _REFERENCES[(op, contract)] = fn
        _MODES[(op, contract)] = modes
        if named:
            _NAMED.add((op, contract))
        return fn
    return register


def takes_names(op: str, contract: str | None = None) -> bool:
    """Whether ``op``'s reference takes its inputs by name (``register_reference(named=)``).

    >>> takes_names("NonZero")
    False
    """
    key = (op, contract) if (op, contract) in _REFERENCES else (op, None)
    return key in _NAMED


def has_reference(op: str) -> bool:
    """Whether ``op`` has an independent reference (once the module registering it is
    imported: :mod:`jaxops.golden.check` imports them all).

    >>> has_reference("NonZero"), has_reference("NoSuchOp")
    (True, False)
    """
    return any(o == op for o, _ in _REFERENCES)


def reference(op: str, contract: str | None = None, mode: str = "high_precision"
              ) -> Callable[[list, dict], Expected]:
    """The reference of ``op`` under ``contract`` in impl ``mode``: ``fn(inputs, attrs) ->
    Expected``. An operator without one, or a mode it does not model, raises
    :class:`~jaxops.core.errors.OpArgumentError` (refused, never passed).

    >>> reference("MaskedSelect", mode="keep_fp16")
    Traceback (most recent call last):
    ...
    jaxops.core.errors.OpArgumentError: golden check MaskedSelect: argument 'impl_mode': expected one of high_precision, high_performance (the modes its reference models), got 'keep_fp16'.
    """
    key = (op, contract) if (op, contract) in _REFERENCES else (op, None)
    if key not in _REFERENCES:
        raise OpArgumentError("golden check", "op", "one of " + ", ".join(
            sorted({o for o, _ in _REFERENCES})), repr(op),
            "Its cases have no independent reference yet.")
    if mode not in _MODES[key] + ("default",):
        raise OpArgumentError(f"golden check {op}", "impl_mode", "one of " + ", ".join(
            _MODES[key]) + " (the modes its reference models)", repr(mode))
    fn = _REFERENCES[key]
    return lambda inputs, attrs: fn(inputs, attrs, mode)


def _is_nonzero(x: np.ndarray) -> np.ndarray:
    """``x != 0`` (-0.0 is zero, NaN and subnormals are not); bfloat16 (kind "V") widened
    to float32 first, exactly."""
    return x.astype(np.float32) != 0 if x.dtype.kind == "V" else x != 0


def _cut(a: np.ndarray, size, axis: int = 0) -> np.ndarray:
    return a if size is None else np.take(a, np.arange(min(size, a.shape[axis])), axis=axis)


@register_reference("NonZero")
def _nonzero(inputs, attrs, mode):
    """ONNX NonZero: the coordinates of ``x != 0`` in row-major order, ``[rank, n]`` (a
    0-d x is a 1-element vector); ``transpose``: ``[n, rank]``; ``size`` keeps the first."""
    x = np.atleast_1d(inputs[0])
    coords = np.stack(np.nonzero(_is_nonzero(x))).astype(np.int64)
    if attrs.get("transpose"):
        coords = coords.T
    axis = 0 if attrs.get("transpose") else 1
    return Expected([_cut(coords, attrs.get("size"), axis)], [coords.shape])


def _float_key(v: np.ndarray):
    """Equality and order of ONNX Unique on floats: -0.0 == 0.0, NaN after +inf."""
    v = v.astype(np.float64)
    return [(1, 0.0) if np.isnan(f) else (0, f + 0.0) for f in v.reshape(-1)]


def _groups(items: np.ndarray, equal_nan: bool) -> list:
    """A key per item (a value or a flattened slice): its value's (floats: -0.0 as 0.0,
    NaN equal to NaN), plus its position where it holds a NaN and NaNs are distinct."""
    keys = []
    for i, item in enumerate(items):
        flat = np.asarray(item).reshape(-1)
        if flat.dtype.kind in "fV":
            k = tuple(_float_key(flat))
            keys.append(k + ((i + 1,) if not equal_nan and any(n for n, _ in k) else (0,)))
        else:
            keys.append(tuple(int(v) for v in flat))
    return keys


def _items(x: np.ndarray, axis):
    """The items Unique compares (elements, or slices along ``axis``) and how to put the
    chosen ones back into ``x``'s layout."""
    if axis is None:
        return x.reshape(-1), lambda picked: picked
    moved = np.moveaxis(x, axis, 0)
    return moved, lambda picked: np.moveaxis(picked, 0, axis % x.ndim)


@register_reference("Unique")
def _unique(inputs, attrs, mode):
    """ONNX Unique: the distinct items (ascending with ``sorted``, else in order of first
    occurrence), each as its first occurrence; first indices, the inverse (-1 where the
    item's id is cut by ``size``) and counts."""
    x, size, axis = np.asarray(inputs[0]), attrs.get("size"), attrs.get("axis")
    items, put_back = _items(x, axis)
    keys = _groups(items, attrs.get("equal_nan", True))
    members: dict = {}
    for i, k in enumerate(keys):
        members.setdefault(k, []).append(i)
    order = sorted(members) if attrs.get("sorted", True) else list(members)
    first = np.array([members[k][0] for k in order], np.int64)
    counts = np.array([len(members[k]) for k in order], np.int64)
    ids = {k: j for j, k in enumerate(order)}
    kept = len(order) if size is None else min(size, len(order))
    inverse = np.array([ids[k] if ids[k] < kept else -1 for k in keys], np.int64)
    y = put_back(items[first[:kept]])
    true_y = list(y.shape)
    true_y[0 if axis is None else axis % x.ndim] = len(order)
    return Expected([y, first[:kept], inverse, counts[:kept]],
                    [tuple(true_y), (len(order),), None, (len(order),)])


@register_reference("Unique", "aclnnUnique2")
def _unique2(inputs, attrs, mode):
    """aclnnUnique2 (sorted, flattened): Unique's outputs, inverseOut in self's shape."""
    want = _unique(inputs, attrs, mode)
    y, first, inverse, counts = want.outputs
    return Expected([y, first, inverse.reshape(np.shape(inputs[0])), counts], want.true_shapes)


@register_reference("UniqueConsecutive")
def _unique_consecutive(inputs, attrs, mode):
    """torch.unique_consecutive: the first item of each run of equal items (Unique's
    equality), the run of every item (-1 where cut by ``size``) and the run lengths."""
    x, size, axis = np.asarray(inputs[0]), attrs.get("size"), attrs.get("axis")
    items, put_back = _items(x, axis)
    keys = _groups(items, attrs.get("equal_nan", True))
    starts = [i for i in range(len(keys)) if i == 0 or keys[i] != keys[i - 1]]
    runs = len(starts)
    kept = runs if size is None else min(size, runs)
    run_of = np.cumsum([i in set(starts) for i in range(len(keys))]) - 1 if keys else np.zeros(0)
    inverse = np.where(run_of < kept, run_of, -1).astype(np.int64)
    counts = np.diff(starts + [len(keys)]).astype(np.int64)
    y = put_back(items[np.array(starts[:kept], np.int64)])
    true_y = list(y.shape)
    true_y[0 if axis is None else axis % x.ndim] = runs
    return Expected([y, inverse, counts[:kept]], [tuple(true_y), None, (runs,)])


@register_reference("MaskedSelect", modes=("high_precision", "high_performance"))
def _masked_select(inputs, attrs, mode):
    """torch.masked_select: ``x`` and ``mask`` broadcast, the selected elements in
    row-major order; ``size`` keeps the first."""
    x, mask = np.broadcast_arrays(*(np.asarray(a) for a in inputs))
    y = x[mask.astype(bool)]
    return Expected([_cut(y, attrs.get("size"))], [y.shape])
