"""Non-maximum suppression: ONNX NonMaxSuppression, torchvision-style ``nms`` / ``batched_nms``.

All of them run the one tiled greedy algorithm of :mod:`jaxops.ops.nms.tiled` on the box
decoding and overlap test of :mod:`jaxops.ops.nms.iou`; TensorRT-style ``efficient_nms`` lives
in :mod:`jaxops.ops.nms.efficient_nms`.

Semantics shared by the family (ONNX Runtime's CPU kernel is the oracle of the tests):

- candidates are visited by decreasing score, ties to the lower box index (+0.0 and -0.0
  tie); a candidate is kept unless a kept box of its problem has IoU *strictly greater*
  than ``iou_threshold`` with it;
- corner boxes may give either diagonal pair of corners; disjoint and zero-area boxes never
  suppress anything (their IoU is 0, or 0/0);
- with ``score_threshold``, only scores strictly greater than it are candidates;
- **non-finite scores**: ``+inf`` ranks first, ``-inf`` last (a candidate unless a
  ``score_threshold`` is given); **NaN scores are never selected** (ONNX leaves this
  undefined; ONNX Runtime's heap then orders them arbitrarily, and drops them when a
  ``score_threshold`` is given, as we do; torchvision sorts them first);
- **non-finite coordinates**: a box with a NaN or infinite coordinate (or an area that
  overflows to inf) never suppresses another box and is never suppressed; it is selected on
  its score alone, like any box. That is what ONNX Runtime's ``SuppressByIOU`` and
  torchvision's CPU ``nms`` compute: such a box's IoU with any box is NaN (NaN area, or
  ``inf - inf`` in the union) or 0 (an infinite union), never above a threshold in
  ``[0, 1]``; :func:`~jaxops.ops.nms.iou.suppresses` reproduces their float operations.

Precision modes (``impl_mode=`` or :func:`jaxops.impl_mode`); both compute the IoU as
``inter / union`` in float32 exactly as ONNX Runtime does. ``high_precision`` (the default)
ranks the candidates by their exact scores. ``high_performance`` sorts once instead of
twice and ranks on the leading bits of the float32 scores only: scores whose bit patterns
agree except in the low ``b = ceil(log2 N)`` bits (for 5000 boxes, 13 of the 23 mantissa
bits) are ranked by box index — for non-negative scores exactly the high-precision result
on the scores with those bits cleared — which can change which of two overlapping boxes
survives. It measured ~4% faster on the CPU (the sort is a small part of the work);
float64 scores and more than 2**15 boxes are always ranked exactly. Also measured and
dropped: a division-free test ``inter > t * union`` (no faster on the CPU).
"""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.capacity import run_with_policy
from jaxops.core.dtypes import FLOATING, INDEX, INTEGER
from jaxops.core.dynarray import DynArray
from jaxops.core.errors import OpArgumentError, OpDTypeError
from jaxops.core.float_bits import largest_at_most, ordered_bits
from jaxops.core.impl_mode import OpImplMode
from jaxops.core.numerics import compute_dtype
from jaxops.core.narrowing import check_fits
from jaxops.core.registry import AttrDef, Input, OpDef, Output, register_op
from jaxops.ops._conventions import (INDEX_FILL, IOU_THRESHOLD, NMS_MODES, SCORE_THRESHOLD,
                                     check_shape, index_datatype, index_dtype)
from jaxops.ops.compaction import compact_indices
from jaxops.ops.nms.iou import decode_boxes
from jaxops.ops.nms.tiled import score_candidates, sorted_nms

__all__ = [
    "BATCHED_NMS", "NON_MAX_SUPPRESSION", "batched_nms", "nms", "non_max_suppression",
]

# Every NMS operator with a DynArray of indices as its output declares these.
_INDEX_OUTPUT = dict(infer_dtype=lambda ctx: [index_datatype()],
                     impl_modes=NMS_MODES, data_dependent=True, fill_values=[INDEX_FILL])


# -- NonMaxSuppression (ONNX opset 11) ------------------------------------------------------

def _onnx_shapes(boxes_shape: tuple, scores_shape: tuple) -> tuple[int, int, int]:
    op = "NonMaxSuppression"
    check_shape(op, "boxes", boxes_shape, "[num_batches, spatial_dimension, 4]",
                 len(boxes_shape) == 3 and boxes_shape[2] == 4)
    b, n = boxes_shape[:2]
    check_shape(op, "scores", scores_shape, f"[num_batches={b}, num_classes, "
                 f"spatial_dimension={n}] (matching boxes)",
                 len(scores_shape) == 3 and scores_shape[0] == b and scores_shape[2] == n)
    return b, scores_shape[1], n


def _onnx_capacity(b: int, c: int, n: int, max_output: int, size: int | None) -> tuple[int, int]:
    """Per-class limit and output rows (``size`` or the theoretical maximum)."""
    per_class = min(n, max_output)
    return per_class, b * c * per_class if size is None else size


def _onnx_infer_shape(ctx) -> list[tuple[int, ...]]:
    b, c, n = _onnx_shapes(ctx.inputs[0].shape, ctx.inputs[1].shape)
    return [(_onnx_capacity(b, c, n, ctx.attrs["max_output_boxes_per_class"],
                            ctx.attrs["size"])[1], 3)]


NON_MAX_SUPPRESSION = register_op(OpDef(
    name="NonMaxSuppression",
    inputs=[Input("boxes", FLOATING), Input("scores", FLOATING)],
    outputs=[Output("selected_indices", INDEX)],
    attrs=[
        AttrDef("max_output_boxes_per_class", "int", 0, check=lambda k: k >= 0,
                expected="an int >= 0 (0 selects nothing, as in ONNX; ONNX Runtime also treats "
                         "negative values as 0 — pass 0 for that, or the box count for no limit)"),
        IOU_THRESHOLD,
        SCORE_THRESHOLD,
        AttrDef("center_point_box", "int", 0, choices=(0, 1)),
        AttrDef("size", "int", None, optional=True, check=lambda s: s >= 0,
                expected="an int >= 0 or None (output capacity in rows)"),
    ],
    infer_shape=_onnx_infer_shape,
    **_INDEX_OUTPUT,
    doc="ONNX NonMaxSuppression (opset 11): [batch, class, box] rows of the selected boxes",
))


def _per_problem(fn, *args):
    """``vmap`` over the leading axis, or a plain call when it has length 1 (keeps the
    tile loop's dynamic slices slices instead of gathers)."""
    if jax.tree_util.tree_leaves(args)[0].shape[0] == 1:
        first = jax.tree_util.tree_map(lambda x: x[0], args)
        return jax.tree_util.tree_map(lambda x: x[None], fn(*first))
    return jax.vmap(fn)(*args)


def _onnx_kernel(boxes, scores, *, max_output_boxes_per_class, iou_threshold, score_threshold,
                 center_point_box, size, exact_ranking=True):
    b, c, n = _onnx_shapes(boxes.shape, scores.shape)
    per_class, rows = _onnx_capacity(b, c, n, max_output_boxes_per_class, size)
    itype = index_dtype()
    if b * c * per_class == 0 or rows == 0:
        empty = jnp.full((rows, 3), -1, itype)
        return (_rows_dynarray(empty, jnp.zeros((), jnp.int32), rows, size),)

    dtype = compute_dtype(boxes.dtype, scores.dtype)
    decoded = decode_boxes(boxes, center=center_point_box == 1, reorder=center_point_box == 0,
                           dtype=dtype)                                  # fields [B, N]
    scores = scores.astype(dtype)
    valid = score_candidates(scores, score_threshold)
    per_box = decoded.map(lambda f: jnp.broadcast_to(f[:, None], (b, c, n)).reshape(b * c, n))
    solve = functools.partial(sorted_nms, iou_threshold=iou_threshold, max_output=per_class,
                              exact_ranking=exact_ranking)
    order, keep = _per_problem(solve, per_box, scores.reshape(b * c, n), valid.reshape(b * c, n))
    keep = keep.reshape(-1)
    total = jnp.sum(keep, dtype=jnp.int32)
    if rows < b * c * per_class:  # a capacity below the maximum: overflow keeps the best
        ranked = jnp.take_along_axis(scores.reshape(b * c, n), order, axis=1).reshape(-1)
        keep = _keep_top_scoring(keep, ranked, rows, total)
    # Kept ranks in problem-major order are exactly the output rows, in order.
    flat, _ = compact_indices(keep, size=rows, fill_value=0)
    problem = flat // n
    out = jnp.stack([problem // c, problem % c, order.reshape(-1)[flat]], axis=1).astype(itype)
    return (_rows_dynarray(out, total, rows, size),)


def _keep_top_scoring(keep: jax.Array, ranked_scores: jax.Array, rows: int,
                      total: jax.Array) -> jax.Array:
    """``keep`` limited to its ``rows`` highest scores when it holds more (ties to the earlier
    output row), so a truncated NMS output keeps the best detections over all batches and
    classes; they stay in the usual batch, class, score order. Ranked on ``ordered_bits``
    (float compares under XLA:CPU's DAZ would rank a subnormal score as a zero)."""
    def restrict(keep):
        key = ordered_bits(ranked_scores)  # unsigned; kept scores are never NaN
        bits = key.dtype.itemsize * 8  # flipping the top bit: the same order as signed ints
        signed = jax.lax.bitcast_convert_type(key ^ np.asarray(1 << (bits - 1), key.dtype),
                                              jnp.dtype(f"int{bits}"))
        # no kept score has the smallest key (it lies below -inf's)
        _, best = jax.lax.top_k(jnp.where(keep, signed, jnp.iinfo(signed.dtype).min), rows)
        return keep & jnp.zeros_like(keep).at[best].set(True)
    return jax.lax.cond(total > rows, restrict, lambda k: k, keep)


def _rows_dynarray(out, total, rows: int, size: int | None) -> DynArray:
    actual = jnp.minimum(total, rows)
    out = jnp.where((jnp.arange(rows) < actual)[:, None], out, jnp.asarray(-1, out.dtype))
    three = jnp.int32(3)
    true_shape = None if size is None else jnp.stack([total, three])
    return DynArray(out, jnp.stack([actual, three]), true_shape=true_shape, fill_value=INDEX_FILL)


NON_MAX_SUPPRESSION.kernel("xla")(_onnx_kernel)
NON_MAX_SUPPRESSION.kernel("xla", modes=OpImplMode.HIGH_PERFORMANCE)(
    functools.partial(_onnx_kernel, exact_ranking=False))


def non_max_suppression(boxes: jax.Array, scores: jax.Array, max_output_boxes_per_class: int = 0,
                        iou_threshold: float = 0.0, score_threshold: float | None = None, *,
                        center_point_box: int = 0, size: int | None = None,
                        overflow: str = "truncate", record: bool | str = False,
                        impl_mode: str | OpImplMode | None = None,
                        backend: str | None = None) -> DynArray:
    """ONNX NonMaxSuppression (opset 11), as ONNX Runtime's CPU kernel computes it.

    Args:
      boxes: ``[num_batches, N, 4]`` float; ``[y1, x1, y2, x2]`` (any diagonal corner pair),
        or ``[x_center, y_center, width, height]`` with ``center_point_box=1``.
      scores: ``[num_batches, num_classes, N]`` float.
      max_output_boxes_per_class: most boxes kept per batch and class; **0 selects nothing**
        (the ONNX default; ONNX Runtime agrees).
      iou_threshold: in ``[0, 1]``; a box is suppressed when its IoU with a kept box of the
        same batch and class is strictly greater. A box with a NaN or infinite coordinate
        neither suppresses nor is suppressed, and a NaN score is never selected (as ONNX
        Runtime; see the module docstring).
      score_threshold: when given, only scores strictly greater are candidates.
      center_point_box: 0 (corners) or 1 (centre and size).
      size: capacity in rows; ``None`` is the maximum ``B * C * min(N, max_output_...)``. When
        more rows are selected than fit, the ``size`` highest-scoring ones over all batches
        and classes are kept (ties to the earlier row), still in batch, class, score order,
        and the rest is reported as lost (``true_shape``, :meth:`DynArray.overflowed`), also
        inside jit.
      overflow: what an eager call does when the rows exceed ``size``
        (:mod:`jaxops.capacity.policy`): ``"truncate"`` (default: keep the best, warn once per
        call site), ``"error"``, ``"expand"`` (rerun at the next power-of-two capacity) or
        ``"host"``. Inside jit the flag travels with the result instead.
      record: record the number of rows this call needed in :mod:`jaxops.capacity.stats`
        (``True``: under the operator and input shapes; a string: under that call-site
        name), on the host or, inside jit, through an unordered ``io_callback``.
      impl_mode: ``"high_precision"`` (default) or ``"high_performance"``.
      backend: ``"xla"``, ``"host"`` or ``"ascend"`` (default: automatic).

    Returns:
      A :class:`DynArray` of max shape ``[size, 3]``, actual shape ``[M, 3]``: rows
      ``[batch, class, box]`` ordered by batch, class, then decreasing score (ties to the
      lower box index), padded with ``-1`` rows. int64 with ``jax_enable_x64``, else int32.

    Examples:
      >>> import jax.numpy as jnp, jaxops
      >>> boxes = jnp.array([[[0, 0, 1, 1], [0, 0.1, 1, 1.1], [0, 2, 1, 3.]]])
      >>> scores = jnp.array([[[0.9, 0.8, 0.7]]])
      >>> jaxops.refresh(jaxops.non_max_suppression(boxes, scores, 3, 0.5)).tolist()
      [[0, 0, 0], [0, 0, 2]]
    """
    def run(capacity: int | None, rerun_backend: str | None) -> DynArray:
        return NON_MAX_SUPPRESSION(
            boxes, scores, max_output_boxes_per_class=max_output_boxes_per_class,
            iou_threshold=iou_threshold, score_threshold=score_threshold,
            center_point_box=center_point_box, size=capacity, impl_mode=impl_mode,
            backend=rerun_backend or backend)[0]

    b, c, n = _onnx_shapes(np.shape(boxes), np.shape(scores))
    if isinstance(max_output_boxes_per_class, (int, np.integer)) and \
            max_output_boxes_per_class == 0 and b * c * n:
        # ONNX's default, kept for conformance; a silent empty result surprises users.
        warnings.warn("NonMaxSuppression: max_output_boxes_per_class is 0 (ONNX's default), so "
                      "no box is selected; pass the number of boxes to keep per class.",
                      UserWarning, stacklevel=2)
    limit = max_output_boxes_per_class if isinstance(max_output_boxes_per_class,
                                                     (int, np.integer)) else n
    return run_with_policy(run, op="NonMaxSuppression", size=size,
                           theoretical_max=_onnx_capacity(b, c, n, limit, None)[1],
                           policy=overflow, record=record,
                           input_shapes=[np.shape(boxes), np.shape(scores)])


def nms(boxes: jax.Array, scores: jax.Array, iou_threshold: float, *,
        max_output_size: int | None = None, score_threshold: float | None = None,
        impl_mode: str | OpImplMode | None = None, backend: str | None = None) -> DynArray:
    """torchvision-compatible single-class NMS.

    Args:
      boxes: ``[N, 4]`` float ``[x1, y1, x2, y2]`` (flipped corners are accepted and
        reordered, where torchvision would compute negative areas).
      scores: ``[N]`` float.
      iou_threshold: in ``[0, 1]``; suppress boxes with IoU strictly greater.
      max_output_size: keep at most this many (the first ones by score, as TensorFlow's
        ``max_output_size``); ``None`` keeps all. It is a selection limit, not a capacity.
      score_threshold: only scores strictly greater are candidates (``None``: all).
      impl_mode, backend: see :func:`non_max_suppression`.

    Returns:
      DynArray ``[min(N, max_output_size)]`` of kept indices by decreasing score, padded
      with -1. Differences from torchvision: NaN scores are never kept (torchvision sorts
      them first); thresholds outside ``[0, 1]`` raise; indices are int32 unless x64 is on.
      As in torchvision, a box with a NaN or infinite coordinate neither suppresses nor is
      suppressed (see the module docstring).

    Examples:
      >>> import jax.numpy as jnp, jaxops
      >>> boxes = jnp.array([[0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30.]])
      >>> jaxops.refresh(jaxops.nms(boxes, jnp.array([0.5, 0.9, 0.7]), 0.5)).tolist()
      [1, 2]
    """
    _single_class_shapes("nms", boxes, scores)
    n = np.shape(boxes)[0]
    check_fits("nms", "boxes", boxes)  # before jnp.asarray narrows them
    check_fits("nms", "scores", scores)
    boxes, scores = jnp.asarray(boxes), jnp.asarray(scores)
    for arg, x in (("boxes", boxes), ("scores", scores)):  # named here, not NonMaxSuppression
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise OpDTypeError("nms", arg, "a float array (as torchvision's nms)", str(x.dtype),
                               "Pass float coordinates, e.g. [[0., 0., 1., 1.]].")
    rows = non_max_suppression(
        boxes[None], scores[None, None],
        n if max_output_size is None else _limit("nms", max_output_size),
        _torchvision_threshold(iou_threshold, compute_dtype(boxes.dtype, scores.dtype)),
        score_threshold, impl_mode=impl_mode, backend=backend)
    return DynArray(rows.data[:, 2], rows.actual_shape[:1], fill_value=INDEX_FILL)


def _torchvision_threshold(t, dtype):
    """torchvision compares its float IoU with a double threshold: in ``dtype`` that is
    ``IoU > largest_at_most(t)`` (at IoU 0.6f, ``0.6f > 0.6`` holds in double)."""
    ok = isinstance(t, (int, float, np.floating, np.integer)) and not isinstance(t, bool)
    return largest_at_most(float(t), dtype) if ok and np.isfinite(t) else t


def _limit(op: str, value) -> int:
    """``max_output_size`` checked under its own name (it becomes NonMaxSuppression's
    ``max_output_boxes_per_class``, whose error would confuse an ``nms`` caller)."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
        raise OpArgumentError(op, "max_output_size", "an int >= 0 or None", repr(value))
    return int(value)


def _single_class_shapes(op: str, boxes, scores, idxs=None) -> None:
    bs, ss = tuple(np.shape(boxes)), tuple(np.shape(scores))
    check_shape(op, "boxes", bs, "[N, 4]", len(bs) == 2 and bs[1] == 4)
    check_shape(op, "scores", ss, f"[N={bs[0]}] (one score per box)", ss == bs[:1])
    if idxs is not None:
        ids = tuple(np.shape(idxs))
        check_shape(op, "idxs", ids, f"[N={bs[0]}] (one class id per box)", ids == bs[:1])


# -- batched_nms (torchvision semantics: independent NMS per class id) ---------------------

def _batched_infer_shape(ctx) -> list[tuple[int, ...]]:
    n = ctx.inputs[0].shape[0]
    limit = ctx.attrs["max_output_size"]
    return [(n if limit is None else min(n, limit),)]


BATCHED_NMS = register_op(OpDef(
    name="BatchedNMS",
    inputs=[Input("boxes", FLOATING), Input("scores", FLOATING), Input("idxs", INTEGER)],
    outputs=[Output("keep", INDEX)],
    attrs=[IOU_THRESHOLD,
           AttrDef("max_output_size", "int", None, optional=True, check=lambda k: k >= 0,
                   expected="an int >= 0 or None"),
           SCORE_THRESHOLD],
    infer_shape=_batched_infer_shape,
    **_INDEX_OUTPUT,
    doc="torchvision batched_nms: NMS independently per class id, kept indices by score",
))


def _batched_kernel(boxes, scores, idxs, *, iou_threshold, max_output_size, score_threshold,
                    exact_ranking=True):
    _single_class_shapes("BatchedNMS", boxes, scores, idxs)
    n = boxes.shape[0]
    limit = n if max_output_size is None else min(n, max_output_size)
    dtype = compute_dtype(boxes.dtype, scores.dtype)
    scores = scores.astype(dtype)
    order, keep = sorted_nms(decode_boxes(boxes, dtype=dtype), scores,
                             score_candidates(scores, score_threshold),
                             _torchvision_threshold(iou_threshold, dtype), limit,
                             groups=idxs, exact_ranking=exact_ranking)
    ranks, count = compact_indices(keep, size=limit, fill_value=0)
    kept = jnp.where(jnp.arange(limit) < count, order[ranks] if limit else ranks, -1)
    return (DynArray(kept.astype(index_dtype()), count.reshape(1), fill_value=INDEX_FILL),)


BATCHED_NMS.kernel("xla")(_batched_kernel)
BATCHED_NMS.kernel("xla", modes=OpImplMode.HIGH_PERFORMANCE)(
    functools.partial(_batched_kernel, exact_ranking=False))


def batched_nms(boxes: jax.Array, scores: jax.Array, idxs: jax.Array, iou_threshold: float, *,
                max_output_size: int | None = None, score_threshold: float | None = None,
                impl_mode: str | OpImplMode | None = None, backend: str | None = None) -> DynArray:
    """torchvision-compatible ``batched_nms``: NMS independently within each class id.

    Args:
      boxes, scores, iou_threshold, max_output_size, score_threshold, impl_mode, backend: as
        :func:`nms` (``max_output_size`` limits the total over all classes).
      idxs: ``[N]`` integer class id of each box; boxes of different ids never suppress
        each other.

    Returns:
      DynArray ``[min(N, max_output_size)]`` of kept indices by decreasing score over all
      classes (ties to the lower index), padded with -1.

    Examples:
      >>> import jax.numpy as jnp, jaxops
      >>> boxes = jnp.array([[0, 0, 10, 10], [1, 1, 11, 11], [1, 1, 11, 11.]])
      >>> kept = jaxops.batched_nms(boxes, jnp.array([0.9, 0.8, 0.7]), jnp.array([0, 0, 1]), 0.5)
      >>> jaxops.refresh(kept).tolist()
      [0, 2]
    """
    _single_class_shapes("batched_nms", boxes, scores, idxs)
    return BATCHED_NMS(boxes, scores, idxs, iou_threshold=iou_threshold,
                       max_output_size=max_output_size, score_threshold=score_threshold,
                       impl_mode=impl_mode, backend=backend)[0]
