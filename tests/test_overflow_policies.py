"""Overflow policies on the real operators: error, truncate, expand, host; check_overflow."""

import warnings

import jax
import numpy as np
import pytest

import jaxops
from jaxops.core.errors import CapacityOverflowError
from tests.cases.nms import ref_non_max_suppression
from tests.test_nms import _edge_images
from tracing import overflow


@pytest.fixture(autouse=True)
def fresh_warnings():
    overflow.reset_warnings()
    yield


def _nms(policy, size=5):
    boxes, scores, _ = _edge_images()
    return boxes, scores, jaxops.non_max_suppression(boxes, scores, 4, 0.5, size=size, overflow=policy)


def test_nms_truncate_is_default_keeps_top_scores_and_warns_once():
    boxes, scores, _ = _edge_images()

    def call():  # one call site
        return jaxops.non_max_suppression(boxes, scores, 4, 0.5, size=5)

    with pytest.warns(overflow.CapacityOverflowWarning, match="20 results lost"):
        out = call()
    np.testing.assert_array_equal(jaxops.refresh(out), ref_non_max_suppression(boxes, scores, 4, 0.5, size=5))
    kept_scores = [scores[b, c, k] for b, c, k in jaxops.refresh(out)]
    all_scores = sorted((scores[b, c, k] for b, c, k in ref_non_max_suppression(boxes, scores, 4, 0.5)),
                        reverse=True)
    assert sorted(kept_scores, reverse=True) == all_scores[:5]
    assert bool(out.overflowed()) and int(out.lost()) == 3 * 20
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            call()  # the same call site again: silent


def test_nms_error():
    with pytest.raises(CapacityOverflowError, match="25 results does not fit capacity 5"):
        _nms("error")


@pytest.mark.parametrize("policy", ["expand", "host"])
def test_nms_expand_and_host_are_complete(policy):
    boxes, scores, out = _nms(policy)
    assert out.max_shape == (32, 3) and not bool(out.overflowed())
    np.testing.assert_array_equal(jaxops.refresh(out), ref_non_max_suppression(boxes, scores, 4, 0.5))


def test_policy_inside_jit_returns_flag_and_check_overflow_raises():
    boxes, scores, _ = _edge_images()
    f = jax.jit(lambda b, s: jaxops.non_max_suppression(b, s, 4, 0.5, size=5, overflow="error"))
    out = f(boxes, scores)  # no rerun, no error inside jit: the flag travels
    assert bool(out.overflowed())
    with pytest.raises(CapacityOverflowError, match="capacity 5"):
        jaxops.check_overflow(out)
    with pytest.warns(overflow.CapacityOverflowWarning):
        assert jaxops.check_overflow(out, policy="warn") == 60


def test_no_overflow_no_rerun_no_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, _, out = _nms("error", size=25)
    assert not bool(out.overflowed()) and out.max_shape == (25, 3)
