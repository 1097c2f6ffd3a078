"""Greedy non-maximum suppression, tiled so that XLA runs it as a few dozen vector steps.

Greedy NMS walks the candidates in priority order and keeps one when no kept box
suppresses it. Done box by box that is thousands of tiny sequential steps, which XLA runs
slowly. Here the candidates are cut into tiles of ``T`` boxes and each tile takes one step:

1. its candidates are tested against every box kept so far, which sit compacted in a
   buffer and are read in blocks (``T x block`` vector steps, as many as the kept boxes
   need — so the work is about ``N x kept``, as in ONNX Runtime's loop, not ``N x N``);
2. the greedy decisions inside the tile are resolved with a fixed-point iteration on the
   tile's ``T x T`` suppression matrix ``S``: ``keep = cand & ~any(keep[i] & S[i, j])``.
   After ``i`` iterations the first ``i`` decisions equal the sequential greedy ones and
   the fixed point is unique, so stopping when nothing changes gives exactly the greedy
   result — usually after a handful of iterations (the longest chain of suppressions
   inside the tile);
3. the tile's kept boxes are appended to the buffer.

The loop stops once ``max_output`` boxes are kept or no candidate is left. Measured on the
CPU against ONNX Runtime's kernel (benchmarks/cases_nms.py, 5000 boxes): this runs at
0.2-0.3x its time on scattered boxes; pushing each tile's suppression onto all later boxes
instead was as fast there but 2-5x slower on clustered boxes, many classes or an early
stop; a box-by-box ``fori_loop`` (each step vectorised over all boxes) took 2.5x longer.

>>> import jax.numpy as jnp
>>> from jaxops.ops.nms.iou import decode_boxes
>>> b = decode_boxes(jnp.array([[0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30.]]))
>>> keep, count = greedy_nms(b, jnp.array([True, True, True]), 0.5, max_output=3)
>>> keep.tolist(), int(count)
([True, False, True], 2)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jaxops.core.float_bits import greater, ordered_bits
from jaxops.ops.nms.iou import Boxes, suppresses

__all__ = [
    "BLOCK", "TILE", "greedy_nms", "priority_order", "score_candidates", "sorted_nms",
]

TILE = 128   # candidates decided per step
BLOCK = 256  # kept boxes read per step of the test against earlier tiles


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def greedy_nms(boxes: Boxes, valid: jax.Array, iou_threshold: float, max_output: int, *,
               groups: jax.Array | None = None, inclusive: bool = False, tile: int = TILE, block: int = BLOCK) -> tuple[jax.Array, jax.Array]:
    """Greedy NMS over candidates that are already in priority order (best first).

    Args:
      boxes: decoded candidate boxes, fields ``[L]``.
      valid: ``[L]`` bool; invalid candidates are never kept and suppress nothing.
      iou_threshold: see :func:`jaxops.ops.nms.iou.suppresses`.
      max_output: stop after this many kept boxes (static).
      groups: optional ``[L]`` int class ids; a box suppresses only boxes of its own group.
      inclusive: the overlap test, see :func:`jaxops.ops.nms.iou.suppresses`.
      tile, block: step sizes (for tests and tuning); small problems use smaller tiles.

    Returns:
      ``(keep, count)``: ``keep`` is ``[L]`` bool, ``count`` the number kept (int32).
    """
    n = valid.shape[0]
    if n == 0 or max_output <= 0:
        return jnp.zeros((n,), bool), jnp.zeros((), jnp.int32)
    tile = min(tile, max(8, 1 << (n - 1).bit_length()))
    n_tiles = -(-n // tile)
    padded = n_tiles * tile
    block = min(block, _round_up(min(max_output, n), tile))
    capacity = _round_up(min(max_output, n), block)
    fields = jnp.pad(jnp.stack(boxes), ((0, 0), (0, padded - n)))          # [5, padded]
    valid = jnp.pad(valid, (0, padded - n))
    groups = None if groups is None else jnp.pad(groups.astype(jnp.int32), (0, padded - n))
    before = jnp.arange(tile)[:, None] < jnp.arange(tile)[None, :]         # i earlier than j

    def test(a: jax.Array, b: jax.Array, ga, gb) -> jax.Array:
        """[len(a), len(b)]: does box a[i] suppress box b[j] (same group)?"""
        s = suppresses(Boxes(*a[:, :, None]), Boxes(*b[:, None, :]), iou_threshold,
                       inclusive=inclusive)
        return s if ga is None else s & (ga[:, None] == gb[None, :])

    def resolve(cand: jax.Array, s_tile: jax.Array) -> jax.Array:
        """Greedy decisions inside one tile by fixed-point iteration (see module doc)."""
        def step(state):
            keep, _ = state
            new = cand & ~jnp.any(keep[:, None] & s_tile, axis=0)
            return new, jnp.any(new != keep)
        return lax.while_loop(lambda st: st[1], step, (cand, jnp.bool_(True)))[0]

    def decide(t, kept, kept_groups, count, keep, pull: bool):
        start = t * tile
        rows = lax.dynamic_slice_in_dim(fields, start, tile, axis=1)
        row_groups = None if groups is None else lax.dynamic_slice_in_dim(groups, start, tile)
        cand = lax.dynamic_slice_in_dim(valid, start, tile)
        if pull:  # tested against every box kept by earlier tiles, a block at a time
            def one_block(state):
                j, hit = state
                kb = lax.dynamic_slice_in_dim(kept, j * block, block, axis=1)
                kg = None if groups is None else lax.dynamic_slice_in_dim(kept_groups, j * block, block)
                s = test(kb, rows, kg, row_groups)
                s &= (j * block + jnp.arange(block) < count)[:, None]
                return j + 1, hit | jnp.any(s, axis=0)
            n_blocks = (count + block - 1) // block
            # Stop reading blocks once every candidate of the tile is suppressed.
            _, hit = lax.while_loop(lambda st: (st[0] < n_blocks) & ~jnp.all(st[1] | ~cand),
                                    one_block, (jnp.int32(0), jnp.zeros((tile,), bool)))
            cand &= ~hit
        k = resolve(cand, test(rows, rows, row_groups, row_groups) & before)
        rank = jnp.cumsum(k, dtype=jnp.int32)
        k &= rank <= max_output - count
        dest = jnp.where(k, count + rank - 1, capacity)                      # capacity: dropped
        kept = kept.at[:, dest].set(rows, mode="drop")
        if groups is not None:
            kept_groups = kept_groups.at[dest].set(row_groups, mode="drop")
        keep = lax.dynamic_update_slice_in_dim(keep, k, start, 0)
        return t + 1, kept, kept_groups, count + jnp.sum(k, dtype=jnp.int32), keep

    state = (jnp.int32(0), jnp.zeros((5, capacity), fields.dtype),
             None if groups is None else jnp.zeros((capacity,), jnp.int32),
             jnp.zeros((), jnp.int32), jnp.zeros((padded,), bool))
    if n_tiles == 1:  # nothing kept before the only tile: no loops (cheaper to compile)
        state = decide(*state, pull=False)
    else:
        ids = jnp.arange(padded, dtype=jnp.int32)
        active_end = jnp.max(jnp.where(valid, ids + 1, 0))  # no candidate after this

        def more(state):
            t, _, _, count, _ = state
            return (t < n_tiles) & (t * tile < active_end) & (count < max_output)

        state = lax.while_loop(more, lambda st: decide(*st, pull=True), state)
    _, _, _, count, keep = state
    return keep[:n], count


def score_candidates(scores: jax.Array, score_threshold: float | None, *,
                     inclusive: bool = False) -> jax.Array:
    """Which scores are candidates: not NaN and ``> score_threshold`` (``>=`` with
    ``inclusive``, TensorRT's filter); every non-NaN score when the threshold is None."""
    if score_threshold is None:
        return ~jnp.isnan(scores)
    return greater(scores, score_threshold, inclusive)  # on the bits; NaN: never


_MAX_FAST_ORDER = 1 << 15  # the fast ordering packs a rank and an index into one int32


def priority_order(scores: jax.Array, valid: jax.Array, exact: bool = True) -> jax.Array:
    """Indices sorting the last axis: valid candidates first by decreasing score, ties
    (including +0.0 / -0.0) to the lower index, then the invalid ones.

    XLA's CPU sort is fast for one int32 operand and ~4x slower with several operands, so
    for float32 scores and up to 2**15 boxes the order comes from one-operand sorts of
    order-preserving int32 keys of the scores. ``exact`` packs ``(first rank of the key)
    << b | index`` (``b`` index bits) after a first sort of the keys, which sorts ties by
    index. ``exact=False`` (the high-performance mode) packs the key's top ``32 - b`` bits
    with the index instead and sorts once: scores whose bit patterns differ only in their
    low ``b`` bits (13 of 23 mantissa bits for 5000 boxes) are then ranked by index. Other
    inputs take one stable multi-operand sort.
    """
    n = scores.shape[-1]
    ids = lax.broadcasted_iota(jnp.int32, scores.shape, scores.ndim - 1)
    if scores.dtype != jnp.float32 or n > _MAX_FAST_ORDER:
        return lax.sort((~valid, ~ordered_bits(scores), ids), num_keys=2, is_stable=True)[2]
    index_bits = max(1, (n - 1).bit_length())
    ascending = lax.bitcast_convert_type(ordered_bits(scores) ^ jnp.uint32(1 << 31), jnp.int32)
    key = jnp.where(valid, ~ascending, jnp.iinfo(jnp.int32).max)   # descending, invalid last
    if exact:
        rank = jnp.vectorize(lambda s, k: jnp.searchsorted(s, k, side="left"),
                             signature="(n),(n)->(n)")(lax.sort(key), key).astype(jnp.int32)
    else:
        rank = key >> index_bits  # arithmetic shift: keeps the order of the top bits
    return lax.sort((rank << index_bits) | ids) & ((1 << index_bits) - 1)


def sorted_nms(boxes: Boxes, scores: jax.Array, valid: jax.Array, iou_threshold: float,
               max_output: int, *, groups: jax.Array | None = None,
               exact_ranking: bool = True) -> tuple[jax.Array, jax.Array]:
    """Single-problem NMS (``IoU > t``) in priority order.

    Args:
      boxes: decoded boxes, fields ``[N]``; scores, valid: ``[N]``.
      iou_threshold, groups: as for :func:`greedy_nms`.
      max_output: most boxes kept (static).
      exact_ranking: ``False`` ranks on the scores' leading bits (see
        :func:`priority_order`).

    Returns:
      ``(order, keep)``: ``order`` (int32 ``[N]``) lists the boxes best first (see
      :func:`priority_order`); ``keep[r]`` whether the box of rank ``r`` is kept.
    """
    order = priority_order(scores, valid, exact_ranking)
    keep, _ = greedy_nms(boxes.map(lambda f: f[order]), valid[order], iou_threshold,
                         max_output, groups=None if groups is None else groups[order])
    return order, keep
