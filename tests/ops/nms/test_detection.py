"""Issue 29's detection options against their peers' semantics, on every backend, with
``jax_enable_x64`` off and on: the per-image cap (torchvision ``detections_per_img``,
TensorRT ``keepTopK``), candidate capacities cut by score (TensorRT's pre-NMS top-k) and
reported, traced thresholds (ONNX's tensor inputs) compiled once, and DynArray inputs whose
upstream overflow flows into the result.

References: ``tests/helpers/cases/nms.py`` (numpy, one candidate at a time) and ONNX Runtime itself
where it applies; torchvision itself where it is installed (it is not a test dependency).
"""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxops
from jaxops import DynArray, native
from jaxops.core.errors import OpArgumentError
from tests.helpers.cases.nms import (best_of, random_boxes, random_scores, ref_batched_nms,
                                     ref_efficient_nms, ref_nms, ref_non_max_suppression)
from tests.helpers.util import CompileCounter, expected_truncation, seed_of

BACKENDS = ["xla", "host"] + (["native"] if native.available() else [])
F32 = np.float32


def _runs(*x64_on):
    """(backend, x64): every backend with x64 off, those named with it on (x64 on is
    spread over the tests: each backend meets it at least once)."""
    return [(b, False) for b in BACKENDS] + [(b, True) for b in x64_on if b in BACKENDS]


def assert_rows(got, want):
    chex.assert_trees_all_equal(np.asarray(got, np.int64), np.asarray(want, np.int64))


def _images(seed, b=5, c=4, n=48, levels=16):
    rng = np.random.default_rng(seed)
    return (random_boxes(rng, (b, n), flip=True), random_scores(rng, (b, c, n), levels=levels))


def _ort_rows(boxes, scores, per_class, iou, score_threshold):
    ort = pytest.importorskip("onnxruntime")
    del ort
    from tests.helpers.cases.nms import run_ort
    return run_ort(boxes, scores, per_class, iou, score_threshold)


def _per_image_best(rows, scores, k):
    """torchvision's ``keep[:detections_per_img]`` on each image's rows (ties: earlier)."""
    keep = []
    for b in np.unique(rows[:, 0]):
        at = np.flatnonzero(rows[:, 0] == b)
        keep += [at[r] for r in best_of(scores[b][rows[at, 1], rows[at, 2]], k)]
    return rows[np.asarray(keep, np.int64)] if keep else rows[:0]


# -- the per-image cap --------------------------------------------------------------------

@pytest.mark.parametrize("backend, x64", _runs("xla", "native"))
def test_max_detections_is_detections_per_img_over_onnx_rows(backend, x64):
    boxes, scores = _images(seed_of("cap", backend, x64))
    with jax.enable_x64(x64):
        out = jaxops.non_max_suppression(boxes, scores, 6, 0.45, 0.2, max_detections=9,
                                         backend=backend)
        assert out.dtype == (jnp.int64 if x64 else jnp.int32)
        assert out.max_shape == (5 * 9, 3) and out.true_shape is None
        got = jaxops.refresh(out)
    want = ref_non_max_suppression(boxes, scores, 6, 0.45, 0.2, max_detections=9)
    assert_rows(got, want)
    ort = _ort_rows(boxes, scores, 6, 0.45, 0.2)
    assert_rows(got, _per_image_best(ort, scores, 9))
    assert len(ort) > len(want) and np.bincount(want[:, 0]).max() == 9  # the cap bit


@pytest.mark.parametrize("x64", [False, True])
def test_batched_nms_cap_is_torchvision_keep_prefix(x64):
    rng = np.random.default_rng(seed_of("batched cap", x64))
    boxes = random_boxes(rng, (4, 60), flip=True)
    scores, idxs = random_scores(rng, (4, 60), levels=30), rng.integers(0, 5, (4, 60))
    with jax.enable_x64(x64):
        got = jaxops.refresh(jax.jit(jax.vmap(functools.partial(
            jaxops.batched_nms, iou_threshold=0.4, max_output_size=7)))(boxes, scores, idxs))
    for p in range(4):
        assert_rows(got[p], ref_batched_nms(boxes[p], scores[p], idxs[p], 0.4)[:7])


def test_against_torchvision_when_installed():
    torch = pytest.importorskip("torch")
    torchvision = pytest.importorskip("torchvision")
    boxes, scores = _images(11, b=3, c=5, n=80, levels=0)  # no ties (torch.sort is unstable)
    boxes = np.concatenate([np.minimum(boxes[..., :2], boxes[..., 2:]),
                            np.maximum(boxes[..., :2], boxes[..., 2:])], -1)
    got = jaxops.refresh(jaxops.non_max_suppression(boxes, scores, 80, 0.5, 0.3,
                                                    max_detections=12))
    for b in range(3):
        cls, idx = (torch.from_numpy(scores[b]) > 0.3).nonzero(as_tuple=True)
        keep = torchvision.ops.batched_nms(torch.from_numpy(boxes[b])[idx],
                                           torch.from_numpy(scores[b])[cls, idx], cls, 0.5)[:12]
        mine = {(int(c), int(i)) for _, c, i in got[got[:, 0] == b]}
        assert mine == set(zip(cls[keep].tolist(), idx[keep].tolist()))


# -- candidate capacities cut by score ----------------------------------------------------

@pytest.mark.parametrize("backend, x64", _runs("host"))
def test_pre_nms_top_k_cuts_by_score_and_reports_the_bound(backend, x64):
    boxes, scores = _images(seed_of("cut", backend, x64))
    k, per_class, cap = 30, 6, 9
    with jax.enable_x64(x64), expected_truncation():
        out = jaxops.non_max_suppression(boxes, scores, per_class, 0.45, 0.2, max_detections=cap,
                                         pre_nms_top_k=k, backend=backend)
        got = jaxops.refresh(out, allow_truncated=True)
    want = ref_non_max_suppression(boxes, scores, per_class, 0.45, 0.2, max_detections=cap,
                                   pre_nms_top_k=k)
    assert_rows(got, want)
    # ONNX Runtime on the best k candidates of each image (the others scored below it)
    passing = (scores > F32(0.2)).reshape(5, -1)
    kept = np.stack([np.isin(np.arange(passing.shape[1]), np.argsort(
        -np.where(passing[i], scores[i].reshape(-1), -np.inf), kind="stable")[:k])
        for i in range(5)]).reshape(scores.shape) & (scores > F32(0.2))
    ort = _ort_rows(boxes, np.where(kept, scores, F32(0.1)), per_class, 0.45, 0.2)
    assert_rows(got, _per_image_best(ort, scores, cap))
    found = np.bincount(want[:, 0], minlength=5)
    cut = np.maximum(passing.sum(1) - k, 0)
    assert cut.min() > 0  # every image had candidates cut
    assert out.true_shape.tolist() == [int(np.minimum(found + cut, cap).sum()), 3]
    assert bool(out.overflowed()) == bool((np.minimum(found + cut, cap) > found).any())


@pytest.mark.parametrize("backend, x64", _runs("xla"))
def test_batched_and_efficient_nms_cut_by_score(backend, x64):
    rng = np.random.default_rng(seed_of("cut2", backend, x64))
    boxes, scores, idxs = random_boxes(rng, (50,), flip=True), random_scores(rng, (50,)), \
        rng.integers(0, 3, 50)
    b3, s3 = random_boxes(rng, (2, 20)), random_scores(rng, (2, 20, 3), levels=12)
    with jax.enable_x64(x64), expected_truncation():
        got = jaxops.batched_nms(boxes, scores, idxs, 0.4, max_output_size=20, pre_nms_top_k=12,
                                 score_threshold=0.1, backend=backend)
        eff = jaxops.efficient_nms(b3, s3, max_output_boxes=8, iou_threshold=0.5,
                                   score_threshold=0.3, pre_nms_top_k=10, backend=backend)
        eff = jax.device_get(eff)
    want = ref_batched_nms(boxes, scores, idxs, 0.4, 20, 0.1, pre_nms_top_k=12)
    assert_rows(jaxops.refresh(got, allow_truncated=True), want)
    cut = max(int((scores > F32(0.1)).sum()) - 12, 0)
    assert got.true_shape.tolist() == [min(len(want) + cut, 20)]
    chex.assert_trees_all_equal(tuple(np.asarray(x) for x in eff),
                                tuple(ref_efficient_nms(b3, s3, 8, 0.5, 0.3, pre_nms_top_k=10)))
    assert int(eff.candidates_cut.min()) > 0


def test_cut_warns_eagerly_and_a_large_capacity_changes_nothing():
    boxes, scores = _images(3)
    with pytest.warns(jaxops.errors.CapacityOverflowWarning, match="cut by pre_nms_top_k"):
        jaxops.non_max_suppression(boxes, scores, 6, 0.45, 0.2, pre_nms_top_k=5)
    full = jaxops.non_max_suppression(boxes, scores, 6, 0.45, 0.2, pre_nms_top_k=4 * 48)
    assert full.true_shape is None  # a capacity that cannot cut tracks nothing
    assert_rows(jaxops.refresh(full), ref_non_max_suppression(boxes, scores, 6, 0.45, 0.2))


# -- traced thresholds --------------------------------------------------------------------

@pytest.mark.parametrize("backend, x64", _runs("native"))
def test_traced_thresholds_compile_once_for_every_value(backend, x64):
    boxes, scores = _images(seed_of("traced", backend, x64), b=3, c=2, n=30)
    ftype = jnp.float64 if x64 else jnp.float32
    chex.clear_trace_counter()  # counted per function across the parametrized runs

    @jax.jit
    @chex.assert_max_traces(n=1)
    def run(iou, st):
        return (jaxops.non_max_suppression(boxes, scores, 8, iou, st, backend=backend),
                jaxops.batched_nms(boxes[0], scores[0, 0], np.arange(30) % 3, iou,
                                   score_threshold=st, backend=backend),
                jaxops.efficient_nms(boxes, scores.transpose(0, 2, 1), max_output_boxes=6,
                                     iou_threshold=iou, score_threshold=st, backend=backend))

    with jax.enable_x64(x64):
        values = [(jnp.asarray(iou, ftype), jnp.asarray(st, ftype))
                  for iou, st in [(0.3, 0.1), (0.55, 0.4), (0.8, 0.25)]]
        jax.block_until_ready(run(*values[0]))  # the one compile
        for iou, st in values:
            with CompileCounter() as compiles:
                rows, kept, eff = run(iou, st)
            assert compiles.count == 0
            t = float(np.asarray(iou, ftype))  # ONNX takes float32; torchvision compares in double
            assert_rows(jaxops.refresh(rows), ref_non_max_suppression(
                boxes, scores, 8, F32(t), F32(np.asarray(st, ftype))))
            assert_rows(jaxops.refresh(kept), ref_batched_nms(
                boxes[0], scores[0, 0], np.arange(30) % 3, t,
                score_threshold=float(np.asarray(st, ftype))))
            chex.assert_trees_all_equal(tuple(np.asarray(x) for x in eff), tuple(ref_efficient_nms(
                boxes, scores.transpose(0, 2, 1), 6, F32(t), F32(np.asarray(st, ftype)))))


def test_thresholds_vmapped_per_image():
    boxes, scores = _images(4, b=3, c=2, n=30)
    ious = jnp.array([0.2, 0.5, 0.9], jnp.float32)
    out = jax.jit(jax.vmap(lambda b, s, t: jaxops.non_max_suppression(b[None], s[None], 8, t)))(
        boxes, scores, ious)
    for i, t in enumerate(np.asarray(ious)):
        got = jaxops.refresh(out)[i]
        assert_rows(got[:, 1:], ref_non_max_suppression(boxes[i:i + 1], scores[i:i + 1], 8, t)[:, 1:])


@pytest.mark.parametrize("call,op,arg", [
    (lambda b, s, k: jaxops.non_max_suppression(b, s, k, 0.5), "NonMaxSuppression",
     "max_output_boxes_per_class"),
    (lambda b, s, k: jaxops.non_max_suppression(b, s, 4, 0.5, max_detections=k),
     "NonMaxSuppression", "max_detections"),
    (lambda b, s, k: jaxops.efficient_nms(b, s.transpose(0, 2, 1), max_output_boxes=k,
                                          iou_threshold=0.5, score_threshold=0.1),
     "EfficientNMS", "max_output_boxes"),
])
def test_a_traced_shape_setting_says_it_must_be_static(call, op, arg):
    boxes, scores = _images(5, b=1, c=2, n=8)
    with pytest.raises(OpArgumentError, match="static") as err:
        jax.jit(call)(boxes, scores, 3)
    assert (err.value.op, err.value.arg) == (op, arg)
    assert "static_argnames" in str(err.value)


def test_threshold_errors_name_their_own_rule():
    boxes, scores = _images(5, b=1, c=2, n=8)
    with pytest.raises(OpArgumentError, match="as ONNX Runtime requires"):
        jaxops.non_max_suppression(boxes, scores, 3, 1.5)
    with pytest.raises(OpArgumentError, match=r"EfficientNMS: argument 'iou_threshold'") as err:
        jaxops.efficient_nms(boxes, scores.transpose(0, 2, 1), max_output_boxes=2,
                             iou_threshold=1.5, score_threshold=0.1)
    assert "ONNX" not in str(err.value)
    with pytest.raises(OpArgumentError, match="iou_threshold"):  # a concrete JAX scalar is checked
        jaxops.non_max_suppression(boxes, scores, 3, jnp.float32(2.0))


def test_efficient_nms_blames_scores_in_onnx_layout():
    boxes, scores = _images(5, b=2, c=3, n=8)
    with pytest.raises(OpArgumentError, match="scores.transpose") as err:
        jaxops.efficient_nms(boxes, scores, max_output_boxes=2, iou_threshold=0.5,
                             score_threshold=0.1)
    assert err.value.arg == "scores" and "ONNX's" in str(err.value)


# -- DynArray inputs ----------------------------------------------------------------------

@pytest.mark.parametrize("x64", [False, True])
def test_the_issue_example_reports_the_upstream_overflow(x64):
    v = np.array([3.0, -1.0, 1.0, 4.0, 5.0, 2.0])
    f = jax.jit(lambda v: jaxops.nonzero(jaxops.masked_select(v, v > 0, size=2) > 2.5))
    with jax.enable_x64(x64):
        out = f(v)
    assert bool(out.overflowed())
    np.testing.assert_array_equal(jaxops.refresh(out, allow_truncated=True),
                                  np.nonzero(np.array([3.0, 1.0]) > 2.5))
    # what it bounds: the 3 positives lost upstream could each have been one more index
    assert out.true_shape.tolist() == [1, 1 + 3]
    with pytest.warns(jaxops.errors.CapacityOverflowWarning):
        jaxops.refresh(out)


def test_index_ops_read_only_the_valid_region():
    rng = np.random.default_rng(1)
    data = rng.integers(-2, 3, (5, 6)).astype(np.float32)
    d = DynArray(jnp.asarray(data), [3, 4])
    exact = data[:3, :4]

    @jax.jit  # every index op in one program (eagerly the DynArray arithmetic runs op by op)
    def run(d):
        return (jaxops.nonzero(d), jaxops.argwhere(d), jaxops.flatnonzero(d),
                jaxops.masked_select(d, d > 0), jaxops.masked_select(d.data, d > 0),
                jaxops.unique(d, return_index=True, return_inverse=True, return_counts=True))

    nz, aw, flat, ms, ms_plain, uniq = jaxops.refresh(run(d))
    np.testing.assert_array_equal(nz, np.nonzero(exact))
    np.testing.assert_array_equal(aw, np.argwhere(exact))
    np.testing.assert_array_equal(flat, np.flatnonzero(exact))
    np.testing.assert_array_equal(ms, exact[exact > 0])
    np.testing.assert_array_equal(ms_plain, data[:3, :4][exact > 0])
    y, idx, inv, cnt = uniq
    want = np.unique(exact, return_index=True, return_inverse=True, return_counts=True)
    for a, b in zip((y, idx, inv, cnt), want):
        np.testing.assert_array_equal(a, b.reshape(-1))
    with pytest.raises(OpArgumentError, match="axis"):
        jaxops.unique(d, axis=0)


def test_unique_of_an_overflowed_dynarray_bounds_its_true_size():
    x = jnp.array([1.0, 1.0, 2.0, 3.0, 5.0, 8.0])
    out = jax.jit(lambda x: jaxops.unique(jaxops.masked_select(x, x < 4, size=3),
                                          return_counts=True))(x)
    y, counts = jaxops.refresh(out, allow_truncated=True)
    np.testing.assert_array_equal(y, [1.0, 2.0])
    np.testing.assert_array_equal(counts, [2, 1])
    assert bool(out[0].overflowed()) and out[0].true_shape.tolist() == [2 + 1]


@pytest.mark.parametrize("backend, x64", _runs("xla"))
def test_nonzero_route_into_batched_nms_carries_the_overflow(backend, x64):
    rng = np.random.default_rng(seed_of("route", backend))
    boxes, scores = random_boxes(rng, (40,)), random_scores(rng, (3, 40))   # [C, N] scores

    def route(size):  # candidates by index (nonzero's contract), then NMS
        flat = jaxops.flatnonzero(scores > 0.5, size=size, overflow="truncate")
        cls, box = flat.map(lambda j: j // 40), flat.map(lambda j: j % 40)
        return jaxops.batched_nms(box.take(boxes), flat.take(scores.reshape(-1)), cls, 0.45,
                                  backend=backend)

    n = int((scores > 0.5).sum())
    with expected_truncation(), jax.enable_x64(x64):  # one compile a capacity
        full, cut = (jax.jit(route, static_argnums=0)(size) for size in (None, n - 5))
        assert full.dtype == (jnp.int64 if x64 else jnp.int32)
    c, i = np.nonzero(scores > 0.5)
    order = np.argsort(c * 40 + i)  # flatnonzero's order
    c, i = c[order], i[order]
    assert_rows(i[jaxops.refresh(full)], i[ref_batched_nms(boxes[i], scores[c, i], c, 0.45)])
    assert full.true_shape is None and bool(cut.overflowed())
    kept = jaxops.refresh(cut, allow_truncated=True)
    ck, ik = c[:n - 5], i[:n - 5]
    assert_rows(kept, ref_batched_nms(boxes[ik], scores[ck, ik], ck, 0.45))
    assert int(cut.true_shape[0]) == len(kept) + 5  # no max_output_size: any could be kept


def test_nms_family_reads_only_valid_boxes():
    boxes, scores = _images(9, b=2, c=3, n=20)
    d_boxes = DynArray(jnp.asarray(boxes), [2, 14, 4])
    got = jaxops.refresh(jax.jit(lambda b, s: jaxops.non_max_suppression(b, s, 20, 0.5))(
        d_boxes, scores))  # jitted: one program (eagerly the DynArray masking runs op by op)
    assert_rows(got, ref_non_max_suppression(boxes[:, :14], scores[:, :, :14], 20, 0.5))
    d_scores = DynArray(jnp.asarray(scores[0, 0]), [11], true_shape=[15])
    with pytest.warns(jaxops.errors.CapacityOverflowWarning, match="lost upstream"):
        out = jaxops.nms(boxes[0], d_scores, 0.5)
    assert_rows(jaxops.refresh(out, allow_truncated=True), ref_nms(boxes[0, :11], scores[0, 0, :11],
                                                                   0.5))
    assert int(out.true_shape[0]) == int(out.actual_shape[0]) + 4
    with pytest.raises(OpArgumentError, match="EfficientNMS: argument 'scores'"):
        jaxops.efficient_nms(boxes, DynArray(jnp.asarray(scores.transpose(0, 2, 1)), [2, 20, 3]),
                             max_output_boxes=4, iou_threshold=0.5, score_threshold=0.1)


def test_dynarray_bookkeeping_survives_grad():
    x = jnp.arange(6.0)

    def loss(x):
        d = jaxops.masked_select(x, x > 2, size=2)
        return d.valid_data().sum() + d.lost() + d.numel() + d.lost(axis=0)

    np.testing.assert_array_equal(jax.jit(jax.grad(loss))(x), [0, 0, 0, 1, 1, 0])


def test_argwhere_records_its_rows():
    from jaxops import capacity

    capacity.clear_stats()
    jaxops.argwhere(np.eye(3), record="argwhere-site")
    jaxops.flatnonzero(np.eye(4), record="flat-site")
    assert capacity.get_stats("argwhere-site").sizes.tolist() == [3]
    assert capacity.get_stats("flat-site").sizes.tolist() == [4]
