"""NonZero, MaskedSelect and Unique at every parallel threshold, checked against numpy, then timed.

Issue 35's sweep: each kernel at odd sizes just below and above 1, 2, 3 and 4 grains of
its native kernel (and 2**24), at densities none / one / half / all, for every dtype path,
on the native and the xla kernels, with ``jax_enable_x64`` off and on, each comparison
repeated (a race shows on some runs only). Any wrong result raises, listing them; the note
says how many runs were checked. Then flatnonzero of 16M elements is timed against
``np.flatnonzero`` (checked first) on each backend: the speed the fix must keep.

Run ``python -m benchmarks --only native_sweep`` (``--quick``: 1 and 2 grains, fewer dtypes,
about a minute).
"""

from __future__ import annotations

import itertools

import jax
import ml_dtypes
import numpy as np

import jaxops
from benchmarks.common import Result, against, compare
from tests.helpers import native_sweep as sweep

REPEATS = 3
# every predicate path of the native NonZero (one byte, 16-bit ints, 16-bit floats, 32-bit
# ints, float32, complex64) with x64 off; the 64-bit ones need x64 on
DTYPES = (bool, np.int8, np.uint8, np.int16, np.uint16, np.float16, ml_dtypes.bfloat16,
          np.int32, np.uint32, np.float32, np.complex64)
DTYPES_X64 = (np.int64, np.uint64, np.float64, np.complex128)
QUICK_DTYPES = (bool, np.float16, np.float32)


def _backends() -> list[str]:
    from jaxops import native

    return ["native", "xla"] if native.available() else ["xla"]


def _runs(quick: bool):
    """(description, check) of every comparison of the sweep, inputs made on demand."""
    rng = np.random.default_rng(35)
    parts = (1, 2) if quick else (1, 2, 3, 4)
    sizes = sweep.sizes_around(sweep.COMPACT_GRAIN, parts) + ([] if quick else [1 << 24])
    for x64 in (False, True):
        dtypes = QUICK_DTYPES if quick else DTYPES + (DTYPES_X64 if x64 else ())
        for dtype, n, density in itertools.product(dtypes, sizes, sweep.DENSITIES):
            if n == 1 << 24 and dtype not in (bool, np.float32, np.int64):
                continue  # 2**24 for the byte path and two predicate widths: minutes each else
            x = sweep.nonzero_input(rng, n, dtype, density)
            yield x64, f"flatnonzero {np.dtype(dtype).name} n={n} {density}", \
                lambda b, x=x: sweep.nonzero_mismatch(x, b)
        for n in sweep.sizes_around(sweep.COMPACT_GRAIN, parts[-2:]):  # 2-D, both layouts
            rows = n // 7
            x = sweep.nonzero_input(rng, rows * 7, np.float32, "half").reshape(rows, 7)
            count = int(np.count_nonzero(x))
            for layout, size in itertools.product(("onnx", "argwhere"), (None, count // 2)):
                yield x64, f"{layout} [{rows}, 7] size={size}", \
                    lambda b, x=x, layout=layout, size=size: sweep.nonzero_mismatch(
                        x, b, layout=layout, size=size)
        for dtype, n, density in itertools.product(
                (np.int8, np.float16, np.float32, np.complex64) + ((np.complex128,) if x64 else ()),
                sweep.sizes_around(sweep.COMPACT_GRAIN, parts), sweep.DENSITIES):
            x = sweep.nonzero_input(rng, n, dtype, "all")
            mask = sweep.nonzero_input(rng, n, bool, density)
            yield x64, f"masked_select {np.dtype(dtype).name} n={n} {density}", \
                lambda b, x=x, mask=mask: sweep.masked_select_mismatch(x, mask, b)
        for n in sweep.sizes_around(sweep.SORT_GRAIN, parts):
            x = (rng.standard_normal(n) * 100).round().astype(np.float32) + 0.5
            yield x64, f"unique float32 n={n}", lambda b, x=x: sweep.unique_mismatch(x, b)


def sweep_results(quick: bool) -> tuple[int, list[str]]:
    """Runs the sweep: (comparisons made, the wrong ones)."""
    checked, wrong = 0, []
    for x64, name, check in _runs(quick):
        with jax.enable_x64(x64):
            for backend, _ in itertools.product(_backends(), range(REPEATS)):
                checked += 1
                found = check(backend)
                if found:
                    wrong.append(f"{name} x64={x64}: {found}")
    return checked, wrong


def run(quick: bool = False) -> list[Result]:
    checked, wrong = sweep_results(quick)
    if wrong:
        raise AssertionError(f"{len(wrong)} of {checked} runs wrong:\n" + "\n".join(wrong[:20]))
    n = 1 << (20 if quick else 24)
    rng = np.random.default_rng(0)
    x = sweep.nonzero_input(rng, n, np.float32, "half")
    dev = jax.device_put(x)
    want = np.flatnonzero(x)
    results = []
    for backend in _backends():
        fn = jax.jit(lambda v, b=backend: jaxops.flatnonzero(v, backend=b))
        results.append(compare(f"flatnonzero {n >> 20}M f32 50% [{backend}]", lambda: fn(dev),
                               "np.flatnonzero", lambda: np.flatnonzero(x), repeats=11,
                               note=f"sweep: {checked} runs checked against numpy, 0 wrong",
                               check=against(want)))
    return results
