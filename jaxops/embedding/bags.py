"""``Bags``: a batch of variable-length bags of ids (one feature of a batch), flattened.

Every form of ragged input becomes the same flat record: the ids ``[N]`` (64-bit, as
``Words64`` so that x64 may be off), the bag of each id (``segment``, int32 ``[N]``;
``num_bags`` marks padding) and optional per-id weights. ``num_bags`` is static (it is the
leading size of the pooled output); everything else may be traced, so bags are built
inside ``jax.jit`` as well. There, pass 64-bit ids as ``Words64`` (``ht.words.as_words`` on the
host): with x64 off, JAX narrows an int64 argument of a jitted function to int32 at the
call, silently, before any code here can see the lost high bits.

>>> import numpy as np
>>> b = Bags.from_lengths(np.array([7, 8, 9, 0], np.int64), np.array([2, 0, 1]))
>>> b.segment.tolist(), b.num_bags, b.lengths().tolist()
([0, 0, 2, 3], 3, [2, 0, 1])
>>> mask = np.array([[1, 1], [1, 0]], bool)
>>> Bags.from_dense(np.array([[4, 5], [6, 0]]), mask=mask).segment.tolist()
[0, 0, 1, 2]
>>> import jax, jaxops.hashtable as ht
>>> words = ht.words.as_words(np.array([2**40 + 5], np.int64), "doc", "ids")  # exact with x64 off
>>> jax.jit(lambda w: Bags.from_lengths(w, np.array([1])).ids.hi)(words).tolist()
[256]
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.core.dynarray import DynArray
from jaxops.core.errors import OpArgumentError
from jaxops.hashtable.words import Words64, as_words

__all__ = ["Bags"]


def _ids_and_mask(op: str, ids: Any) -> tuple[Words64, jax.Array | None, bool]:
    """Ids in any accepted form (a DynArray's padding becomes a mask), and whether they came
    as a JAX array of 32 bits or less with x64 off (ids JAX may have narrowed)."""
    data = ids.data if isinstance(ids, DynArray) else ids
    narrow = isinstance(data, jax.Array) and np.dtype(data.dtype).itemsize < 8 \
        and not jax.config.jax_enable_x64
    mask = ids.valid_mask() if isinstance(ids, DynArray) else None
    return as_words(data, op, "ids"), mask, narrow


def _weights(op: str, weights: Any, n: int) -> jax.Array | None:
    if weights is None:
        return None
    weights = jnp.asarray(weights, jnp.float32)
    if weights.size != n:
        raise OpArgumentError(op, "weights", f"one weight per id ({n})",
                              f"shape {tuple(weights.shape)}")
    return weights.reshape(n)


def _check_ends(op: str, ends: jax.Array, start: jax.Array, n: int) -> None:
    """Bags must fit the ids and not run backwards; checked when the sizes are concrete
    (inside jit they cannot be: bags are then cut at ``n``)."""
    if isinstance(ends, jax.core.Tracer) or isinstance(start, jax.core.Tracer):
        return
    bounds = np.concatenate([[int(start)], np.asarray(ends)])
    if (np.diff(bounds) < 0).any() or bounds[0] < 0 or bounds[-1] > n:
        arg = "lengths" if op.endswith("lengths") else "offsets"
        raise OpArgumentError(op, arg, f"non-negative bag sizes ending within the {n} ids",
                              f"bag bounds {bounds.tolist()}")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Bags:
    """Flat ragged bags (see the module docstring).

    Attributes:
        ids: ``Words64`` ``[N]``, the ids (any int64 value but -1, the padding key).
        segment: int32 ``[N]``: the bag of each id; ``num_bags`` for padding.
        weights: float32 ``[N]`` per-id weights, or None (all 1).
        num_bags: the number of bags ``B`` (static).
        narrow: static; True when the ids came as a JAX array of 32 bits or less with x64
            off: 64-bit ids JAX may have narrowed (a table of 64-bit keys refuses them).
    """

    ids: Words64
    segment: jax.Array
    weights: jax.Array | None
    num_bags: int = dataclasses.field(metadata=dict(static=True))
    narrow: bool = dataclasses.field(default=False, metadata=dict(static=True))

    @property
    def valid(self) -> jax.Array:
        """bool ``[N]``: True for ids that belong to a bag (False for padding)."""
        return self.segment < self.num_bags

    def lengths(self) -> jax.Array:
        """int32 ``[num_bags]``: ids per bag (padding excluded)."""
        return jax.ops.segment_sum(jnp.ones_like(self.segment), self.segment,
                                   num_segments=self.num_bags)

    @classmethod
    def from_lengths(cls, ids: Any, lengths: Any, weights: Any = None) -> "Bags":
        """Bags of ``lengths[b]`` consecutive ids each; ids past ``sum(lengths)`` are padding.

        Args:
            ids: ``[N]`` int ids (numpy int64, JAX ints, ``Words64``) or a 1-D DynArray
                (ids past its actual length are padding too).
            lengths: int ``[B]``, non-negative (traced values are fine; B is static).
            weights: optional float ``[N]`` per-id weights.
        """
        op = "Bags.from_lengths"
        lengths = jnp.asarray(lengths)
        if lengths.ndim != 1 or not jnp.issubdtype(lengths.dtype, jnp.integer):
            raise OpArgumentError(op, "lengths", "a 1-D int array (ids per bag)",
                                  f"{lengths.dtype}{list(lengths.shape)}")
        ends = jnp.cumsum(lengths.astype(jnp.int32))
        return cls._from_ends(op, ids, ends, jnp.zeros((), jnp.int32), weights)

    @classmethod
    def from_offsets(cls, ids: Any, offsets: Any, weights: Any = None) -> "Bags":
        """Bag ``b`` is ``ids[offsets[b]:offsets[b + 1]]`` (``offsets``: int ``[B + 1]``,
        non-decreasing, TorchRec's / PyTorch ``EmbeddingBag``'s convention with the end).

        >>> import numpy as np
        >>> Bags.from_offsets(np.array([1, 2, 3]), np.array([0, 0, 2, 3])).segment.tolist()
        [1, 1, 2]
        """
        op = "Bags.from_offsets"
        offsets = jnp.asarray(offsets)
        if offsets.ndim != 1 or offsets.shape[0] < 1 \
                or not jnp.issubdtype(offsets.dtype, jnp.integer):
            raise OpArgumentError(op, "offsets", "a 1-D int array [num_bags + 1]",
                                  f"{offsets.dtype}{list(offsets.shape)}")
        offsets = offsets.astype(jnp.int32)
        return cls._from_ends(op, ids, offsets[1:], offsets[0], weights)

    @classmethod
    def _from_ends(cls, op: str, ids: Any, ends: jax.Array, start: jax.Array, weights: Any
                   ) -> "Bags":
        words, mask, narrow = _ids_and_mask(op, ids)
        if len(words.shape) != 1:
            raise OpArgumentError(op, "ids", "a 1-D array of ids", f"shape {words.shape}")
        n, num_bags = words.shape[0], int(ends.shape[0])
        _check_ends(op, ends, start, n)
        position = jnp.arange(n, dtype=jnp.int32)
        segment = jnp.searchsorted(ends, position, side="right").astype(jnp.int32)
        inside = position >= start if mask is None else (position >= start) & mask
        segment = jnp.where(inside, segment, num_bags)
        return cls(words, segment, _weights(op, weights, n), num_bags, narrow)

    @classmethod
    def from_dense(cls, ids: Any, mask: Any = None, weights: Any = None) -> "Bags":
        """One bag per row of a padded ``[B, L]`` id matrix.

        Args:
            ids: int ``[B, L]`` ids, or a 2-D DynArray (its padding is masked).
            mask: optional bool ``[B, L]``: False marks padding.
            weights: optional float ``[B, L]`` per-id weights.
        """
        op = "Bags.from_dense"
        words, valid, narrow = _ids_and_mask(op, ids)
        if len(words.shape) != 2:
            raise OpArgumentError(op, "ids", "a 2-D [num_bags, max_len] array",
                                  f"shape {words.shape}")
        num_bags, width = words.shape
        if mask is not None:
            mask = jnp.asarray(mask)
            if mask.shape != (num_bags, width):
                raise OpArgumentError(op, "mask", f"bool [{num_bags}, {width}] like ids",
                                      f"shape {tuple(mask.shape)}")
            valid = mask.astype(bool) if valid is None else valid & mask.astype(bool)
        row = jnp.broadcast_to(jnp.arange(num_bags, dtype=jnp.int32)[:, None], (num_bags, width))
        if valid is not None:
            row = jnp.where(valid, row, num_bags)
        flat = Words64(words.lo.reshape(-1), words.hi.reshape(-1))
        return cls(flat, row.reshape(-1), _weights(op, weights, num_bags * width), num_bags,
                   narrow)

