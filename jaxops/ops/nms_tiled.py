"""Greedy non-maximum suppression, tiled so that XLA runs it as a few dozen vector steps.

Greedy NMS walks the candidates in priority order and keeps one when no kept box
suppresses it. Done box by box that is thousands of tiny sequential steps, which XLA runs
slowly. Here the candidates are cut into tiles of ``T`` (64–256) boxes and each tile takes
one step:

1. its candidates are the boxes no kept box of an earlier tile has suppressed;
2. the greedy decisions inside the tile are resolved with a fixed-point iteration on the
   tile's ``T x T`` suppression matrix ``S``: ``keep = cand & ~any(keep[i] & S[i, j])``.
   Iterate ``i`` times and the first ``i`` decisions equal the sequential greedy ones, and
   the fixed point is unique, so stopping when nothing changes gives exactly the greedy
   result — usually after a handful of iterations (the length of the longest chain of
   suppressions inside the tile);
3. the tile's kept boxes suppress all later boxes at once (a ``T x W`` vector step).

Step 3 only needs the columns after the tile. Shapes must be static, so the tiles are split
into a few *phases*, each with its own static column window (the columns from the phase's
first tile on): with ``P`` phases the work is about ``(1 + 1/P) / 2`` of the full ``N x N``
IoU matrix. The loop stops early once ``max_output`` boxes are kept or no candidate is left.

>>> import jax.numpy as jnp
>>> from jaxops.ops.iou import decode_boxes
>>> b = decode_boxes(jnp.array([[0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30.]]))
>>> keep, count = greedy_nms(b, jnp.array([True, True, True]), 0.5, max_output=3)
>>> keep.tolist(), int(count)
([True, False, True], 2)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxops.ops.iou import Boxes, suppresses

MAX_TILE = 256
MAX_PHASES = 8


def tile_plan(n: int, tile: int | None = None, phases: int | None = None) -> tuple[int, list[int]]:
    """The tile size and the first tile of each phase (plus the end) for ``n`` candidates.

    >>> tile_plan(5000)
    (256, [0, 2, 5, 8, 10, 12, 15, 18, 20])
    >>> tile_plan(10)
    (16, [0, 1])
    """
    if tile is None:
        tile = min(MAX_TILE, max(8, 1 << max(n - 1, 0).bit_length()))
    n_tiles = -(-n // tile)
    phases = min(MAX_PHASES if phases is None else phases, n_tiles)
    bounds = np.linspace(0, n_tiles, phases + 1).round().astype(int) if n_tiles else [0]
    return tile, [int(b) for b in bounds]


def greedy_nms(boxes: Boxes, valid: jax.Array, iou_threshold: float, max_output: int, *,
               groups: jax.Array | None = None, inclusive: bool = False, exact: bool = True,
               tile: int | None = None, phases: int | None = None) -> tuple[jax.Array, jax.Array]:
    """Greedy NMS over candidates that are already in priority order (best first).

    Args:
      boxes: decoded candidate boxes, fields ``[L]``.
      valid: ``[L]`` bool; invalid candidates are never kept and suppress nothing.
      iou_threshold: see :func:`jaxops.ops.iou.suppresses`.
      max_output: stop after this many kept boxes (static).
      groups: optional ``[L]`` int class ids; a box suppresses only boxes of its own group.
      inclusive, exact: the overlap test, see :func:`jaxops.ops.iou.suppresses`.
      tile, phases: override the :func:`tile_plan` (for tests and tuning).

    Returns:
      ``(keep, count)``: ``keep`` is ``[L]`` bool, ``count`` the number kept (int32).
    """
    n = valid.shape[0]
    if n == 0 or max_output <= 0:
        return jnp.zeros((n,), bool), jnp.zeros((), jnp.int32)
    tile, bounds = tile_plan(n, tile, phases)
    padded = bounds[-1] * tile
    pad = padded - n
    boxes = boxes.map(lambda f: jnp.pad(f, (0, pad)))
    valid = jnp.pad(valid, (0, pad))
    groups = None if groups is None else jnp.pad(groups.astype(jnp.int32), (0, pad))
    ids = jnp.arange(padded, dtype=jnp.int32)
    # One past the last valid candidate: tiles beyond it have nothing to decide.
    active_end = jnp.max(jnp.where(valid, ids + 1, 0))

    def overlap(start: jax.Array, col0: int) -> jax.Array:
        """[T, W]: does tile row i suppress column j (columns from ``col0`` on, j > i)?"""
        rows = boxes.map(lambda f: lax.dynamic_slice_in_dim(f, start, tile)[:, None])
        cols = boxes.map(lambda f: f[None, col0:])
        s = suppresses(rows, cols, iou_threshold, inclusive=inclusive, exact=exact)
        s &= ids[None, col0:] > (start + jnp.arange(tile, dtype=jnp.int32))[:, None]
        if groups is not None:
            s &= lax.dynamic_slice_in_dim(groups, start, tile)[:, None] == groups[None, col0:]
        return s

    def resolve(cand: jax.Array, s_tile: jax.Array) -> jax.Array:
        """Greedy decisions inside one tile by fixed-point iteration (see module doc)."""
        def step(state):
            keep, _ = state
            new = cand & ~jnp.any(keep[:, None] & s_tile, axis=0)
            return new, jnp.any(new != keep)
        return lax.while_loop(lambda st: st[1], step, (cand, jnp.bool_(True)))[0]

    suppressed, keep, count = ~valid, jnp.zeros((padded,), bool), jnp.zeros((), jnp.int32)
    for first, end in zip(bounds[:-1], bounds[1:]):
        col0 = first * tile

        def body(state, col0=col0):
            t, suppressed, keep, count = state
            start = t * tile
            s = overlap(start, col0)
            cand = ~lax.dynamic_slice_in_dim(suppressed, start, tile)
            k = resolve(cand, lax.dynamic_slice_in_dim(s, start - col0, tile, axis=1))
            k &= jnp.cumsum(k, dtype=jnp.int32) <= max_output - count
            hit = jnp.any(k[:, None] & s, axis=0)
            suppressed = suppressed.at[col0:].set(suppressed[col0:] | hit)
            keep = lax.dynamic_update_slice_in_dim(keep, k, start, 0)
            return t + 1, suppressed, keep, count + jnp.sum(k, dtype=jnp.int32)

        def more(state, end=end):
            t, _, _, count = state
            return (t < end) & (t * tile < active_end) & (count < max_output)

        state = (jnp.int32(first), suppressed, keep, count)
        if end - first == 1:  # one tile: no loop, cheaper to compile (and always correct)
            _, suppressed, keep, count = body(state)
        else:
            _, suppressed, keep, count = lax.while_loop(more, body, state)
    return keep[:n], count


def score_candidates(scores: jax.Array, score_threshold: float | None, *,
                     inclusive: bool = False) -> jax.Array:
    """Which scores are candidates: not NaN and ``> score_threshold`` (``>=`` with
    ``inclusive``, TensorRT's filter); every non-NaN score when the threshold is None."""
    if score_threshold is None:
        return ~jnp.isnan(scores)
    t = jnp.asarray(score_threshold, scores.dtype)
    return scores >= t if inclusive else scores > t  # NaN compares False: never a candidate


def priority_order(scores: jax.Array, valid: jax.Array) -> jax.Array:
    """Indices sorting the last axis: valid candidates first by decreasing score, ties
    (including +0.0 / -0.0) to the lower index, then the invalid ones."""
    ids = lax.broadcasted_iota(jnp.int32, scores.shape, scores.ndim - 1)
    return lax.sort((~valid, -scores, ids), num_keys=2, is_stable=True)[2]


def sorted_nms(boxes: Boxes, scores: jax.Array, valid: jax.Array, iou_threshold: float,
               max_output: int, *, groups: jax.Array | None = None, exact: bool = True
               ) -> tuple[jax.Array, jax.Array]:
    """Single-problem NMS (``IoU > t``) in priority order.

    Args:
      boxes: decoded boxes, fields ``[N]``; scores, valid: ``[N]``.
      iou_threshold, groups, exact: as for :func:`greedy_nms`.
      max_output: most boxes kept (static).

    Returns:
      ``(order, keep)``: ``order`` (int32 ``[N]``) lists the boxes best first (see
      :func:`priority_order`); ``keep[r]`` whether the box of rank ``r`` is kept.
    """
    order = priority_order(scores, valid)
    keep, _ = greedy_nms(boxes.map(lambda f: f[order]), valid[order], iou_threshold,
                         max_output, groups=None if groups is None else groups[order],
                         exact=exact)
    return order, keep
