"""Inputs that cross every parallel threshold of the native kernels, and numpy checks.

A native kernel splits its work among parts once an input reaches its grain (below: one
part). A write past a part's own range races with the next part, and shows only by chance
and only above the grain (issue 35: NonZero wrong above 2**19 elements in 55 of 100 runs).
So these inputs sit just below and just above 1, 2, 3 and 4 grains (odd sizes), at
densities from none to all, and every check compares with numpy, never with the other
kernel; callers repeat each check, since a race shows on some runs only.

The suite (``tests/native/test_native_sizes.py``) runs a few of them; the benchmark
``benchmarks/native_sweep.py`` runs the whole sweep, native and xla, x64 off and on.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

import jaxops
from tests.helpers.util import expected_truncation

#: Elements per part of the native compaction at least (``kCompactGrain`` in
#: ``jaxops/native/src/compaction.cc``), of the native unique's sort (``kSortGrain``,
#: ``unique.cc``); keys per thread of the hash walks (``kGrain``, ``hash.cc``).
COMPACT_GRAIN = 1 << 18
SORT_GRAIN = 1 << 15
HASH_GRAIN = 2048

DENSITIES = ("none", "one", "half", "all")


def sizes_around(grain: int, parts=(1, 2, 3, 4)) -> list[int]:
    """Odd sizes just below and just above ``k`` grains for each ``k`` in ``parts``."""
    return [n for k in parts for n in (k * grain - 3, k * grain + 5)]


def _nonzero_values(rng, n: int, dtype) -> np.ndarray:
    """Non-zero values of ``dtype``: for floats also NaN, +-inf and subnormals (non-zero
    by their bits), for complex numbers a zero real or imaginary part."""
    dtype = np.dtype(dtype)
    if dtype == bool:
        return np.ones(n, bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        v = rng.integers(1, int(info.max), n, dtype=dtype, endpoint=True)
        return v if dtype.kind == "u" else np.where(rng.random(n) < 0.5, v, -v).astype(dtype)
    specials = np.array([np.nan, np.inf, -np.inf, 1.0, -2.5], np.float64)
    base = np.where(rng.random(n) < 0.1, rng.choice(specials, n), rng.standard_normal(n) + 3.0)
    if dtype.kind == "c":  # the value in the real or the imaginary part, the other 0
        v = np.zeros(n, dtype)
        real = rng.random(n) < 0.5
        v.real, v.imag = np.where(real, base, 0), np.where(real, 0, base)
        return v
    v = base.astype(dtype)
    tiny = np.array(ml_dtypes.finfo(dtype).smallest_subnormal, dtype)
    return np.where(rng.random(n) < 0.05, tiny, v).astype(dtype)


def nonzero_input(rng, n: int, dtype, density: str) -> np.ndarray:
    """``n`` elements of ``dtype``, non-zero at ``density`` ("none", "one", "half",
    "all"); zeros of floats are +0.0 or -0.0 (-0.0 is zero)."""
    dtype = np.dtype(dtype)
    if density == "none":
        where = np.zeros(n, bool)
    elif density == "one":  # one element, anywhere (a part's first, middle or last)
        where = np.zeros(n, bool)
        where[rng.integers(n)] = True
    elif density == "half":
        where = rng.random(n) < 0.5
    elif density == "all":
        where = np.ones(n, bool)
    else:
        raise ValueError(f"density must be one of {DENSITIES}, got {density!r}")
    zeros = np.zeros(n, dtype)
    if dtype.kind in "fcV":
        zeros = np.where(rng.random(n) < 0.5, zeros, -zeros).astype(dtype)  # -0.0 is zero
    return np.where(where, _nonzero_values(rng, n, dtype), zeros).astype(dtype)


def is_nonzero(x: np.ndarray) -> np.ndarray:
    """``x != 0`` as numpy decides it for every dtype (bfloat16 through float32, whose
    NaN, subnormals and -0.0 keep their meaning)."""
    if x.dtype == ml_dtypes.bfloat16:
        return x.astype(np.float32) != 0
    return x != 0


def mismatch(got, want) -> str | None:
    """None when ``got`` equals ``want``: integers by value (int32 or int64 indices alike),
    anything else bit for bit in ``want``'s dtype (NaN payloads, -0.0); else what differs
    first."""
    got, want = np.ascontiguousarray(got), np.ascontiguousarray(want)
    if got.shape != want.shape:
        return f"shape {got.shape}, numpy {want.shape}"
    if want.dtype.kind in "biu":  # numpy compares mixed integer widths by value
        same = (got if got.dtype.kind in "biu" else got.astype(np.int64)) == want
    elif got.dtype != want.dtype:
        return f"dtype {got.dtype}, numpy {want.dtype}"
    elif want.dtype.itemsize in (1, 2, 4, 8):  # the bits as one unsigned word each
        word = np.dtype(f"u{want.dtype.itemsize}")
        same = got.view(word) == want.view(word)
    else:
        as_bytes = lambda a: a.view(np.uint8).reshape(a.shape + (a.dtype.itemsize,))
        same = (as_bytes(got) == as_bytes(want)).all(axis=-1)
    if same.all():
        return None
    at = tuple(int(i[0]) for i in np.nonzero(~same))
    return f"first difference at {at}: {got[at]!r}, numpy {want[at]!r} ({int((~same).sum())} differ)"


def _padded(want: np.ndarray, capacity: int, axis: int, fill) -> np.ndarray:
    """``want`` cut or padded with ``fill`` to ``capacity`` along ``axis``: the whole
    max-shape buffer an operator must return (its padding checked too)."""
    want = np.take(want, np.arange(min(capacity, want.shape[axis])), axis=axis)
    pad = [(0, 0)] * want.ndim
    pad[axis] = (0, capacity - want.shape[axis])
    return np.pad(want, pad, constant_values=fill)


def dyn_mismatch(name: str, out, want: np.ndarray, axis: int, count: int) -> str | None:
    """``out`` (a DynArray) against numpy's ``want``: its true count and its whole buffer
    (the valid block and the padding after it)."""
    counts = out.true_shape if out.true_shape is not None else out.actual_shape
    told = int(np.asarray(counts)[axis])
    if told != count:
        return f"{name}: count {told}, numpy {count}"
    data = np.asarray(out.data)
    found = mismatch(data, _padded(want, data.shape[axis], axis, out.fill_value))
    return found and f"{name}: {found}"


def _runs(name: str, run, repeats: int, compare) -> str | None:
    """``compare(run())`` on each of ``repeats`` runs (the reference computed once by the
    caller): None when every run is right, else how many were wrong and the first finding."""
    wrong = [m for m in (compare(run()) for _ in range(repeats)) if m]
    if not wrong:
        return None
    return wrong[0] if repeats == 1 else f"{len(wrong)} of {repeats} runs of {name} wrong; " \
                                         f"first: {wrong[0]}"


def nonzero_mismatch(x: np.ndarray, backend: str, *, layout: str = "flat",
                     size: int | None = None, repeats: int = 1) -> str | None:
    """NonZero on ``backend`` (``layout``: "flat" flatnonzero, "onnx" nonzero, "argwhere")
    against numpy: the count, the first ``size`` indices and the padding after them, on each
    of ``repeats`` runs."""
    fn = {"flat": jaxops.flatnonzero, "onnx": jaxops.nonzero, "argwhere": jaxops.argwhere}[layout]
    coords = np.stack(np.nonzero(is_nonzero(x))).astype(np.int64)
    want, axis = {"flat": (np.flatnonzero(is_nonzero(x)), 0), "onnx": (coords, 1),
                  "argwhere": (coords.T, 0)}[layout]
    name = f"{layout} on {backend}"

    def run():
        with expected_truncation():
            return fn(x, size=size, overflow="truncate", backend=backend)
    return _runs(name, run, repeats,
                 lambda out: dyn_mismatch(name, out, want, axis, want.shape[axis]))


def masked_select_mismatch(x: np.ndarray, mask: np.ndarray, backend: str,
                           size: int | None = None, repeats: int = 1) -> str | None:
    """MaskedSelect on ``backend`` against numpy's ``x[mask]``: the count, the first
    ``size`` elements (bit for bit) and the padding after them, on each of ``repeats`` runs."""
    want = x[mask]
    name = f"masked_select on {backend}"

    def run():
        with expected_truncation():
            return jaxops.masked_select(x, mask, size=size, overflow="truncate", backend=backend)
    return _runs(name, run, repeats, lambda out: dyn_mismatch(name, out, want, 0, want.size))


def unique_mismatch(x: np.ndarray, backend: str, repeats: int = 1) -> str | None:
    """Unique (sorted, every output) on ``backend`` against ``np.unique`` of an input
    without NaN or -0.0 (where numpy's equality is ONNX's), on each of ``repeats`` runs."""
    want = np.unique(x, return_index=True, return_inverse=True, return_counts=True)

    def run():
        return jaxops.refresh(jaxops.unique(x, return_index=True, return_inverse=True,
                                            return_counts=True, backend=backend))

    def compare(outs):
        for name, got, ref in zip(("y", "first", "inverse", "counts"), outs, want):
            found = mismatch(got, ref.reshape(-1))
            if found:
                return f"unique {name} on {backend}: {found}"
        return None
    return _runs(f"unique on {backend}", run, repeats, compare)


def np_unique(x: np.ndarray, *, sorted: bool = True, size: int | None = None,
              equal_nan: bool = True) -> tuple[np.ndarray, ...]:
    """(y, indices, inverse, counts) of ONNX Unique of a flat ``x`` by numpy, vectorised
    (``tests/helpers/cases/unique.py`` has the plain-Python model): ``-0.0 == 0.0``, NaNs
    after ``+inf`` (one value, or with ``equal_nan=False`` each its own, in order of
    position), each value as the bits of its first occurrence; the first ``size`` kept,
    an inverse past them -1."""
    x = np.asarray(x).reshape(-1)
    with np.errstate(invalid="ignore"):  # signalling NaNs stay NaNs
        keys = x.astype(np.float64) + 0.0 if x.dtype.kind not in "biu" else x  # -0.0 -> +0.0
    _, first, inverse, counts = np.unique(keys, return_index=True, return_inverse=True,
                                          return_counts=True, equal_nan=equal_nan)
    inverse = inverse.reshape(-1)
    if not sorted:  # in order of first occurrence
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        first, counts, inverse = first[order], counts[order], rank[inverse]
    if size is not None:
        first, counts, inverse = first[:size], counts[:size], np.where(inverse < size, inverse, -1)
    return x[first], first, inverse, counts


def unique_all_mismatch(x: np.ndarray, backend: str, **attrs) -> str | None:
    """Unique (every output, ``attrs``: sorted, size, equal_nan) on ``backend`` against
    :func:`np_unique`: the counts, the first ``size`` rows (values bit for bit) and the
    padding after them."""
    with expected_truncation():
        outs = jaxops.unique(x, return_index=True, return_inverse=True, return_counts=True,
                             overflow="truncate", backend=backend, **attrs)
    want = np_unique(x, **{k: v for k, v in attrs.items() if k != "size"})
    count = want[0].size
    want = np_unique(x, **attrs)
    for name, out, ref in zip(("y", "indices", "inverse", "counts"), outs, want):
        if name == "inverse":  # a plain array of x's length
            found = mismatch(np.asarray(out), ref)
            found = found and f"unique inverse on {backend}: {found}"
        else:
            found = dyn_mismatch(f"unique {name} on {backend}", out, ref, 0, count)
        if found:
            return found
    return None
