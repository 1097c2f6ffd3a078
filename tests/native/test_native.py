"""The native (C++ XLA FFI) kernels: chosen automatically (so tests/ops/test_op_matrix.py
runs on them), and native == xla bit for bit (data, padding, actual and true shapes) on random and edge-case inputs.

Skipped as a whole, with the reason, where the native library is not built or is disabled
(``JAXOPS_NATIVE=0``); the operator matrix itself then runs on the xla kernels.
"""

import functools
import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxops
from jaxops import native
from jaxops.backends import explain, use_backend
from jaxops.core.errors import BackendUnavailableError
from tests.ops import test_op_matrix as matrix
from tests.helpers import native_sweep as sweep
from tests.helpers.cases.nms import ref_non_max_suppression
from tests.helpers.util import expected_truncation, seed_of

pytestmark = pytest.mark.skipif(not native.available(),
                                reason=f"native kernels unavailable: {native.why_unavailable()}")

NATIVE_CASES = [c for c in matrix.CASES if jaxops.get_op(c.op).has_kernel("native")]


def test_op_matrix_runs_on_native_by_default():
    """Every operator with a native kernel picks it automatically (and under
    ``use_backend("native")``), so tests/ops/test_op_matrix.py's eager, jit, vmap and grad
    rows run these operators on their native kernels: a copy of those rows here, with native
    forced, traced and checked the same programs a second time (and, like them, would fall
    back per operator where the kernel declines), so it was dropped (issue 36)."""
    assert NATIVE_CASES
    for op in sorted({c.op for c in NATIVE_CASES}):
        assert explain(op).backend == "native", str(explain(op))
        with use_backend("native"):
            assert explain(op).backend == "native"


def _same(fn, *args, **kwargs):
    """``fn(..., backend=b)`` gives identical pytrees (every leaf, bit for bit) for native
    and xla (an OpDef call runs its kernel jitted)."""
    chex.assert_trees_all_equal(fn(*args, backend="native", **kwargs),
                                fn(*args, backend="xla", **kwargs))


SUBNORMAL = {np.float32: 1e-45, np.float16: 6e-8, jnp.bfloat16: 9.2e-41}


def _nonzero_inputs(rng):
    """(input, capacities to try); each distinct shape, dtype and capacity compiles once
    per backend, so the edge cases share inputs where they can (the long inputs:
    ``test_nonzero_of_long_inputs_native_equals_numpy``)."""
    special = [0.0, -0.0, np.nan, np.inf, -np.inf, 1.0]
    for dt, tiny in SUBNORMAL.items():  # NaN, -0.0, subnormals (non-zero: decided on bits)
        yield np.array(special + [tiny, -tiny], dt), [None]
    yield np.array([0, 1e-45, 1e-45j, np.nan, -0.0, 2j], np.complex64), [None]
    yield np.zeros((3, 0, 2), np.int32), [None, 0]                # empty
    yield np.ones((5, 7), bool), [None, 35]                       # all selected
    yield np.asarray(3, np.int8), [None]                          # 0-d
    yield rng.random(40_000) < 0.1, [None, 3000]                  # xla's blocked path
    yield rng.integers(-2, 3, (2, 3, 4, 5)).astype(np.int64), [None, 0, 1, 40, 200]


def test_nonzero_native_equals_xla():
    """The ONNX layout against xla (bit for bit, padding and shapes), the transposed one
    against numpy (the count, the coordinates, the padding)."""
    rng = np.random.default_rng(0)
    for x, sizes in _nonzero_inputs(rng):
        for size in sizes:
            _same(functools.partial(jaxops.get_op("NonZero"), size=size), x)
            found = x.ndim and sweep.nonzero_mismatch(x, "native", layout="argwhere", size=size)
            assert not found, found


def test_nonzero_of_long_inputs_native_equals_numpy():
    """Long enough to be split among XLA's threads (2 x 2**18 elements): capacities cut in
    the first thread's stretch and in the second's; a mask, floats, two dimensions; both
    layouts, against numpy (the count, the kept coordinates and the padding)."""
    rng = np.random.default_rng(0)
    floats = np.where(rng.random(600_001) < 0.5, rng.standard_normal(600_001), 0)
    cases = [(rng.random(40_000) < 0.1, [None, 3000]),
             (rng.random(600_001) < 0.1, [None, 20_000, 45_000]),
             (floats.astype(np.float32), [None, 200_000]),
             (rng.random((600, 1001)) < 0.05, [None, 20_000])]
    for x, sizes in cases:
        for size in sizes:
            for layout in ("onnx", "argwhere"):
                found = sweep.nonzero_mismatch(x, "native", layout=layout, size=size)
                assert not found, found


def test_masked_select_native_equals_xla():
    rng = np.random.default_rng(1)
    cases = [  # (x, mask, capacities)
        (rng.standard_normal((6, 5)).astype(np.float32), rng.random((6, 5)) < 0.3, [None, 0, 3, 40]),
        (rng.standard_normal((6, 5)).astype(jnp.bfloat16), rng.random((5,)) < 0.5, [None]),
        (rng.integers(0, 9, (4, 1, 3)).astype(np.int8), (rng.random((5, 3)) < 0.5).astype(np.uint8), [None]),
        (np.array([1 + 2j, 3j, 0], np.complex64), np.array([True, False, True]), [None]),
        (np.zeros((0, 3), np.float32), np.zeros((0, 3), bool), [None]),       # empty
        (np.ones((4, 4), bool), np.ones((4, 4), bool), [None]),               # all selected
        (np.array([1e-45, -1e-45, -0.0, np.nan], np.float32), np.ones(4, np.uint8), [None]),
        (np.array([6e-8, -6e-8, -0.0, 1], np.float16), np.array([1, 0, 2, 1], np.uint8), [None]),
    ]
    op = jaxops.get_op("MaskedSelect")
    for x, mask, sizes in cases:
        for size in sizes:
            _same(functools.partial(op, size=size), x, mask)
    # long inputs, split among XLA's threads, capacities cut in either thread's stretch:
    # against numpy (the count, the kept elements bit for bit, the padding)
    for n, sizes in [(40_000, [3000]), (600_001, [None, 20_000, 45_000])]:
        x, mask = rng.standard_normal(n).astype(np.float32), rng.random(n) < 0.1
        for size in sizes:
            found = sweep.masked_select_mismatch(x, mask, "native", size=size)
            assert not found, found


def test_masked_select_native_grad_and_vmap_equal_xla():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 8, 5)).astype(np.float32)
    mask = rng.random((3, 8, 5)) < 0.4

    def loss(backend):
        def f(x):
            d = jaxops.masked_select(x, mask[0], size=20, overflow="truncate", backend=backend)
            return jnp.sum(d.data * jnp.arange(20.0))
        return f
    chex.assert_trees_all_equal(jax.grad(loss("native"))(x[0]), jax.grad(loss("xla"))(x[0]))
    batched = {b: jax.jit(jax.vmap(lambda x, m, b=b: jaxops.masked_select(x, m, size=30, backend=b)))
               for b in ("native", "xla")}
    chex.assert_trees_all_equal(batched["native"](x, mask), batched["xla"](x, mask))


def _boxes(rng, n, b=1, kind="uniform"):
    centre = rng.uniform(0, 100, (b, n, 2))
    half = rng.uniform(1, 20, (b, n, 2))
    boxes = np.concatenate([centre - half, centre + half], -1)
    if kind == "clustered":  # many identical and near-identical boxes
        boxes = boxes[:, rng.integers(0, max(n // 8, 1), n)]
        boxes[:, : n // 2] += rng.normal(0, 0.5, (b, n // 2, 4))
    if kind == "flipped":  # corners in any order, zero-area and NaN boxes
        boxes = np.where(rng.random((b, n, 1)) < 0.5, boxes[..., [2, 3, 0, 1]], boxes)
        boxes[:, ::7, 2] = boxes[:, ::7, 0]
        boxes[:, 3::11, 1] = np.nan
    return boxes.astype(np.float32)


def _scores(rng, shape, kind="uniform"):
    s = rng.random(shape).astype(np.float32)
    if kind == "ties":   # few distinct values, +0.0 / -0.0, NaN, -inf
        s = np.round(s * 4) / 4
        s.flat[::5] = -0.0
        s.flat[1::9] = np.nan
        s.flat[2::13] = -np.inf
        s.flat[3::17] = 1e-45  # a denormal: XLA:CPU reads it as 0
    return s


NMS_CONFIGS = [  # (attrs, impl mode)
    (dict(max_output_boxes_per_class=5, iou_threshold=0.5), "high_performance"),
    (dict(max_output_boxes_per_class=200, iou_threshold=0.3, score_threshold=0.2), None),
    (dict(max_output_boxes_per_class=1, iou_threshold=0.0, center_point_box=1), None),
    (dict(max_output_boxes_per_class=10, iou_threshold=0.5, size=7), None),  # overflow
]
BOX_KINDS = ("uniform", "clustered", "flipped")


def test_onnx_nms_native_equals_xla():
    """Random, clustered (ties of boxes) and odd boxes (flipped, zero-area, NaN), scores
    with ties, +0.0 / -0.0, NaN, -inf and denormals: the same compiled kernels serve all."""
    rng = np.random.default_rng(3)
    op = jaxops.get_op("NonMaxSuppression")
    for attrs, mode in NMS_CONFIGS:
        for kind in BOX_KINDS:
            for score_kind in ("uniform", "ties"):
                _same(functools.partial(op, impl_mode=mode, **attrs), _boxes(rng, 64, 2, kind),
                      _scores(rng, (2, 3, 64), score_kind))
    for (b, c, n), attrs in [((1, 2, 1), NMS_CONFIGS[1][0]), ((2, 1, 0), NMS_CONFIGS[0][0]),
                             ((1, 1, 8), dict(max_output_boxes_per_class=0))]:  # 0 selects none
        _same(functools.partial(op, **attrs), _boxes(rng, n, b), _scores(rng, (b, c, n), "ties"))


def test_onnx_nms_many_boxes_native_equals_numpy():
    """Enough boxes that the native kernel ranks its candidates from a sample of the scores,
    a block at a time: clustered boxes suppress most candidates, so the first block runs
    out and later ones follow; tied scores put equal keys on the block bounds. Against the
    numpy reference (the kept rows; the padding and shapes are compared with xla above)."""
    rng = np.random.default_rng(6)
    boxes = _boxes(rng, 3000, 1, "clustered")
    for score_kind in ("uniform", "ties"):
        scores = _scores(rng, (1, 2, 3000), score_kind)
        # a score threshold: the candidates are gathered in element order and ordered by a
        # radix sort (over 1,000 of them: wide digits; a few hundred: 8-bit digits)
        for limit, iou, st in [(20, 0.3, None), (700, 0.5, None), (3000, 0.5, 0.1),
                               (3000, 0.5, 0.9)]:
            got = jaxops.non_max_suppression(boxes, scores, limit, iou, st, backend="native")
            want = ref_non_max_suppression(boxes, scores, limit, iou, st)
            np.testing.assert_array_equal(np.asarray(jaxops.refresh(got), np.int64), want,
                                          err_msg=f"{score_kind=} {limit=} {iou=} {st=}")


def test_batched_nms_native_equals_xla():
    rng = np.random.default_rng(5)
    op = jaxops.get_op("BatchedNMS")
    for limit, st, mode in [(None, None, None), (3, 0.3, "high_performance")]:
        for kind in BOX_KINDS:
            for score_kind in ("uniform", "ties"):
                idxs = rng.integers(0, 5, 200).astype(np.int32)
                _same(functools.partial(op, iou_threshold=0.5, max_output_size=limit,
                                        score_threshold=st, impl_mode=mode),
                      _boxes(rng, 200, 1, kind)[0], _scores(rng, (200,), score_kind), idxs)
    for n, limit in [(1, None), (0, None), (10, 0)]:
        _same(functools.partial(op, iou_threshold=0.5, max_output_size=limit),
              _boxes(rng, n)[0], _scores(rng, (n,)), np.zeros(n, np.int32))


DETECTION_CONFIGS = [  # the per-image cap and the candidate cut (issue 29)
    dict(max_output_boxes_per_class=8, iou_threshold=0.45, score_threshold=0.2, max_detections=6),
    dict(max_output_boxes_per_class=20, iou_threshold=0.6, pre_nms_top_k=25),
    dict(max_output_boxes_per_class=5, iou_threshold=0.5, max_detections=7, pre_nms_top_k=17,
         size=9),
]


def test_onnx_nms_cap_and_cut_native_equal_xla():
    """max_detections and pre_nms_top_k (and the true shape that reports the cut) decided
    alike, on tied scores where the cut lands inside a tie: high-performance mode against
    xla, the default mode against numpy."""
    rng = np.random.default_rng(7)
    op = jaxops.get_op("NonMaxSuppression")
    for attrs in DETECTION_CONFIGS:
        for kind in BOX_KINDS:
            boxes, scores = _boxes(rng, 40, 3, kind), _scores(rng, (3, 4, 40), "ties")
            _same(functools.partial(op, impl_mode="high_performance", **attrs), boxes, scores)
            with expected_truncation():  # (against xla: test_onnx_nms_native_equals_xla)
                got = jaxops.non_max_suppression(boxes, scores, backend="native",
                                                 overflow="truncate", **attrs)
            np.testing.assert_array_equal(  # the true shape reports the cut: truncated
                np.asarray(jaxops.refresh(got, allow_truncated=True), np.int64),
                ref_non_max_suppression(boxes, scores, **attrs))


def test_batched_nms_cut_native_equals_xla():
    rng = np.random.default_rng(8)
    op = jaxops.get_op("BatchedNMS")
    for limit, top_k in [(None, 30), (9, 12), (40, 200)]:
        idxs = rng.choice(np.array([-7, 0, 3, 2**30], np.int32), 120)  # any int32 ids
        _same(functools.partial(op, iou_threshold=0.5, max_output_size=limit,
                                score_threshold=0.1, pre_nms_top_k=top_k),
              _boxes(rng, 120, 1, "clustered")[0], _scores(rng, (120,), "ties"), idxs)


@pytest.mark.parametrize("attrs", [
    dict(max_output_boxes=10, iou_threshold=0.45, score_threshold=0.2),
    dict(max_output_boxes=6, iou_threshold=0.0, score_threshold=0.0, class_agnostic=True),
    dict(max_output_boxes=12, iou_threshold=0.5, score_threshold=0.1, box_coding=1,
         pre_nms_top_k=20),
])
def test_efficient_nms_native_equals_xla(attrs):
    """TensorRT's IoU (>= t, its corner swap, NaN edges) and pre-NMS top-k, per-class and
    shared boxes, float32 and float16 boxes (corners returned in the boxes' dtype)."""
    rng = np.random.default_rng(9)
    op = jaxops.get_op("EfficientNMS")
    for kind in BOX_KINDS:
        boxes = _boxes(rng, 30, 2, kind)
        scores = _scores(rng, (2, 30, 3), "ties")
        _same(functools.partial(op, **attrs), boxes, scores)
        _same(functools.partial(op, **attrs), np.repeat(boxes[:, :, None], 3, axis=2)
              .astype(np.float16), scores)
    if "box_coding" in attrs:  # x64 once: float64 boxes and scores
        with jax.enable_x64(True):
            _same(functools.partial(op, **attrs), _boxes(rng, 30, 2).astype(np.float64),
                  _scores(rng, (2, 30, 3), "ties").astype(np.float64))


def test_traced_thresholds_native_equal_xla_under_vmap():
    """Thresholds as operands, one per vmap example."""
    rng = np.random.default_rng(10)
    boxes = np.stack([_boxes(rng, 40, 2, "clustered") for _ in range(3)])
    scores = np.stack([_scores(rng, (2, 2, 40), "ties") for _ in range(3)])
    ious, sts = np.array([0.2, 0.5, 0.8], np.float32), np.array([0.1, 0.3, 0.0], np.float32)

    def run(backend):
        return jax.jit(jax.vmap(lambda b, s, t, st: (
            jaxops.non_max_suppression(b, s, 10, t, st, max_detections=12, backend=backend),
            jaxops.batched_nms(b[0], s[0, 0], jnp.arange(40) % 3, t, score_threshold=st,
                               backend=backend),
            jaxops.efficient_nms(b, s.transpose(0, 2, 1), max_output_boxes=8, iou_threshold=t,
                                 score_threshold=st, backend=backend))))(boxes, scores, ious, sts)
    chex.assert_trees_all_equal(run("native"), run("xla"))


# Disjoint boxes scored with zeros, subnormals (1 and 2 units of the last place) and NaN,
# and the kept boxes (best first) for each score threshold, decided on the values: a
# subnormal is above zero, -0.0 == 0.0 (ties to the lower index), NaN is never a candidate
# (a NaN threshold is refused). (The high-performance ranking ignores the scores' low bits,
# so there only native == xla is checked.)
TINY_SCORES = np.array([0, 1, 0x80000001, 0x80000000, 2, 0x7fc00000], np.uint32).view(np.float32)
TINY_KEPT = {None: [4, 1, 0, 3, 2], 0.0: [4, 1], -0.0: [4, 1], 1e-45: [4], 2e-45: [4],
             -1e-45: [4, 1, 0, 3], 3e-45: []}


@pytest.mark.parametrize("mode", [None, "high_performance"])
def test_nms_subnormal_scores_and_thresholds_native_equal_xla(mode):
    boxes = np.array([[3 * i, 0, 3 * i + 2, 2] for i in range(6)], np.float32)
    onnx, batched = jaxops.get_op("NonMaxSuppression"), jaxops.get_op("BatchedNMS")
    def run(st, backend, which):
        if which == "batched":
            return batched(boxes, TINY_SCORES, np.zeros(6, np.int32), iou_threshold=0.5,
                           max_output_size=None, score_threshold=st, impl_mode=mode,
                           backend=backend)
        return onnx(boxes[None], TINY_SCORES[None, None], max_output_boxes_per_class=6,
                    iou_threshold=0.5, score_threshold=st, impl_mode=mode, backend=backend)

    for st, want in TINY_KEPT.items():  # each threshold compiles: xla at three, but the
        compared = st in (None, 1e-45, -1e-45)  # default mode's batched call at every one
        for which in ("batched", "onnx") if mode is None or compared else ():
            got = run(st, "native", which)
            if mode is None:
                kept = jaxops.refresh(got[0])
                assert (kept if which == "batched" else kept[:, 2]).tolist() == want, (st, which)
            if compared or which == "batched":
                xla = run(st, "xla", which)
                assert compared or jaxops.refresh(xla[0]).tolist() == want, st
                chex.assert_trees_all_equal(got, xla)  # bit for bit: padding and shapes too
    # Overlapping boxes: the subnormal score outranks the zeros and suppresses them; with a
    # capacity below the kept count, the subnormal row is the best one kept.
    same_box = np.tile(np.array([[0, 0, 4, 4], [10, 0, 14, 4]], np.float32), (3, 1))
    _same(functools.partial(onnx, max_output_boxes_per_class=3, iou_threshold=0.5, size=1,
                            impl_mode=mode),
          np.stack([same_box, same_box[::-1]]), np.stack([TINY_SCORES, TINY_SCORES[::-1]])[:, None])


def test_onnx_nms_native_vmap_and_grad_equal_xla():
    rng = np.random.default_rng(4)
    boxes = np.stack([_boxes(rng, 50, 2, "clustered") for _ in range(3)])
    scores = np.stack([_scores(rng, (2, 2, 50), "ties") for _ in range(3)])
    f = {b: jax.jit(jax.vmap(lambda x, s, b=b: jaxops.non_max_suppression(
        x, s, 10, 0.4, size=12, backend=b))) for b in ("native", "xla")}
    chex.assert_trees_all_equal(f["native"](boxes, scores), f["xla"](boxes, scores))
    g = {b: jax.grad(lambda s, b=b: jnp.sum(jaxops.non_max_suppression(
        boxes[0], s, 5, 0.5, backend=b).data * s.sum())) for b in ("native", "xla")}
    chex.assert_trees_all_equal(g["native"](scores[0]), g["xla"](scores[0]))


# Bit patterns (float32) where the key order and equality matter: -0.0 before +0.0 and the
# reverse (the first occurrence is returned), NaNs of both signs and other payloads (one
# value), subnormals of both signs (values, not zero), the infinities.
UNIQUE_EDGES = np.array([0x80000000, 0x7fc00000, 0, 0xffc00001, 1, 0x80000001, 0x7f800000,
                         0xff800000, 0x7f800001, 1, 0x80000000, 0x3f800000], np.uint32)


def _unique_right(x, sizes=(None, 3), equal_nan=True, xla=False):
    """Every output (y, indices, inverse, counts) of the native kernel, sorted or not, at
    each capacity, against numpy (values bit for bit: equal as values is not enough, -0.0
    == 0.0, NaN payloads; the padding; the true count); ``xla``: also equal to the xla
    kernel's, bit for bit. Sorted, y alone (the values-only kernel) too."""
    op = functools.partial(jaxops.get_op("Unique"), equal_nan=equal_nan)
    for size in sizes:
        for sorted_ in (True, False):
            found = sweep.unique_all_mismatch(x, "native", size=size, sorted=sorted_,
                                              equal_nan=equal_nan)
            assert not found, found
            if xla:
                _same(functools.partial(op, size=size, sorted=sorted_), x)
        got = _unique_y(x, size, equal_nan, "native")
        if _lowered_once(x, size, equal_nan):
            assert "jaxops_unique_values" in _unique_y.lower(
                x, size, equal_nan, "native").as_text()  # one kernel
            every = _unique_every.lower(x, size, equal_nan).as_text()
            assert every.count("custom_call @jaxops_unique") == 1, "one kernel for every output"
        count = sweep.np_unique(x, equal_nan=equal_nan)[0].size
        found = sweep.dyn_mismatch("y alone", got, sweep.np_unique(
            x, size=size, equal_nan=equal_nan)[0], 0, count)
        assert not found, found
        if xla:
            chex.assert_trees_all_equal(got, _unique_y(x, size, equal_nan, "xla"))


# Module-level jits: jax keeps their traces per shape, dtype and static arguments, so
# _unique_right's calls on inputs of one shape (edges and their reverse) trace them once.
_unique_y = jax.jit(lambda v, size, equal_nan, backend: jaxops.get_op("Unique")(
    v, size=size, equal_nan=equal_nan, backend=backend)[0], static_argnums=(1, 2, 3))
_unique_every = jax.jit(lambda v, size, equal_nan: jaxops.get_op("Unique")(
    v, size=size, equal_nan=equal_nan, backend="native"), static_argnums=(1, 2))
_LOWERED = set()


def _lowered_once(x, size, equal_nan) -> bool:
    """True the first time for a shape, dtype, capacity and equal_nan (with x64 on or off):
    the programs' text depends on nothing else."""
    key = (x.shape, x.dtype.str, size, equal_nan, jax.config.jax_enable_x64)
    new = key not in _LOWERED
    _LOWERED.add(key)
    return new


def test_unique_float_native_equals_xla():
    """The edge bit patterns against xla, bit for bit; every case against numpy."""
    rng = np.random.default_rng(7)
    edges = UNIQUE_EDGES.view(np.float32)
    _unique_right(edges, xla=True)
    op = jaxops.get_op("Unique")
    _same(functools.partial(op, size=0), edges)  # no room: only the count and the inverse
    _same(op, np.zeros(0, np.float32))
    _unique_right(edges[::-1].copy())  # +0.0 now before -0.0
    for dt in (np.float16, jnp.bfloat16):  # 16-bit keys: the same order and equality
        with np.errstate(invalid="ignore"):  # the NaN payloads do not survive the cast
            _unique_right(np.asarray(np.concatenate([edges, [6e-8, -6e-8, 9.2e-41]]), dt),
                          sizes=(None,))
    ties = rng.standard_normal(3000).astype(np.float32).round(1)  # about 70 values, repeated
    ties[::7] = -0.0
    ties[3::11] = np.nan
    _unique_right(ties, sizes=(None, 10))
    # keys that differ in one byte only: the radix sort skips the other three digits and
    # its result ends in the scratch buffer, not in y
    _unique_right(np.array([1.0, 1.5, 1.25, 1.0, 1.75], np.float32), sizes=(None,))
    # equal_nan=False: each NaN a value, in order of position; the capacity cuts among them
    _unique_right(edges, sizes=(None, 9), equal_nan=False, xla=True)
    _unique_right(ties[:200], sizes=(None,), equal_nan=False)
    _unique_right(rng.standard_normal(3000).astype(np.float32), sizes=(None,))


def test_unique_of_large_inputs_equals_numpy():
    """Inputs long enough for the native sort and its de-duplication to be split among
    XLA's intra-op threads (from 2 x 32768 elements), with the sorted keys ending in the
    scratch buffer (three scattering passes) or in y itself (positive integers: the lowest
    digit is the same everywhere, that pass is skipped; the de-duplication then overwrites
    the keys it reads, on one thread); zeros of both signs, NaNs, capacities that cut."""
    rng = np.random.default_rng(seed_of("unique", "large"))
    n = 70_001
    spread = rng.standard_normal(n).astype(np.float32)
    integers = rng.integers(1, 6000, n).astype(np.float32)  # low 11 key bits all zero
    ties = spread.round(2)
    ties[::13] = -0.0
    ties[5::17] = np.nan
    ties[7::19] = UNIQUE_EDGES.view(np.float32)[3]  # a NaN of another sign and payload
    for x in (spread, integers, ties):
        _unique_right(x, sizes=(None, 1000))
    _unique_right(ties, sizes=(None,), equal_nan=False)


def test_scratch_is_kept_between_calls_and_released():
    """Scratch blocks of 1 MB or more stay with the library between calls (no fresh pages
    to fault in) and release_scratch gives them back; a kept block holds the last call's
    data, which the next call must not read: unique of another input of the same size,
    through the same blocks, still equals numpy."""
    rng = np.random.default_rng(seed_of("unique", "scratch"))
    a, b = (rng.standard_normal(300_000).astype(np.float32) for _ in range(2))
    unique = jax.jit(lambda v: jaxops.unique(v, return_counts=True, backend="native"))
    native.release_scratch()
    jax.block_until_ready(unique(a))
    kept = native.release_scratch()
    assert kept >= 2 * a.size * 8, kept  # at least the sort's two buffers of (key, index)
    assert native.release_scratch() == 0
    for x in (a, b, a):
        y, counts = unique(x)
        want = sweep.np_unique(x)
        for name, got, ref in (("y", y, want[0]), ("counts", counts, want[3])):
            found = sweep.dyn_mismatch(name, got, ref, 0, want[0].size)
            assert not found, found
    assert native.release_scratch() > 0


def test_unique_native_vmap_equals_xla():
    x = np.random.default_rng(8).standard_normal((3, 50)).astype(np.float32).round(0)
    f = {b: jax.jit(jax.vmap(lambda v, b=b: jaxops.unique(
        v, size=8, return_index=True, return_inverse=True, return_counts=True, backend=b)))
        for b in ("native", "xla")}
    chex.assert_trees_all_equal(f["native"](x), f["xla"](x))
    x[1, ::7] = np.nan  # y alone (the values-only kernel, batched), NaNs distinct
    y = {b: jax.jit(jax.vmap(lambda v, b=b: jaxops.unique(v, size=8, equal_nan=False, backend=b)))
         for b in ("native", "xla")}
    assert "jaxops_unique_values" in y["native"].lower(x).as_text()
    chex.assert_trees_all_equal(y["native"](x), y["xla"](x))


def test_native_x64_equals_xla():
    """float64 boxes and int64 indices (x64 on): same results as the xla kernels."""
    with jax.enable_x64(True):
        rng = np.random.default_rng(6)
        boxes, scores = _boxes(rng, 80, 2).astype(np.float64), _scores(rng, (2, 2, 80), "ties")
        _same(functools.partial(jaxops.get_op("NonMaxSuppression"), max_output_boxes_per_class=9,
                                iou_threshold=0.5, size=10), boxes, scores.astype(np.float64))
        nonzero = functools.partial(jaxops.get_op("NonZero"), size=None, transpose=False)
        for x in [np.array([0, 5e-324, -5e-324, -0.0, 1.0, np.nan]),
                  np.array([0, 5e-324, 5e-324j, -0.0, np.nan, 2j], np.complex128)]:
            _same(nonzero, x)
            _same(jaxops.flatnonzero, x)
        tiny = np.array([0.0, 5e-324, -5e-324, -0.0, 1e-323, np.nan])  # disjoint boxes
        _unique_right(np.concatenate([tiny, -tiny, [np.inf, -np.inf, 1e-323]]), xla=True)
        boxes = np.array([[3 * i, 0, 3 * i + 2, 2] for i in range(6)], np.float64)
        for st in [None, 0.0, 5e-324, -5e-324]:
            _same(functools.partial(jaxops.get_op("BatchedNMS"), iou_threshold=0.5,
                                    max_output_size=None, score_threshold=st),
                  boxes, tiny, np.zeros(6, np.int32))


F32 = np.array([1.0, np.nan, -0.0, 1.0], np.float32)
SERVED = [  # (op, inputs, attrs, whether the native kernel serves the call)
    ("Unique", [F32], {}, True),
    ("Unique", [F32.astype(np.float16)], {"sorted": False, "size": 0}, True),
    ("Unique", [np.zeros(0, np.float32)], {}, True),
    ("Unique", [F32.reshape(2, 2)], {"axis": 0}, False),
    ("Unique", [F32], {"equal_nan": False}, True),
    ("Unique", [np.arange(4)], {}, False),
    ("NonZero", [F32], {}, True),
    ("MaskedSelect", [F32, F32 > 0], {}, True),
]


@pytest.mark.parametrize("op, inputs, attrs, serves", SERVED, ids=lambda v: repr(v)[:40])
def test_explain_names_native_exactly_where_its_kernel_runs(op, inputs, attrs, serves):
    """explain() asks the kernel up front: it names native iff the traced call holds a
    native FFI call, and a declined call says why (backend="native" raises with it)."""
    op = jaxops.get_op(op)
    s = explain(op, inputs=inputs, attrs=attrs)
    hlo = jax.jit(lambda *a: op(*a, **attrs)).lower(*inputs).as_text()  # lowered, not compiled
    assert (s.backend == "native") == serves == ("custom_call @jaxops_" in hlo), str(s)
    if not serves:
        why = dict(s.passed_over)["native"]
        with pytest.raises(BackendUnavailableError, match=re.escape(why)):
            op(*inputs, backend="native", **attrs)


def test_disabled_by_env_var_falls_back_to_xla_and_says_why(monkeypatch):
    """JAXOPS_NATIVE=0 is read on every selection (jaxops.native.status), so setting it in
    this process is the same as starting one with it (no new Python needed: .ci/run runs
    the operator matrix in processes started with it)."""
    monkeypatch.setenv(native.ENV_VAR, "0")
    s = explain("NonZero")
    assert (s.backend, native.available()) == ("xla", False), str(s)
    assert "JAXOPS_NATIVE=0" in str(s), str(s)
    monkeypatch.delenv(native.ENV_VAR)
    assert explain("NonZero").backend == "native"
