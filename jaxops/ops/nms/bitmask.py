"""Greedy NMS from a blocked IoU bitmask, as torchvision's CUDA kernel builds it.

torchvision's ``nms_kernel.cu`` splits the score-sorted boxes into blocks of 64 and computes,
for every box ``i`` and every block ``j`` at or after its own, one 64-bit word whose bit
``c`` says "box ``i`` suppresses box ``64 j + c``" (``nms_kernel_impl``); that part is
data-parallel. Then one pass walks the blocks in order (``gather_keep_from_mask``): a
block's candidates are those not yet removed, its survivors are decided inside the block,
and each survivor ORs its row of words into the removed words of the later blocks. Only
that walk is sequential, one step per 64 candidates, and its steps are word operations.

Here every problem (an image) runs that scheme with three changes:

- **Groups.** Candidates come sorted by group (class) first, then by priority, so a box
  can only suppress boxes of its own group, which lie in the blocks up to its group's
  end. Block ``t`` needs the words of diagonals ``d = 0 .. span(t)`` only (block
  ``t + d``), not all later blocks: class-aware NMS costs about ``K x 64 x span`` IoUs
  instead of ``K^2 / 2``.
- **The band.** Diagonals ``0 .. band - 1`` are computed up front, data-parallel over every
  block of every problem (a loop over diagonals that stops at the longest span); a group
  longer than the band gets its farther diagonals computed in the walk, for the block at
  hand only (so the result never depends on the band; only the cost does).
- **Inside a block** the survivors are found by a fixed-point iteration on the block's
  upper-triangular word rows (``keep = cand & ~OR(rows of kept)``): after ``i`` rounds the
  first ``i`` decisions are the sequential ones and the fixed point is unique, so it ends
  with exactly the greedy result, usually after a few rounds (the longest suppression
  chain in the block). torchvision's loop over the 64 bits is the same computation done
  one bit at a time.

Words are pairs of ``uint32`` (``[..., 2]``: bits 0-31, then 32-63), so the kernel runs
the same with ``jax_enable_x64`` off and on.

>>> import jax.numpy as jnp
>>> from jaxops.ops.nms.iou import decode_boxes
>>> b = decode_boxes(jnp.array([[[0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30.]]]))
>>> bitmask_nms(b, jnp.array([[True] * 3]), jnp.zeros((1, 3), jnp.int32), 0.5).tolist()
[[True, False, True]]
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jaxops.ops.nms.iou import Boxes, suppresses

__all__ = ["BAND", "WORD", "bitmask_nms"]

WORD = 64  # candidates per block: one 64-bit mask word per box and block
BAND = 8  # diagonals computed up front (blocks of a group's first 512 candidates)

u32 = jnp.uint32
_BIT = jnp.arange(32, dtype=u32)


def _pack(bits: jax.Array) -> jax.Array:
    """bool ``[..., 64]`` -> words ``uint32 [..., 2]`` (bit ``c`` of the block)."""
    b = bits.reshape(*bits.shape[:-1], 2, 32).astype(u32)
    return jnp.sum(b << _BIT, axis=-1, dtype=u32)  # distinct bits: the sum is the OR


def _unpack(words: jax.Array) -> jax.Array:
    """Words ``uint32 [..., 2]`` -> bool ``[..., 64]``."""
    return ((words[..., None] >> _BIT) & 1).astype(bool).reshape(*words.shape[:-1], WORD)


def _or_rows(words: jax.Array, rows: jax.Array, axis: int) -> jax.Array:
    """OR of the word rows (along ``axis``) where ``rows`` is set."""
    picked = jnp.where(jnp.expand_dims(rows, -1), words, u32(0))
    return lax.reduce(picked, u32(0), lax.bitwise_or, (axis % picked.ndim,))


def _blocks(x: jax.Array, nb: int) -> jax.Array:
    """``[P, K] -> [P, nb, 64]``."""
    return x.reshape(x.shape[0], nb, WORD)


def bitmask_nms(boxes: Boxes, valid: jax.Array, groups: jax.Array, iou_threshold, *,
                inclusive: bool = False, band: int = BAND) -> jax.Array:
    """Greedy NMS of ``P`` independent problems of ``K`` candidates each.

    Args:
      boxes: decoded candidate boxes, fields ``[P, K]``, sorted by group, then by priority
        (best first) within the group.
      valid: ``[P, K]`` bool; invalid candidates are never kept and suppress nothing. The
        valid ones of a problem come first (``valid[p]`` is ``True`` then ``False``).
      groups: ``[P, K]`` int32, ascending along each row over the valid candidates; a box
        only suppresses boxes of its own group.
      iou_threshold: a float or a traced scalar (see :func:`~jaxops.ops.nms.iou.suppresses`).
      inclusive: the overlap test (TensorRT's ``IoU >= t``), see ``suppresses``.
      band: diagonals of the bitmask computed up front (for tests and tuning; the result
        does not depend on it).

    Returns:
      ``[P, K]`` bool: whether each candidate is kept (greedy within its group, no limit).
    """
    p, k = valid.shape
    if k == 0:
        return jnp.zeros((p, 0), bool)
    nb = -(-k // WORD)
    pad = nb * WORD - k
    band = max(1, min(band, nb))
    groups = groups.astype(jnp.int32)
    if pad:
        boxes = boxes.map(lambda f: jnp.pad(f, ((0, 0), (0, pad))))
        valid = jnp.pad(valid, ((0, 0), (0, pad)))
        groups = jnp.pad(groups, ((0, 0), (0, pad)), constant_values=jnp.iinfo(jnp.int32).max)

    # The block each block's groups end in: span(t) = last block reached - t.
    ids = jnp.arange(nb * WORD, dtype=jnp.int32)
    ends_here = jnp.concatenate([groups[:, 1:] != groups[:, :-1],
                                 jnp.ones((p, 1), bool)], axis=1)
    seg_end = lax.cummin(jnp.where(ends_here, ids + 1, nb * WORD), axis=1, reverse=True)
    reach = jnp.max(jnp.where(valid, (seg_end - 1) // WORD, -1).reshape(p, nb, WORD), axis=2)
    span = jnp.maximum(reach - jnp.arange(nb, dtype=jnp.int32), 0)      # [P, nb]
    active = (jnp.sum(valid, axis=1, dtype=jnp.int32) + WORD - 1) // WORD  # [P] blocks in use

    # Blocked operands, padded by `band` empty blocks so diagonal d reads block t + d.
    def blocked(x, fill):
        x = _blocks(x, nb)
        return jnp.pad(x, ((0, 0), (0, 2 * band), (0, 0)), constant_values=fill)
    fields = [blocked(f, 0) for f in boxes]
    bvalid, bgroups = blocked(valid, False), blocked(groups, -1)
    upper = jnp.arange(WORD)[:, None] < jnp.arange(WORD)[None, :]       # row r before col c

    def masks(rows: list, rgroup, cols: list, cgroup, cvalid, diagonal) -> jax.Array:
        """Words of every (row box, column block) pair: ``[..., 64 rows, 2]``."""
        s = suppresses(Boxes(*(f[..., :, None] for f in rows)),
                       Boxes(*(f[..., None, :] for f in cols)), iou_threshold,
                       inclusive=inclusive)
        s &= (rgroup[..., :, None] == cgroup[..., None, :]) & cvalid[..., None, :]
        s &= jnp.where(diagonal, upper, True)  # diagonal 0: only later boxes of the block
        return _pack(s)

    def shifted(x, d):
        return lax.dynamic_slice_in_dim(x, d, nb, axis=1)

    rows_now = [f[:, :nb] for f in fields]

    def diagonal(state):
        d, store = state
        words = masks(rows_now, bgroups[:, :nb], [shifted(f, d) for f in fields],
                      shifted(bgroups, d), shifted(bvalid, d), d == 0)    # [P, nb, 64, 2]
        return d + 1, lax.dynamic_update_slice_in_dim(store, words[:, :, None], d, axis=2)

    up_front = jnp.minimum(jnp.max(span) + 1, band)
    store = jnp.zeros((p, nb, band, WORD, 2), u32)
    _, store = lax.while_loop(lambda st: st[0] < up_front, diagonal, (jnp.int32(0), store))

    valid_words = _pack(_blocks(valid, nb))                              # [P, nb, 2]

    def resolve(cand_words, rows):
        """Survivors of one block: the fixed point of keep = cand & ~OR(rows of keep)."""
        cand = _unpack(cand_words)                                       # [P, 64]

        def again(state):
            keep, _ = state
            new = cand & ~_unpack(_or_rows(rows, keep, axis=-2))
            return new, jnp.any(new != keep)
        return lax.while_loop(lambda st: st[1], again, (cand, jnp.bool_(True)))[0]

    def far(t, kept, removed):
        """Diagonals past the band, for block t's kept boxes, ``band`` blocks at a time,
        while a group of the block reaches them."""
        rows = [lax.dynamic_index_in_dim(f, t, axis=1, keepdims=False) for f in fields]
        rgroup = lax.dynamic_index_in_dim(bgroups, t, axis=1, keepdims=False)
        last = jnp.max(lax.dynamic_index_in_dim(span, t, axis=1, keepdims=False))

        def chunk(state):
            d, removed = state
            col = t + d

            def cols(x):
                return lax.dynamic_slice_in_dim(x, col, band, axis=1)    # [P, band, 64]
            words = masks([f[:, None] for f in rows], rgroup[:, None], [cols(f) for f in fields],
                          cols(bgroups), cols(bvalid), False)             # [P, band, 64, 2]
            hit = _or_rows(words, kept[:, None, :], axis=-2)              # [P, band, 2]
            now = lax.dynamic_slice_in_dim(removed, col, band, axis=1)
            return d + band, lax.dynamic_update_slice_in_dim(removed, now | hit, col, axis=1)
        return lax.while_loop(lambda st: st[0] <= last, chunk, (jnp.int32(band), removed))[1]

    def walk(state):
        t, removed, keep = state
        cand = lax.dynamic_index_in_dim(valid_words, t, axis=1, keepdims=False) & \
            ~lax.dynamic_index_in_dim(removed, t, axis=1, keepdims=False)
        rows = lax.dynamic_index_in_dim(store, t, axis=1, keepdims=False)  # [P, band, 64, 2]
        kept = resolve(cand, rows[:, 0])
        hit = _or_rows(rows, kept[:, None, :], axis=-2)                   # [P, band, 2]
        later = lax.dynamic_slice_in_dim(removed, t, band, axis=1)
        removed = lax.dynamic_update_slice_in_dim(removed, later | hit, t, axis=1)
        if band < nb:
            removed = lax.cond(jnp.max(lax.dynamic_index_in_dim(span, t, axis=1,
                                                                keepdims=False)) >= band,
                               far, lambda t, k, r: r, t, kept, removed)
        keep = lax.dynamic_update_index_in_dim(keep, kept, t, axis=1)
        return t + 1, removed, keep

    removed = jnp.zeros((p, nb + 2 * band, 2), u32)
    keep = jnp.zeros((p, nb, WORD), bool)
    _, _, keep = lax.while_loop(lambda st: st[0] < jnp.max(active), walk,
                                (jnp.int32(0), removed, keep))
    return keep.reshape(p, nb * WORD)[:, :k]
