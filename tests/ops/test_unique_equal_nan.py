"""``equal_nan`` of Unique and UniqueConsecutive against numpy, torch's rule and the reference.

numpy's ``np.unique(equal_nan=...)`` is the oracle for flat inputs (its ``return_index``
path sorts stably, so the NaNs it keeps apart come in order of position, as ours do).
torch is not a test dependency; its rule (``torch.unique`` and ``unique_consecutive``
compare with ``!=``, so NaN equals nothing) is checked on hand-made cases whose outputs
follow from that rule alone.
"""

import jax
import ml_dtypes
import numpy as np
import pytest

import jaxops
from jaxops.core.errors import OpArgumentError
from tests.helpers.cases.unique import (ref_unique, ref_unique_consecutive, unique_all,
                                        unique_consecutive_all)
from tests.ops.test_unique import assert_same
from tests.helpers.util import expected_truncation

BACKENDS = ["xla", "host"]


def nan_inputs(rng, n, dtype):
    """Ties, NaNs of both signs and several payloads, signed zeros and infinities."""
    x = rng.integers(-3, 3, n).astype(np.float64)
    x[rng.random(n) < 0.1] = np.inf
    x[rng.random(n) < 0.1] = -np.inf
    x[(x == 0) & (rng.random(n) < 0.5)] = -0.0
    x = x.astype(dtype)
    nan = np.flatnonzero(rng.random(n) < 0.25)
    if len(nan):
        bits = x.view(np.dtype(f"u{x.itemsize}"))
        quiet = np.array(np.nan, dtype).view(bits.dtype)
        sign = bits.dtype.type(1 << (8 * x.itemsize - 1))
        bits[nan] = quiet | rng.integers(0, 4, len(nan)).astype(bits.dtype)  # payloads
        bits[nan[::2]] |= sign
    return x


EDGES = [[], [np.nan] * 4, [np.nan, 1.0, np.nan, 1.0], [-0.0, 0.0, np.nan, -np.nan],
         [np.inf, np.nan, -np.inf, np.nan], [1.0, 2.0, 1.0, 0.0]]  # two shapes: two compiles


def numpy_unique(x, equal_nan):
    y, idx, inv, cnt = np.unique(x.astype(np.float64), equal_nan=equal_nan, return_index=True,
                                 return_inverse=True, return_counts=True)
    return y, idx, inv.reshape(-1), cnt


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("equal_nan", [True, False])
def test_flat_inputs_match_numpy(backend, equal_nan):
    rng = np.random.default_rng(0)
    inputs = [nan_inputs(rng, 40, dtype) for dtype in (np.float16, ml_dtypes.bfloat16)] + \
        [nan_inputs(rng, 40, np.float32) for _ in range(3)] + \
        [np.asarray(e, np.float32) for e in EDGES]
    for x in inputs:
        got = jaxops.refresh(unique_all(x, equal_nan=equal_nan, backend=backend))
        want = numpy_unique(x, equal_nan)
        assert_same([got[0].astype(np.float64)] + list(got[1:]), want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_float64_with_x64_matches_numpy(backend):
    rng = np.random.default_rng(1)
    with jax.enable_x64(True):
        for x in [nan_inputs(rng, 50, np.float64)] + [np.asarray(e, np.float64) for e in EDGES]:
            for equal_nan in (True, False):
                got = jaxops.refresh(unique_all(x, equal_nan=equal_nan, backend=backend))
                assert_same(got, numpy_unique(x, equal_nan))


def test_torch_rule_nan_equals_nothing():
    """torch.unique([nan, 1, nan]) keeps both NaNs (after 1, in order); unique_consecutive
    splits [nan, nan, 1, 1] into three runs."""
    x = np.array([np.nan, 1.0, np.nan], np.float32)
    y, inv, cnt = jaxops.refresh(jaxops.unique(x, equal_nan=False, return_inverse=True,
                                               return_counts=True))
    assert_same((y, inv, cnt), ([1.0, np.nan, np.nan], [1, 0, 2], [1, 1, 1]))
    x = np.array([np.nan, np.nan, 1.0, 1.0], np.float32)
    y, inv, cnt = jaxops.refresh(jaxops.unique_consecutive(x, equal_nan=False, return_inverse=True,
                                                           return_counts=True))
    assert_same((y, inv, cnt), ([np.nan, np.nan, 1.0], [0, 1, 2, 2], [1, 1, 2]))
    y, cnt = jaxops.refresh(jaxops.unique_consecutive(x, return_counts=True))  # default
    assert_same((y, cnt), ([np.nan, 1.0], [2, 2]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_first_occurrence_order_capacity_and_jit(backend):
    rng = np.random.default_rng(2)
    x = nan_inputs(rng, 30, np.float32)
    n_unique = len(numpy_unique(x, False)[0])
    configs = [(sorted_, size) for sorted_ in (True, False) for size in (None, n_unique - 3)]
    outs = jax.jit(lambda x: [unique_all(x, size=size, sorted=sorted_, equal_nan=False,  # one
                                         overflow="truncate", backend=backend)  # program
                              for sorted_, size in configs])(x)
    for (sorted_, size), out in zip(configs, outs):
        assert_same(jaxops.refresh(out, allow_truncated=True), ref_unique(x, size=size, sorted=sorted_,
                                                                          equal_nan=False))
        assert int(out[0].true_shape[0]) == n_unique


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("axis", [0, 1])
def test_slices_holding_a_nan_are_distinct(backend, axis):
    rng = np.random.default_rng(3)
    x = rng.integers(0, 2, (12, 3)).astype(np.float32)
    x[rng.random(x.shape) < 0.15] = np.nan
    x = x if axis == 0 else x.T
    for sorted_ in (True, False):
        for equal_nan in (True, False):
            got = jaxops.refresh(unique_all(x, axis=axis, sorted=sorted_, equal_nan=equal_nan,
                                            backend=backend))
            assert_same(got, ref_unique(x, axis=axis, sorted=sorted_, equal_nan=equal_nan))
    # np.unique with an axis always keeps NaN slices apart: our equal_nan=False
    want = np.unique(x, axis=axis, return_index=True, return_inverse=True, return_counts=True)
    got = jaxops.refresh(unique_all(x, axis=axis, equal_nan=False, backend=backend))
    assert_same(got, (want[0], want[1], want[2].reshape(-1), want[3]))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("axis", [None, 0])
def test_unique_consecutive_runs(backend, axis):
    rng = np.random.default_rng(4)
    for _ in range(3):
        x = nan_inputs(rng, 24, np.float32).reshape(8, 3)
        x[3] = x[2]  # a repeated row (a NaN one when row 2 holds a NaN)
        for equal_nan in (True, False):
            for size in (None, 4):
                with expected_truncation():
                    cut = unique_consecutive_all(x, axis=axis, size=size, equal_nan=equal_nan,
                                                 overflow="truncate", backend=backend)
                got = jaxops.refresh(cut, allow_truncated=True)
                assert_same(got, ref_unique_consecutive(x, size=size, axis=axis,
                                                        equal_nan=equal_nan))


def test_integers_ignore_equal_nan():
    x = np.array([3, 1, 3, 2], np.int32)
    assert_same(jaxops.refresh(unique_all(x, equal_nan=False)), ref_unique(x))


def test_equal_nan_must_be_a_bool():
    with pytest.raises(OpArgumentError, match="Unique: argument 'equal_nan'"):
        jaxops.unique(np.ones(3, np.float32), equal_nan="no")
    with pytest.raises(OpArgumentError, match="UniqueConsecutive: argument 'equal_nan'"):
        jaxops.unique_consecutive(np.ones(3, np.float32), equal_nan=None)
