"""torchvision-style ``batched_nms`` (op ``BatchedNMS``) and ``nms`` (its one-class case).

Semantics: those of :mod:`jaxops.ops.nms.suppression` (ties, NaN and non-finite boxes,
traced thresholds, candidates cut by score), with torchvision's IoU test: its float IoU is
compared with a double threshold, so ``IoU > largest_at_most(t)`` in the float type
(:func:`~jaxops.core.float_bits.largest_at_most`; at IoU 0.6f, ``0.6f > 0.6`` holds in
double). ``max_output_size`` is the per-image cap over all classes, the best by score —
torchvision's ``keep[:detections_per_img]``, TensorRT's ``keepTopK``.

>>> import jax.numpy as jnp, jaxops
>>> boxes = jnp.array([[0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30.]])
>>> jaxops.refresh(jaxops.nms(boxes, jnp.array([0.5, 0.9, 0.7]), 0.5)).tolist()
[1, 2]
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.core.dtypes import FLOATING, INDEX, INTEGER
from jaxops.core.dynarray import DynArray
from jaxops.core.errors import OpArgumentError, OpDTypeError
from jaxops.core.float_bits import largest_at_most
from jaxops.core.impl_mode import OpImplMode
from jaxops.core.narrowing import check_fits
from jaxops.core.numerics import compute_dtype
from jaxops.core.registry import AttrDef, Input, OpDef, Output, register_op
from jaxops.ops._conventions import (INDEX_FILL, IOU_THRESHOLD, NMS_INDEX_OUTPUT, PRE_NMS_TOP_K,
                                     SCORE_THRESHOLD, check_shape, index_dtype,
                                     with_upstream_loss)
from jaxops.ops.nms.candidates import score_candidates
from jaxops.ops.nms.iou import decode_boxes
from jaxops.ops.nms.pipeline import (detect, priority_keys, tracks_true_shape, valid_candidates,
                                     warn_if_cut)

__all__ = ["BATCHED_NMS", "batched_nms", "nms"]


def _shapes(op: str, boxes, scores, idxs=None) -> None:
    bs, ss = tuple(np.shape(boxes)), tuple(np.shape(scores))
    check_shape(op, "boxes", bs, "[N, 4]", len(bs) == 2 and bs[1] == 4)
    check_shape(op, "scores", ss, f"[N={bs[0]}] (one score per box)", ss == bs[:1])
    if idxs is not None:
        ids = tuple(np.shape(idxs))
        check_shape(op, "idxs", ids, f"[N={bs[0]}] (one class id per box)", ids == bs[:1])


def _infer_shape(ctx) -> list[tuple[int, ...]]:
    n = ctx.inputs[0].shape[0]
    limit = ctx.attrs["max_output_size"]
    return [(n if limit is None else min(n, limit),)]


BATCHED_NMS = register_op(OpDef(
    name="BatchedNMS",
    inputs=[Input("boxes", FLOATING), Input("scores", FLOATING), Input("idxs", INTEGER)],
    outputs=[Output("keep", INDEX)],
    attrs=[IOU_THRESHOLD,
           AttrDef("max_output_size", "int", None, optional=True, check=lambda k: k >= 0,
                   expected="an int >= 0 or None (the most kept over all classes)"),
           SCORE_THRESHOLD,
           PRE_NMS_TOP_K],
    infer_shape=_infer_shape,
    **NMS_INDEX_OUTPUT,
    doc="torchvision batched_nms: NMS independently per class id, kept indices by score",
))


def torchvision_threshold(t, dtype):
    """torchvision's ``float IoU > double t`` as ``IoU > largest_at_most(t)`` in ``dtype``
    (a non-finite Python ``t`` as it is)."""
    if isinstance(t, jax.Array):
        return largest_at_most(t, dtype)
    return largest_at_most(float(t), dtype) if np.isfinite(t) else t


def _dense_groups(idxs: jax.Array) -> jax.Array:
    """int32 ids with the same equalities as ``idxs`` (64-bit ids become their ranks)."""
    if idxs.dtype.itemsize <= 4:
        return idxs.astype(jnp.int32)  # a bijection for every 32-bit or narrower type
    return jnp.searchsorted(jnp.sort(idxs), idxs).astype(jnp.int32)


def _batched_kernel(boxes, scores, idxs, *, iou_threshold, max_output_size, score_threshold,
                    pre_nms_top_k, exact_ranking=True):
    _shapes("BatchedNMS", boxes, scores, idxs)
    n = boxes.shape[0]
    limit = n if max_output_size is None else min(n, max_output_size)
    track = tracks_true_shape(None, pre_nms_top_k, n)
    if limit == 0:
        zero = jnp.zeros((1,), jnp.int32)
        return (DynArray(jnp.zeros((0,), index_dtype()), zero,
                         true_shape=zero if track else None, fill_value=INDEX_FILL),)
    dtype = compute_dtype(boxes.dtype, scores.dtype)
    scores = scores.astype(dtype)[None]
    decoded = decode_boxes(boxes, dtype=dtype)
    groups = _dense_groups(idxs)
    kept = detect(lambda f: decoded.map(lambda x: x[f]), scores,
                  lambda s: priority_keys(s, n, exact_ranking),
                  score_candidates(scores, score_threshold), lambda f: groups[f],
                  capacity=n if pre_nms_top_k is None else pre_nms_top_k, slots=limit,
                  iou_threshold=torchvision_threshold(iou_threshold, dtype),
                  total=None if limit == n else limit)
    count = kept.found[0]
    out = jnp.where(jnp.arange(limit) < count, kept.element[0], -1)
    true = jnp.minimum(count + kept.cut[0], limit)[None]
    return (DynArray(out.astype(index_dtype()), count.reshape(1),
                     true_shape=true if track else None, fill_value=INDEX_FILL),)


BATCHED_NMS.kernel("xla")(_batched_kernel)
BATCHED_NMS.kernel("xla", modes=OpImplMode.HIGH_PERFORMANCE)(
    functools.partial(_batched_kernel, exact_ranking=False))


def batched_nms(boxes: jax.Array, scores: jax.Array, idxs: jax.Array,
                iou_threshold: float | jax.Array, *, max_output_size: int | None = None,
                score_threshold: float | jax.Array | None = None,
                pre_nms_top_k: int | None = None, impl_mode: str | OpImplMode | None = None,
                backend: str | None = None) -> DynArray:
    """torchvision-compatible ``batched_nms``: NMS independently within each class id.

    Args:
      boxes: ``[N, 4]`` float ``[x1, y1, x2, y2]`` (flipped corners are accepted and
        reordered, where torchvision would compute negative areas).
      scores: ``[N]`` float.
      idxs: ``[N]`` integer class id of each box; boxes of different ids never suppress
        each other. ``boxes``, ``scores`` and ``idxs`` may be DynArrays (e.g. gathered
        with the indices of ``jaxops.nonzero(..., size=)``): only rows in every valid region
        are candidates, and rows lost upstream count in the result's ``true_shape`` (an
        upper bound then), so ``overflowed()`` reports them.
      iou_threshold: in ``[0, 1]``; suppress boxes with IoU strictly greater. A float JAX
        scalar (traced or not) is an operand: one compile serves every value.
      max_output_size: the most kept over all classes, the best by score: the per-image
        cap (torchvision's ``detections_per_img``, TensorRT's ``keepTopK``); ``None`` keeps
        all. It is a selection limit, not a capacity.
      score_threshold: only scores strictly greater are candidates (``None``: all).
      pre_nms_top_k: the most candidates; the best by score stay (ties to the lower index),
        and ``true_shape`` then counts the kept plus the candidates cut (at most the
        output's length), so ``overflowed()`` says whether a result may be missing.
      impl_mode: ``"high_precision"`` (default) or ``"high_performance"`` (see
        :func:`~jaxops.non_max_suppression`).
      backend: kernel backend (default: automatic).

    Returns:
      DynArray ``[min(N, max_output_size)]`` of kept indices by decreasing score over all
      classes (ties to the lower index), padded with -1. Differences from torchvision:
      NaN scores are never kept (torchvision sorts them first); thresholds outside
      ``[0, 1]`` raise; indices are int32 unless x64 is on.

    Examples:
      >>> import jax.numpy as jnp, jaxops
      >>> boxes = jnp.array([[0, 0, 10, 10], [1, 1, 11, 11], [1, 1, 11, 11.]])
      >>> kept = jaxops.batched_nms(boxes, jnp.array([0.9, 0.8, 0.7]), jnp.array([0, 0, 1]), 0.5)
      >>> jaxops.refresh(kept).tolist()
      [0, 2]
    """
    _shapes("batched_nms", boxes, scores, idxs)
    scores, boxes, extra, lost = valid_candidates("batched_nms", scores, boxes, 1, idxs=idxs)
    result = BATCHED_NMS(boxes, scores, extra["idxs"], iou_threshold=iou_threshold,
                         max_output_size=max_output_size, score_threshold=score_threshold,
                         pre_nms_top_k=pre_nms_top_k, impl_mode=impl_mode, backend=backend)[0]
    result = with_upstream_loss(result, lost, 0, limit=max_output_size)  # not N: it was cut
    warn_if_cut(result, "batched_nms", None)
    return result


def _limit(op: str, value) -> int:
    """``max_output_size`` checked under ``nms``'s name."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
        raise OpArgumentError(op, "max_output_size", "an int >= 0 or None", repr(value))
    return int(value)


def nms(boxes: jax.Array, scores: jax.Array, iou_threshold: float | jax.Array, *,
        max_output_size: int | None = None, score_threshold: float | jax.Array | None = None,
        pre_nms_top_k: int | None = None, impl_mode: str | OpImplMode | None = None,
        backend: str | None = None) -> DynArray:
    """torchvision-compatible single-class NMS: :func:`batched_nms` with one class.

    Args:
      boxes, scores, iou_threshold, max_output_size, score_threshold, pre_nms_top_k,
        impl_mode, backend: as :func:`batched_nms` (``max_output_size`` keeps the first
        ones by score, as TensorFlow's ``max_output_size`` and torchvision's
        ``detections_per_img``).

    Returns:
      DynArray ``[min(N, max_output_size)]`` of kept indices by decreasing score, padded
      with -1 (see :func:`batched_nms` for the differences from torchvision). As in
      torchvision, a box with a NaN or infinite coordinate neither suppresses nor is
      suppressed (see :mod:`jaxops.ops.nms.suppression`).

    Examples:
      >>> import jax.numpy as jnp, jaxops
      >>> boxes = jnp.array([[0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30.]])
      >>> kept = jaxops.nms(boxes, jnp.array([0.5, 0.9, 0.7]), 0.5, max_output_size=1)
      >>> jaxops.refresh(kept).tolist()
      [1]
    """
    _shapes("nms", boxes, scores)
    scores, boxes, _, lost = valid_candidates("nms", scores, boxes, 1)
    check_fits("nms", "boxes", boxes)  # before jnp.asarray narrows them
    check_fits("nms", "scores", scores)
    boxes, scores = jnp.asarray(boxes), jnp.asarray(scores)
    for arg, x in (("boxes", boxes), ("scores", scores)):  # named here, not BatchedNMS
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise OpDTypeError("nms", arg, "a float array (as torchvision's nms)", str(x.dtype),
                               "Pass float coordinates, e.g. [[0., 0., 1., 1.]].")
    result = BATCHED_NMS(boxes, scores, jnp.zeros(scores.shape, jnp.int32),
                         iou_threshold=iou_threshold,
                         max_output_size=None if max_output_size is None
                         else _limit("nms", max_output_size),
                         score_threshold=score_threshold, pre_nms_top_k=pre_nms_top_k,
                         impl_mode=impl_mode, backend=backend)[0]
    result = with_upstream_loss(result, lost, 0, limit=max_output_size)
    warn_if_cut(result, "nms", None)
    return result
