"""Hypothesis property tests: every operator against its numpy reference (tests/helpers/cases/*) on
random shapes, dtypes and special values (NaN, +-0, +-inf, subnormals, extremes), with
capacities below, at and above the true size, x64 off and on. Bounded: few examples each
(every new shape or capacity compiles), no deadline."""

import warnings

import chex
import jax
import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import jaxops
from jaxops.errors import CapacityOverflowWarning
from jaxops.core.float_bits import np_ordered_bits
from tests.helpers.cases.masked_select import ref_masked_select
from tests.helpers.cases.nms import (random_boxes, ref_batched_nms, ref_efficient_nms, ref_nms,
                                     ref_non_max_suppression)
from tests.helpers.cases.nonzero import ref_nonzero
from tests.helpers.cases.unique import ref_unique, ref_unique_consecutive

BOUNDED = settings(max_examples=6, deadline=None, derandomize=True,
                   phases=[Phase.explicit, Phase.generate],  # no shrinking: bounded time
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
FLOATS = [np.float32, np.float16, ml_dtypes.bfloat16]
INTS = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint32]
SHAPES = [(0,), (1,), (7,), (3, 4), (2, 3, 2)]


def _specials(dtype):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return [False, True]
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        hi = min(info.max, np.iinfo(np.int32).max) if not jax.config.jax_enable_x64 else info.max
        return [0, 1, 2, info.min if dtype.kind == "i" and hi == info.max else 0, hi]
    info = ml_dtypes.finfo(dtype)
    tiny = float(info.smallest_subnormal)
    return [0.0, -0.0, 1.0, -1.0, np.nan, -np.nan, np.inf, -np.inf, tiny, -tiny, 2 * tiny,
            float(info.max), float(info.min)]


@st.composite
def arrays(draw, dtypes=tuple(FLOATS + INTS + [np.bool_]), shapes=tuple(SHAPES)):
    dtype = draw(st.sampled_from(dtypes))
    shape = draw(st.sampled_from(shapes))
    pool = _specials(dtype)
    values = draw(st.lists(st.sampled_from(pool), min_size=int(np.prod(shape)),
                           max_size=int(np.prod(shape))))
    return np.asarray(values, np.float64 if np.dtype(dtype).kind == "f" or dtype
                      is ml_dtypes.bfloat16 else None).astype(dtype).reshape(shape)


def _capacity(draw, true_size):
    return draw(st.sampled_from([None, max(true_size - 1, 0), true_size, true_size + 1]))


def _truncating(fn, *args, **kw):
    """Runs with overflow='truncate'; the expected warning is asserted by lost() instead."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CapacityOverflowWarning)
        d = fn(*args, overflow="truncate", **kw)
        return d, jaxops.refresh(d, allow_truncated=True)


def _same_values(got, want):
    got, want = np.asarray(got), np.asarray(want)
    chex.assert_shape(got, want.shape)
    if want.dtype.kind == "f" or want.dtype == ml_dtypes.bfloat16:  # by bits: -0 == 0, NaN
        chex.assert_trees_all_equal(np_ordered_bits(got.astype(want.dtype)),
                                    np_ordered_bits(want))
    else:
        chex.assert_trees_all_equal(got.astype(want.dtype), want)


@BOUNDED
@given(st.data())
def test_nonzero_family(data):
    x = data.draw(arrays())
    want = ref_nonzero(x)
    size = _capacity(data.draw, want.shape[1])
    d, got = _truncating(jaxops.nonzero, x, size=size)
    chex.assert_trees_all_equal(got.astype(np.int64), want[:, :size])
    assert int(d.lost(axis=1)) == max(want.shape[1] - (size or want.shape[1]), 0)
    chex.assert_trees_all_equal(jaxops.refresh(jaxops.argwhere(x)).astype(np.int64), want.T)
    chex.assert_trees_all_equal(jaxops.refresh(jaxops.flatnonzero(x)).astype(np.int64),
                                np.flatnonzero(x != 0))


@BOUNDED
@given(st.data())
def test_masked_select(data):
    x = data.draw(arrays(dtypes=tuple(FLOATS + INTS)))
    mask = data.draw(arrays(dtypes=(np.bool_, np.uint8), shapes=(x.shape,)))
    want = ref_masked_select(x, mask)
    size = _capacity(data.draw, want.size)
    _, got = _truncating(jaxops.masked_select, x, mask, size=size)
    _same_values(got, want[:size])


@BOUNDED
@given(st.data())
def test_unique_and_unique_consecutive(data):
    x = data.draw(arrays())
    want = ref_unique(x)
    size = _capacity(data.draw, len(want[1]))
    sorted_ = data.draw(st.booleans())
    want = ref_unique(x, size=size, sorted=sorted_)
    d, got = _truncating(jaxops.unique, x, size=size, sorted=sorted_, return_index=True,
                         return_inverse=True, return_counts=True)
    _same_values(got[0], want[0])
    for g, w in zip(got[1:], want[1:]):
        chex.assert_trees_all_equal(np.asarray(g).astype(np.int64).reshape(-1), w.reshape(-1))
    want = ref_unique_consecutive(x)
    d, got = _truncating(jaxops.unique_consecutive, x, return_inverse=True, return_counts=True)
    _same_values(got[0], want[0])
    for g, w in zip(got[1:], want[1:]):
        chex.assert_trees_all_equal(np.asarray(g).astype(np.int64).reshape(-1), w.reshape(-1))


def _scores(data, rng, shape):
    specials = [np.nan, 0.0, -0.0, 1e-45, -1e-45, 0.5, np.inf]
    s = rng.uniform(0, 1, shape).astype(np.float32)
    picks = data.draw(st.lists(st.sampled_from(specials), min_size=2, max_size=2))
    s.reshape(-1)[:min(2, s.size)] = picks[:s.size]
    return s


@BOUNDED
@given(st.data())
def test_nms_family(data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    n = data.draw(st.sampled_from([1, 5, 9]))
    iou = data.draw(st.sampled_from([0.0, 0.5, 0.6, 1.0]))
    thr = data.draw(st.sampled_from([None, 0.0, 0.3]))
    boxes = random_boxes(rng, (n,), grid=data.draw(st.sampled_from([None, 0.5])))
    scores = _scores(data, rng, (n,))
    chex.assert_trees_all_equal(
        jaxops.refresh(jaxops.nms(boxes, scores, iou, score_threshold=thr)).astype(np.int64),
        ref_nms(boxes, scores, iou, score_threshold=thr))
    idxs = rng.integers(0, 3, n).astype(np.int32)
    chex.assert_trees_all_equal(
        jaxops.refresh(jaxops.batched_nms(boxes, scores, idxs, iou, score_threshold=thr))
        .astype(np.int64), ref_batched_nms(boxes, scores, idxs, iou, score_threshold=thr))
    b4, s4 = boxes[None], np.stack([scores, scores[::-1]])[None]
    want = ref_non_max_suppression(b4, s4, n, iou, thr)
    size = _capacity(data.draw, len(want))
    _, got = _truncating(jaxops.non_max_suppression, b4, s4, n, iou, thr, size=size)
    chex.assert_trees_all_equal(got.astype(np.int64),
                                ref_non_max_suppression(b4, s4, n, iou, thr, size=size))
    kw = dict(max_output_boxes=3, iou_threshold=iou, score_threshold=thr or 0.0)
    got = jaxops.efficient_nms(b4, s4.transpose(0, 2, 1), **kw)
    chex.assert_trees_all_equal(tuple(np.asarray(x) for x in got),
                                tuple(ref_efficient_nms(b4, s4.transpose(0, 2, 1), **kw)))


@pytest.mark.parametrize("test", [test_nonzero_family, test_masked_select,
                                  test_unique_and_unique_consecutive, test_nms_family])
def test_with_x64_on(test):
    with jax.enable_x64(True):
        test()
