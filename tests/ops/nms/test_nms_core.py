"""The xla NMS core: the blocked IoU bitmask walk and the candidate orders, against plain
numpy (sequential greedy NMS, lexsort), on random problems."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxops.ops.nms.bitmask import bitmask_nms
from jaxops.ops.nms.candidates import Candidates, orders, priority_keys, select
from jaxops.ops.nms.iou import decode_boxes
from tests.helpers.cases.nms import (greedy, np_decode, onnx_suppresses, random_boxes,
                                     random_scores, trt_suppresses)

F32 = np.float32


def assert_rows(got, want):
    chex.assert_trees_all_equal(np.asarray(got, np.int64), np.asarray(want, np.int64))


@pytest.mark.parametrize("band,inclusive,t,groups", [
    (1, False, 0.45, 4),    # every diagonal past the first computed in the walk
    (2, True, 0.0, 3),      # TensorRT's IoU >= 0: one finite box per group
    (8, False, 0.45, 1),    # one group over five blocks: the whole triangle
])
def test_bitmask_walk_matches_sequential_greedy(band, inclusive, t, groups):
    rng = np.random.default_rng(band * 10 + groups)
    p, k = 5, 300
    boxes = random_boxes(rng, (p, k), jitter=0.3)
    nvalid = np.array([k, 0, 1, 65, 230])       # full, empty, one, block edges
    valid = np.arange(k)[None] < nvalid[:, None]
    g = np.sort(rng.integers(0, groups, (p, k)), axis=1)
    g = np.where(valid, g, np.iinfo(np.int32).max).astype(np.int32)
    run = jax.jit(lambda b, v, g, t: bitmask_nms(decode_boxes(b), v, g, t, inclusive=inclusive,
                                                 band=band))
    keep = np.asarray(run(boxes, valid, g, t))
    suppress = functools.partial(trt_suppresses if inclusive else onnx_suppresses, t=t)
    for i in range(p):
        want = greedy(np_decode(boxes[i]), np.flatnonzero(valid[i]), k, suppress, g[i])
        assert_rows(np.flatnonzero(keep[i]), want)
    assert keep[0].sum() > (64 if t else groups - 1) and not keep[1].any()  # several blocks


def test_bitmask_threshold_is_an_operand():
    rng = np.random.default_rng(3)
    boxes = jax.jit(decode_boxes)(random_boxes(rng, (2, 70)))
    valid, g = jnp.ones((2, 70), bool), jnp.zeros((2, 70), jnp.int32)
    run = jax.jit(bitmask_nms)
    counts = [int(run(boxes, valid, g, jnp.float32(t)).sum()) for t in (0.1, 0.5, 0.9)]
    assert counts[0] < counts[1] < counts[2]
    assert run._cache_size() == 1  # one compile for three thresholds


def _np_priority(keys, valid):
    return np.lexsort((np.arange(keys.shape[-1]), -keys.astype(np.float64), ~valid))


@pytest.mark.parametrize("k", [300, 40000])  # radix sorts of packed keys; stable sort
def test_priority_and_group_orders(k):
    rng = np.random.default_rng(k)
    scores = random_scores(rng, (2, k), levels=7)
    scores[rng.random((2, k)) < 0.1] = -0.0
    scores[:, :3] = [np.inf, -np.inf, 0.0]
    valid = rng.random((2, k)) < 0.9
    groups = rng.choice(np.array([-5, 0, 3, 2**30]), (2, k)).astype(np.int32)

    @jax.jit  # one program (eagerly each operation inside is lowered on its own)
    def run(scores, valid, groups):
        cands = Candidates(jnp.broadcast_to(jnp.arange(k), (2, k)), valid,
                           jnp.zeros(2, jnp.int32), jnp.zeros(2, jnp.int32))
        return orders(priority_keys(scores), cands, groups)

    order = run(scores, valid, groups)
    s = np.where(scores == 0, 0, scores)  # -0.0 ties +0.0
    for i in range(2):
        nv = int(valid[i].sum())
        want = _np_priority(s[i], valid[i])
        assert_rows(np.asarray(order.by_priority[i])[:nv], want[:nv])
        ranks = np.asarray(order.by_group[i])
        g = np.where(valid[i], groups[i], np.iinfo(np.int32).max)[want]
        assert_rows(ranks, np.lexsort((np.arange(k), g)))  # by group, then rank


def test_candidate_cut_keeps_the_best_by_score():
    rng = np.random.default_rng(1)
    scores = random_scores(rng, (3, 500), levels=40)
    passing = scores > 0.3
    passing[2] = False
    c = jax.jit(lambda s, p: select(lambda: priority_keys(s), p, 64))(scores, passing)
    for i in range(3):
        want = np.sort(_np_priority(scores[i], passing[i])[:min(64, passing[i].sum())])
        got = np.asarray(c.flat[i])[np.asarray(c.valid[i])]
        assert_rows(got, want)
        assert int(c.cut[i]) == max(int(passing[i].sum()) - 64, 0)
    assert int(c.cut[0]) > 0


@pytest.mark.parametrize("max_detections", [None, 12])
def test_first_pass_result_or_full_walk_equals_the_reference(max_detections):
    """The first pass (the best FIRST_PASS x the result's size candidates) stands where it
    proves itself (image 0: scattered boxes fill their classes early) and the full walk
    runs where it cannot (image 1: one box per class repeated, so each class keeps one box
    and has candidates past the pass)."""
    from tests.helpers.cases.nms import ref_non_max_suppression

    import jaxops

    rng = np.random.default_rng(12)
    boxes = random_boxes(rng, (2, 500), extent=400.0, jitter=0.05)
    boxes[1] = np.tile(boxes[1, :1], (500, 1))
    scores = random_scores(rng, (2, 4, 500))
    got = jaxops.non_max_suppression(boxes, scores, 5, 0.5, max_detections=max_detections,
                                     backend="xla")
    want = ref_non_max_suppression(boxes, scores, 5, 0.5, max_detections=max_detections)
    assert_rows(jaxops.refresh(got), want)
    assert np.bincount(want[:, 0]).tolist() == [max_detections or 20, 4]
