"""The capacity ladder (``jaxops/ops/ladder.py``, issue 38): the NMS operators' xla kernels
run at the smallest tier that holds the candidates, with the outputs they have at full
capacity (bit for bit: data, padding, actual and true shapes), on x64 off and on, under
``vmap``, and one compile per input shape whatever tier the data pick.

The oracle tests (``tests/test_nms*.py``, ``test_detection.py``, ``test_native.py``, the op
matrix) run under ``JAXOPS_TEST_LADDER=fine`` (tiers from 4 slots) and ``=off`` too; here
the two are compared with each other directly.
"""

import contextlib
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxops
from jaxops import DynArray, native
from jaxops.ops import ladder
from tests.helpers.cases.nms import random_boxes, random_scores, ref_non_max_suppression
from tests.helpers.util import CompileCounter, expected_truncation, seed_of

FINE = {"smallest": 4, "factor": 4}  # tiers 4, 16, 64, ...: small inputs climb several
OFF = {"enabled": False}


NMS_OPS = ("NonMaxSuppression", "BatchedNMS", "EfficientNMS")


@contextlib.contextmanager
def _fresh_traces():
    """The NMS operators' kernels traced afresh on every call, inside the caller's jit (an
    eager OpDef call jits its kernel, and jax keeps that trace, with the ladder it was
    traced with, for the next call): cheaper than ``jax.clear_caches()``, which throws
    away every compiled program of the process."""
    ops = [jaxops.get_op(name) for name in NMS_OPS]
    saved = [op.jit_kernels for op in ops]
    for op in ops:
        op.jit_kernels = False
    try:
        yield
    finally:
        for op, was in zip(ops, saved):
            op.jit_kernels = was


def _traced_under(settings: dict, fn, *args):
    """``fn(*args)`` jitted and traced afresh under the ladder ``settings`` (a kernel traced
    before keeps the ladder it was traced with), fetched to numpy."""
    with _fresh_traces(), ladder.settings(**settings):
        return jax.device_get(jax.jit(lambda *a: fn(*a))(*args))  # a new function: a new trace


def _assert_same(got, want):
    """Same pytree of arrays, bit for bit (DynArrays: data, actual and true shapes)."""
    leaf = lambda x: isinstance(x, DynArray)  # noqa: E731
    chex.assert_trees_all_equal(jax.tree.map(lambda x: x, got, is_leaf=leaf),
                                jax.tree.map(lambda x: x, want, is_leaf=leaf))


def _spread_scores(rng, b, c, n):
    """Scores whose images pass the 0.5 threshold in very different numbers (a few, some,
    most), so the images of a batch and the batches of a test pick different tiers."""
    scores = random_scores(rng, (b, c, n), levels=12)
    return scores * np.linspace(0.55, 1.6, b, dtype=np.float32)[:, None, None]


def test_tiers_and_settings():
    # the defaults, whatever JAXOPS_TEST_LADDER set for the session
    with ladder.settings(**ladder.LadderSettings()._asdict()):
        assert ladder.tiers(20000) == (256, 2048, 20000)
        assert ladder.tiers(1024) == (256, 1024) and ladder.tiers(1000) == (1000,)
        with ladder.settings(**OFF):
            assert ladder.tiers(20000) == (20000,)
        with ladder.settings(**FINE):
            assert ladder.tiers(100) == (4, 16, 100) and ladder.tiers(3) == (3,)
        assert ladder.tiers(20000) == (256, 2048, 20000)  # the block restored the ladder


def test_climb_runs_the_smallest_tier_that_holds_the_count_compiled_once():
    f = jax.jit(lambda n: ladder.climb(n, (2, 4, 8), lambda t: jnp.int32(t)))
    counts = [np.int32(n) for n in (0, 2, 3, 4, 5, 8, 9)]
    with CompileCounter() as compiles:
        got = [int(f(n)) for n in counts]
    assert got == [2, 2, 4, 4, 8, 8, 8]  # past the top tier: the top (the capacity)
    assert compiles.count == 1


def test_climb_under_vmap_runs_one_tier_for_the_batch():
    """A batched switch index would run every tier; the batch's largest count picks one."""
    def f(n):
        return ladder.climb(n, (2, 4, 8), lambda t: jnp.int32(t))
    assert jax.jit(jax.vmap(f))(jnp.array([1, 3, 0], jnp.int32)).tolist() == [4, 4, 4]
    assert "cond" in str(jax.make_jaxpr(jax.vmap(f))(jnp.zeros(3, jnp.int32)))


def test_climb_is_differentiable():
    x = jnp.array([3.0, 1.0, 0.0, 0.0])

    def f(x):
        return ladder.climb(jnp.sum(x > 0), (2, 4), lambda t: jnp.sum(x[:t] ** 2))
    assert jax.jit(jax.grad(f))(x).tolist() == [6.0, 2.0, 0.0, 0.0]  # one program


@pytest.mark.parametrize("options, x64", [
    (dict(), False),                  # the plain call, against the numpy reference too
    (dict(max_detections=5), True),   # a per-image cap: the first pass inside a tier; x64
    (dict(pre_nms_top_k=20), False),  # a candidate cut: the top tier
    (dict(size=9), False),            # a row capacity that overflows: the best rows kept
])
def test_onnx_nms_the_same_with_and_without_the_ladder(options, x64):
    rng = np.random.default_rng(seed_of("onnx ladder", x64))
    boxes = random_boxes(rng, (4, 40))
    scores = _spread_scores(rng, 4, 3, 40)
    fn = functools.partial(jaxops.non_max_suppression, max_output_boxes_per_class=30,
                           iou_threshold=0.5, score_threshold=0.5, **options)
    with jax.enable_x64(x64), expected_truncation():
        fine = _traced_under(FINE, functools.partial(fn, backend="xla"), boxes, scores)
        _assert_same(fine, _traced_under(OFF, functools.partial(fn, backend="xla"), boxes,
                                         scores))
        if native.available():  # the native kernel has no ladder: the same rows
            _assert_same(fine, jax.device_get(jax.jit(functools.partial(
                fn, backend="native"))(boxes, scores)))
        if not options:
            want = ref_non_max_suppression(boxes, scores, 30, 0.5, 0.5)
            chex.assert_trees_all_equal(np.asarray(jaxops.refresh(fine), np.int64),
                                        np.asarray(want, np.int64))


def test_batched_and_efficient_nms_the_same_with_and_without_the_ladder():
    x64 = False  # (x64 on: the per-image cap of the ONNX operator above)
    rng = np.random.default_rng(seed_of("batched ladder", x64))
    boxes = random_boxes(rng, (3, 60))
    scores = _spread_scores(rng, 3, 2, 60)
    with jax.enable_x64(x64):
        batched = functools.partial(jaxops.batched_nms, iou_threshold=0.4, score_threshold=0.5,
                                    max_output_size=12, backend="xla")
        ids = jnp.arange(60) % 4
        _assert_same(_traced_under(FINE, batched, boxes[1], scores[1, 0], ids),
                     _traced_under(OFF, batched, boxes[1], scores[1, 0], ids))
        efficient = functools.partial(jaxops.efficient_nms, max_output_boxes=10,
                                      iou_threshold=0.4, score_threshold=0.5, backend="xla")
        flipped = np.swapaxes(scores, 1, 2)
        _assert_same(_traced_under(FINE, efficient, boxes, flipped),
                     _traced_under(OFF, efficient, boxes, flipped))


def test_vmapped_nms_the_same_with_and_without_the_ladder():
    rng = np.random.default_rng(seed_of("vmap ladder"))
    boxes = random_boxes(rng, (3, 1, 40))
    scores = _spread_scores(rng, 3, 2, 40)[:, None]
    fn = jax.vmap(functools.partial(jaxops.non_max_suppression, max_output_boxes_per_class=8,
                                    iou_threshold=0.5, score_threshold=0.5, backend="xla"))
    _assert_same(_traced_under(FINE, fn, boxes, scores), _traced_under(OFF, fn, boxes, scores))


def test_one_compile_per_input_shape_whatever_tier_the_data_pick():
    rng = np.random.default_rng(seed_of("compiles"))
    boxes = random_boxes(rng, (2, 64))
    base = random_scores(rng, (2, 3, 64))
    # tiers 4, 16, 192: counts of 3, 12 and ~100 pick each
    with _fresh_traces(), ladder.settings(**FINE):
        f = jax.jit(functools.partial(jaxops.non_max_suppression, max_output_boxes_per_class=64,
                                      iou_threshold=0.5, score_threshold=0.5, backend="xla"))
        with CompileCounter() as compiles:
            for count in (3, 12, 100):
                scores = np.where(np.arange(192).reshape(1, 3, 64) < count, base + 0.6, base / 3)
                passing = (scores > 0.5).reshape(2, -1).sum(1).max()
                assert passing == count  # the most candidates of an image: this tier's count
                got = jaxops.refresh(f(boxes, scores.astype(np.float32)))
                want = ref_non_max_suppression(boxes, scores, 64, 0.5, 0.5)
                chex.assert_trees_all_equal(np.asarray(got), np.asarray(want))
    assert compiles.count == 1
