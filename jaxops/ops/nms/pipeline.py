"""The xla NMS of one image, start to end: candidates, orders, bitmask, limits.

:func:`detect` is what the NMS operators' xla kernels run, each with its own scores layout,
box decoding, groups and limits (see :mod:`.candidates` for the steps and
:mod:`.bitmask` for the suppression). Everything is data-parallel over the images
(``P``) and the candidates, except the bitmask's walk over 64-candidate blocks.

Its cost follows the candidates, not the capacity: the sorts, the bitmask and the
gathering of what was kept run at the smallest tier of the capacity ladder
(:mod:`jaxops.ops.ladder`) that holds every image's candidates. An image with 200
candidates among 20,000 (box, class) pairs walks 256 slots, not 20,000 (ONNX's plain call
on detection case B, ``benchmarks/detection.py``: 14-17x torchvision before, about 1.5x
with the ladder). A tier below the capacity only runs when nothing is cut, and what the
walk keeps does not depend on the slots it walks, so the result is the same at every
tier that runs.

>>> import jax.numpy as jnp
>>> from jaxops.ops.nms.iou import decode_boxes
>>> boxes = decode_boxes(jnp.array([[[0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30.]]]))
>>> scores = jnp.array([[0.9, 0.8, 0.7]])
>>> d = detect(lambda f: boxes.map(lambda x: jnp.take_along_axis(x, f, 1)), scores,
...            priority_keys, scores > 0, lambda f: f * 0, capacity=3, slots=3,
...            iou_threshold=0.5)
>>> d.element.tolist(), d.found.tolist()     # by priority: boxes 0 and 2 kept
([[0, 2, 0]], [2])
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxops.capacity.policy import warn_once
from jaxops.core.dynarray import DynArray
from jaxops.ops._conventions import read_input
from jaxops.ops.compaction import compact_indices
from jaxops.ops.ladder import climb, pad_to, tiers
from jaxops.ops.nms.bitmask import bitmask_nms
from jaxops.ops.nms.candidates import (Candidates, apply_limits, compacted, group_order, orders,
                                       priority_keys, select)
from jaxops.ops.nms.iou import Boxes

__all__ = ["Kept", "detect", "priority_keys", "tracks_true_shape", "valid_candidates",
           "warn_if_cut"]


class Kept(NamedTuple):
    """What NMS kept in each of ``P`` images:

    - ``element[p, :found[p]]``: the kept elements by priority, or with ``by_group`` by
      group (class) and then priority (ONNX's output order); 0 after them;
    - ``found``, ``count``, ``cut`` (``[P]`` int32): the kept, the candidates that passed
      the score filter, and those the capacity cut (the lowest by priority).
    """

    element: jax.Array
    found: jax.Array
    count: jax.Array
    cut: jax.Array


class _Walked(NamedTuple):
    """The walk over ``K`` candidate slots, by priority (rank ``r``): ``flat[p, r]`` the
    element of rank ``r`` (meaningless where not kept), ``kept[p, r]``, and
    ``by_group[p, s]`` the rank at position ``s`` of the group-major order."""

    flat: jax.Array
    kept: jax.Array
    by_group: jax.Array

    def padded(self, k: int) -> "_Walked":
        """Over ``k`` slots: the ones added are not kept and come last by group."""
        p, t = self.flat.shape
        extra = jnp.broadcast_to(jnp.arange(t, k, dtype=jnp.int32), (p, k - t))
        return _Walked(pad_to(self.flat, k, axis=1), pad_to(self.kept, k, axis=1),
                       jnp.concatenate([self.by_group, extra], axis=1))

    def gather(self, slots: int, by_group: bool, cands: Candidates) -> Kept:
        """The kept elements in their first ``min(slots, K)`` places (at most ``slots`` are
        kept)."""
        kept, flat = self.kept, self.flat
        if by_group:
            kept, flat = (jnp.take_along_axis(x, self.by_group, axis=1) for x in (kept, flat))
        width = min(slots, kept.shape[1])
        pos, found = jax.vmap(lambda k: compact_indices(k, width, fill_value=0))(kept)
        element = jnp.where(jnp.arange(width) < found[:, None],
                            jnp.take_along_axis(flat, pos, axis=1), 0)
        return Kept(element, found, cands.count, cands.cut)


#: The first pass walks the best FIRST_PASS x (the result's size) candidates (see detect).
FIRST_PASS = 4


def detect(boxes_of: Callable[[jax.Array], Boxes], scores: jax.Array,
           key: Callable[[jax.Array], jax.Array], passing: jax.Array,
           groups_of: Callable[[jax.Array], jax.Array], *, capacity: int, slots: int,
           iou_threshold, by_group: bool = False, inclusive: bool = False,
           group_bound: int | None = None, per_group: int | None = None,
           total: int | None = None, finish: Callable[[Kept], Any] | None = None) -> Any:
    """Greedy NMS per image over its scored elements, at the ladder's tier that holds the
    candidates (see the module docstring).

    When the result is limited (``total``, or ``per_group`` over ``group_bound`` groups) to
    far fewer than the tier's slots (``FIRST_PASS**2`` times fewer), a first pass walks
    only the best ``FIRST_PASS`` times that many. Its result is the full walk's whenever it
    can prove it: every candidate fitted, or it kept ``total`` already, or every group
    either reached ``per_group`` or had all its candidates in the pass (a candidate's fate
    depends only on the better candidates of its group). Else the full walk runs
    (``lax.cond``; under ``vmap`` both run).

    Args:
      boxes_of: element indices ``[P, K]`` -> their decoded boxes (fields ``[P, K]``).
      scores: ``[P, M]`` scores of the elements.
      key: the priority keys of scores, elementwise (:func:`priority_keys`), larger
        first, ties to the lower element; computed for the candidates only, or for every
        element where the capacity cuts.
      passing: ``[P, M]`` bool, the elements that passed the score filter.
      groups_of: element indices -> int group (class) of each; a box suppresses boxes of
        its own group only.
      capacity: ``K``, the most candidates per image (the best by priority are kept).
      slots: the length of :attr:`Kept.element`: at least the most an image can keep under
        the limits.
      iou_threshold: a float or traced scalar; ``inclusive``: TensorRT's ``IoU >= t``.
      by_group: the kept elements by group, then priority (else by priority).
      group_bound: a static ``G`` with ``0 <= group < G`` when known (a faster sort).
      per_group: the most kept per group (``None``: no limit).
      total: the most kept per image, the best by priority (``None``: no limit).
      finish: what the caller makes of the :class:`Kept` inside the tier, where its
        ``element`` has ``min(slots, t)`` columns (the same shapes at every tier); ``None``:
        the Kept, ``element`` padded to ``slots`` columns.
    """
    p, m = passing.shape
    k = min(capacity, m)
    steps = tiers(k)
    # Every tier takes the candidates compacted, but the top one when it holds every
    # element (k = M: nothing to compact, and no [P, M] positions made before the switch).
    cut = select(lambda: key(scores), passing, k) if k < m else None
    low = cut if cut is not None or len(steps) == 1 else compacted(passing, steps[-2])
    count = jnp.sum(passing, axis=1, dtype=jnp.int32) if low is None else low.count

    def keys_of(f):
        return key(jnp.take_along_axis(scores, f, axis=1))

    def at(t: int) -> Kept:
        if t < k:
            part = Candidates(low.flat[:, :t], low.valid[:, :t], count, low.cut)
        else:
            part = cut if cut is not None else Candidates(
                jnp.broadcast_to(jnp.arange(m, dtype=jnp.int32), (p, m)), passing, count,
                jnp.zeros_like(count))
        kept = _walk_candidates(part, boxes_of, keys_of, groups_of, iou_threshold, inclusive,
                                group_bound, per_group, total).gather(slots, by_group, part)
        return kept._replace(element=pad_to(kept.element, slots, axis=1)) if finish is None \
            else finish(kept)
    return climb(count, steps, at)


def _walk_candidates(cands: Candidates, boxes_of, keys_of, groups_of, iou_threshold,
                     inclusive, group_bound, per_group, total) -> _Walked:
    """NMS of the candidate slots ``cands`` (``[P, K]``), with the first pass (see
    :func:`detect`)."""
    p, k = cands.flat.shape
    groups = groups_of(cands.flat).astype(jnp.int32)
    order = orders(keys_of(cands.flat), cands, groups, group_bound)
    invalid = jnp.iinfo(jnp.int32).max

    def walk(by_priority, by_group):
        """NMS of the slots ``by_priority`` (the best R, best first); ``by_group``: their
        ranks in group-major order."""
        slot_g = jnp.take_along_axis(by_priority, by_group, axis=1)  # group-major
        valid_g = jnp.take_along_axis(cands.valid, slot_g, axis=1)
        groups_g = jnp.where(valid_g, jnp.take_along_axis(groups, slot_g, axis=1), invalid)
        kept_g = bitmask_nms(boxes_of(jnp.take_along_axis(cands.flat, slot_g, axis=1)),
                             valid_g, groups_g, iou_threshold, inclusive=inclusive)
        kept = apply_limits(kept_g, groups_g, by_group, per_group, total)
        return _Walked(jnp.take_along_axis(cands.flat, by_priority, axis=1), kept, by_group)

    need = total if total is not None else \
        None if per_group is None or group_bound is None else per_group * group_bound
    first = None if need is None else -(-max(FIRST_PASS * need, 256) // 64) * 64
    if first is None or FIRST_PASS * first > k:  # a pass over most slots: little to save,
        return walk(order.by_priority, order.by_group)  # and a second walk to compile

    best = order.by_priority[:, :first]
    best_valid = jnp.take_along_axis(cands.valid, best, axis=1)
    best_groups = jnp.where(best_valid, jnp.take_along_axis(groups, best, axis=1), invalid)
    small = walk(best, group_order(best_groups, group_bound))
    seen = jnp.sum(best_valid, axis=1) == jnp.sum(cands.valid, axis=1)
    proven = seen | (jnp.sum(small.kept, axis=1) >= (need if total is None else total))
    if total is None:  # per group: full, or all its candidates seen
        rows = jnp.arange(p)[:, None]

        def per(g, where):
            return jnp.zeros((p, group_bound + 1), jnp.int32).at[
                rows, jnp.where(where, g, group_bound)].add(1)[:, :group_bound]
        proven |= jnp.all((per(best_groups, small.kept) >= per_group)
                          | (per(best_groups, best_valid) == per(groups, cands.valid)), axis=1)
    return lax.cond(jnp.all(proven), lambda: small.padded(k),
                    lambda: walk(order.by_priority, order.by_group))


def tracks_true_shape(size: int | None, pre_nms_top_k: int | None, elements: int) -> bool:
    """Whether an NMS output carries a true shape: a capacity that can cut it (``size``)
    or a candidate capacity below the ``elements`` an image has."""
    return size is not None or (pre_nms_top_k is not None and pre_nms_top_k < elements)


def warn_if_cut(result: DynArray, op: str, size: int | None) -> None:
    """Eagerly, without a capacity of its own (``size``), an NMS result overflows only when
    candidates that could have been kept were cut by ``pre_nms_top_k`` or lost upstream (an
    overflowed DynArray input): say so once per call site."""
    if size is None and result.true_shape is not None \
            and not isinstance(result.data, jax.core.Tracer):
        lost = int(np.sum(np.asarray(result.lost(axis=0))))
        if lost:
            warn_once(f"{op}: candidates that could have been kept were cut by pre_nms_top_k "
                      f"or lost upstream: up to {lost} results may be missing "
                      "(DynArray.lost(axis=0) bounds them, inside jit too). Pass a larger "
                      "pre_nms_top_k, or a larger capacity upstream.")


def valid_candidates(op: str, scores, boxes, per_box: int, **extra):
    """NMS inputs of which any may be a DynArray, read in their valid regions only.

    Returns ``(scores, boxes, extra, lost)``: the arrays, the scores NaN (never a
    candidate) outside a valid region — the scores', or a box's (``boxes [..., N, 4]``, or
    an ``extra`` input ``[N]`` such as class ids); ``lost`` (int32, or ``None`` when no input
    overflowed) bounds the candidates lost upstream: the most any input lost — the scores'
    lost elements, or ``per_box`` (the scores of a box) for every lost box or extra entry
    (inputs gathered from one overflowed list lose the same rows, so the losses overlap).
    """
    given = read_input(op, "scores", scores)
    rest = {"boxes": read_input(op, "boxes", boxes)} | {k: read_input(op, k, v)
                                                         for k, v in extra.items()}
    valid, lost = given.valid, [] if given.lost is None else [given.lost]
    for name, r in rest.items():
        if r.valid is not None:
            rows = jnp.all(r.valid, axis=-1) if name == "boxes" else r.valid   # [..., N]
            rows = rows[..., None, :] if rows.ndim < given.data.ndim else rows
            valid = rows if valid is None else valid & rows
        if r.lost is not None:
            lost.append((r.lost // 4 if name == "boxes" else r.lost) * per_box)
    data = given.data if valid is None else \
        jnp.where(valid, given.data, jnp.asarray(jnp.nan, given.data.dtype))
    return (data, rest["boxes"].data, {k: rest[k].data for k in extra},
            functools.reduce(jnp.maximum, lost) if lost else None)
