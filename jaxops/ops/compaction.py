"""Stream compaction: positions of the True entries of a mask, at a static capacity.

The one shared building block of NonZero, MaskedSelect, Unique and hash-table export.

>>> import jax.numpy as jnp
>>> idx, count = compact_indices(jnp.array([False, True, True, False, True]), size=2)
>>> idx.tolist(), int(count)
([1, 2], 3)

How it is fast on XLA's CPU backend (where ``jnp.nonzero(size=)`` is slow because a cumsum
and a scatter over every input element are slow there):

1. The mask is packed 32 bools to a ``uint32`` word and grouped into *units* of 4 words
   (128 mask bits). Only units, ``n / 128`` of them, get prefix sums and scatters: the
   output slot where each unit's first True lands, and the list of non-empty units.
2. Output slots are grouped into *chunks* of 32. For each chunk one scatter records which
   non-empty unit covers its first slot, and a 32-bit marker mask says at which of its slots
   a new unit starts. A slot then finds its unit with one popcount, and its bit inside the
   unit with a few more (select-the-r-th-set-bit) — gathers only, no per-element scatter.
3. Output slots are produced in tiles of 64K inside a loop that stops after the last valid
   slot, so the work is proportional to the number of results, not to the capacity.

Inputs up to ``_SMALL_N`` elements use the plain cumsum + scatter formulation, which is as
fast there and compiles faster. Both paths give identical results (tested against each
other).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from jax import lax

from jaxops.core.errors import OpArgumentError
from jaxops.ops.loops import fori_loop

__all__ = [
    "SlotFn", "compact_indices", "compact_map", "gather_valid",
]

_SMALL_N = 1 << 14  # mask length up to which the cumsum + scatter formulation is used
_WORD = 32  # mask bits per packed word
_UNIT_WORDS = 4  # words per unit: 128 mask bits share one prefix-sum entry
_UNIT = _WORD * _UNIT_WORDS
_CHUNK = 32  # output slots per chunk: one uint32 marker mask
_TILE = 1 << 16  # output slots produced per loop iteration
_DELTA_BITS = 7  # a chunk starts at most 127 slots into its unit

i32, u32 = jnp.int32, jnp.uint32

#: ``fn(flat_indices) -> tuple of arrays`` of the same length: what each valid slot holds.
SlotFn = Callable[[jax.Array], Sequence[jax.Array]]


def compact_indices(mask: jax.Array, size: int, fill_value: int = -1) -> tuple[jax.Array, jax.Array]:
    """Flat positions of the True entries of ``mask`` (flattened), in ascending order.

    Returns ``(indices, count)``: ``indices`` is int32 ``[size]`` holding the first
    ``min(count, size)`` positions followed by ``fill_value``; ``count`` is the total number
    of True entries (int32), which may exceed ``size`` — the caller reports the overflow.
    """
    (idx,), count = compact_map(mask, size, lambda i: (i,), (fill_value,))
    return idx, count


def compact_map(mask: jax.Array, size: int, fn: SlotFn, fill_values: Sequence) -> tuple[tuple, jax.Array]:
    """Compaction with a fused epilogue: ``fn`` applied to the compacted flat positions.

    ``fn`` receives int32 flat positions of True entries of ``mask`` (any shape, read
    row-major; non-bool masks count non-zero entries) and returns a tuple of equally long
    arrays, e.g. the coordinates of each position (NonZero) or values gathered at it. It is
    evaluated tile by tile inside the compaction loop, so its results are written once, and
    only for slots that hold results. ``fn`` must be elementwise in the positions; it is
    not differentiated (gather differentiable values outside, from ``compact_indices``).

    Returns ``(outputs, count)``: each output is ``[size]``, valid in its first
    ``min(count, size)`` entries and ``fill_values[k]`` after; ``count`` is the int32 number
    of True entries.

    >>> import jax.numpy as jnp
    >>> (rows, cols), n = compact_map(jnp.eye(3, dtype=bool), 4,
    ...                               lambda i: (i // 3, i % 3), (-1, -1))
    >>> rows.tolist(), cols.tolist(), int(n)
    ([0, 1, 2, -1], [0, 1, 2, -1], 3)
    """
    mask = jnp.asarray(mask)
    mask = (mask if mask.dtype == jnp.bool_ else mask != 0).reshape(-1)
    n = mask.shape[0]
    if n >= 2**31 - _UNIT:
        raise OpArgumentError("compact_map", "mask", f"fewer than 2**31 - {_UNIT} elements "
                              "(int32 positions)", n)
    size = int(size)
    if size < 0:
        raise OpArgumentError("compact_map", "size", "an int >= 0", size)
    fill_values = tuple(fill_values)
    if n <= _SMALL_N or size == 0:
        return _compact_scatter(mask, size, fn, fill_values)
    return _compact_blocked(mask, size, fn, fill_values)


def gather_valid(values: jax.Array, indices: jax.Array, count: jax.Array, fill_value) -> jax.Array:
    """``values[indices]`` in the valid slots (``slot < count``), ``fill_value`` after.

    The companion of :func:`compact_indices` for differentiable values: the gradient flows
    back to the gathered positions only.
    """
    valid = jnp.arange(indices.shape[0], dtype=i32) < count
    safe = jnp.clip(indices, 0, max(values.shape[0] - 1, 0))
    taken = values[safe] if values.shape[0] else jnp.zeros(indices.shape, values.dtype)
    return jnp.where(valid, taken, jnp.asarray(fill_value, values.dtype))


def _fill_invalid(outputs, slot, count, fill_values):
    valid = slot < count
    return tuple(jnp.where(valid, o, jnp.asarray(f, o.dtype)) for o, f in zip(outputs, fill_values))


def _compact_scatter(mask, size, fn, fill_values):
    """Small inputs: inclusive cumsum gives each True entry its slot; one scatter."""
    slot = jnp.cumsum(mask, dtype=i32) - 1
    count = slot[-1] + 1 if mask.shape[0] else jnp.zeros((), i32)
    dst = jnp.where(mask & (slot < size), slot, size)  # everything else is dropped
    idx = jnp.zeros((size,), i32).at[dst].set(jnp.arange(mask.shape[0], dtype=i32), mode="drop")
    slots = jnp.arange(size, dtype=i32)
    return _fill_invalid(tuple(fn(idx)), slots, count, fill_values), count


# -- the blocked algorithm (see the module docstring) ---------------------------------------
def _pack_words(mask: jax.Array) -> jax.Array:
    """bool ``[32 W]`` → uint32 ``[W]``, bit ``b`` of word ``w`` = ``mask[32 w + b]``."""
    w = mask.shape[0] // _WORD
    quads = lax.bitcast_convert_type(mask.astype(jnp.uint8).reshape(w * 8, 4), u32).reshape(w, 8)
    # Each uint32 holds 4 bytes of 0/1; the multiply gathers their low bits into bits 24..27.
    nibbles = (quads * u32(0x01020408)) >> 24
    return jnp.sum(nibbles << (4 * jnp.arange(8, dtype=u32)), axis=1, dtype=u32)


def _select_bit(word: jax.Array, r: jax.Array) -> jax.Array:
    """Position of the ``r``-th (0-based) set bit of each uint32 ``word`` (binary search)."""
    pos = jnp.zeros(word.shape, i32)
    for half in (16, 8, 4, 2, 1):
        low = lax.population_count(word & u32((1 << half) - 1)).astype(i32)
        up = r >= low
        r = jnp.where(up, r - low, r)
        pos = jnp.where(up, pos + half, pos)
        word = jnp.where(up, word >> half, word)
    return pos


class _Directory:
    """Per-unit and per-chunk tables that let any output slot find its mask position."""

    def __init__(self, mask: jax.Array, n_chunks: int):
        n_units = -(-mask.shape[0] // _UNIT)
        mask = jnp.pad(mask, (0, n_units * _UNIT - mask.shape[0]))
        self.words = _pack_words(mask)
        per_word = lax.population_count(self.words).astype(i32).reshape(n_units, _UNIT_WORDS)
        per_unit = jnp.sum(per_word, axis=1, dtype=i32)
        nonempty = per_unit > 0
        inclusive = jnp.cumsum(jnp.stack([per_unit, nonempty.astype(i32)]), axis=1, dtype=i32)
        offset = inclusive[0] - per_unit  # output slot of each unit's first True entry
        rank = inclusive[1] - 1  # index of each non-empty unit among the non-empty ones
        self.count = inclusive[0, -1]
        # Slots before word i of a unit, for i = 1..3, packed 7 bits each (each is <= 96).
        before = jnp.cumsum(per_word[:, :-1], axis=1, dtype=i32)
        packed_before = sum(before[:, i] << (7 * i) for i in range(_UNIT_WORDS - 1))

        # Tables indexed by the rank of a non-empty unit (sorted, unique scatter targets).
        dst = jnp.where(nonempty, rank, n_units)
        def by_rank(values):
            return jnp.zeros((n_units,), i32).at[dst].set(
                values, mode="drop", unique_indices=True, indices_are_sorted=True)
        self.unit_of = by_rank(jnp.arange(n_units, dtype=i32))
        self.before_of = by_rank(packed_before)
        offset_of = by_rank(offset)

        # Chunk tables: the unit covering the chunk's first slot, how far into that unit the
        # chunk starts, and a marker bit for every slot of the chunk where a unit starts.
        first_chunk = (offset + _CHUNK - 1) >> 5  # first chunk starting at/after offset
        covering = jnp.zeros((n_chunks,), i32).at[jnp.where(nonempty, first_chunk, n_chunks)].max(
            rank, mode="drop", indices_are_sorted=True)
        covering = lax.cummax(covering)
        delta = jnp.arange(n_chunks, dtype=i32) * _CHUNK - offset_of[covering]
        self.chunk_unit = (covering << _DELTA_BITS) | delta
        lane_of_start = offset & (_CHUNK - 1)
        starts_inside = nonempty & (lane_of_start != 0)
        self.markers = jnp.zeros((n_chunks,), u32).at[
            jnp.where(starts_inside, offset >> 5, n_chunks)].add(
            u32(1) << lane_of_start.astype(u32), mode="drop", indices_are_sorted=True)

    def positions(self, slot: jax.Array) -> jax.Array:
        """Mask position of the True entry landing in each (valid) output ``slot``."""
        chunk, lane = slot >> 5, slot & (_CHUNK - 1)  # shifts: jnp's // and % add sign fixes
        started = self.markers[chunk] & ((u32(2) << lane.astype(u32)) - u32(1))  # lanes <= lane
        chunk_unit = self.chunk_unit[chunk]
        k = (chunk_unit >> _DELTA_BITS) + lax.population_count(started).astype(i32)
        unit = self.unit_of[k]
        last_start = 31 - lax.clz(started).astype(i32)
        rank_in_unit = jnp.where(started != 0, lane - last_start,
                                 lane + (chunk_unit & ((1 << _DELTA_BITS) - 1)))
        before = self.before_of[k]
        word_in_unit = jnp.zeros_like(rank_in_unit)
        skipped = jnp.zeros_like(rank_in_unit)
        for i in range(_UNIT_WORDS - 1):
            b = (before >> (7 * i)) & 127
            later = rank_in_unit >= b
            word_in_unit = jnp.where(later, i + 1, word_in_unit)
            skipped = jnp.where(later, b, skipped)
        word = self.words[unit * _UNIT_WORDS + word_in_unit]
        return unit * _UNIT + word_in_unit * _WORD + _select_bit(word, rank_in_unit - skipped)


def _compact_blocked(mask, size, fn, fill_values):
    tile = min(_TILE, -(-size // _CHUNK) * _CHUNK)
    n_tiles = -(-size // tile)
    directory = _Directory(mask, n_tiles * tile // _CHUNK)
    count = directory.count
    probe = jax.eval_shape(lambda i: tuple(fn(i)), jax.ShapeDtypeStruct((tile,), i32))
    outs = tuple(jnp.full((n_tiles * tile,), f, p.dtype) for p, f in zip(probe, fill_values))

    def write_tile(t, outs):
        slot = t * tile + jnp.arange(tile, dtype=i32)
        results = _fill_invalid(tuple(fn(directory.positions(slot))), slot, count,
                                fill_values)
        return tuple(lax.dynamic_update_slice_in_dim(o, r, t * tile, 0) for o, r in zip(outs, results))

    tiles_needed = (jnp.minimum(count, size) + tile - 1) // tile
    outs = fori_loop(0, tiles_needed, write_tile, outs)  # also on a shard of a mesh
    return tuple(o[:size] for o in outs), count

