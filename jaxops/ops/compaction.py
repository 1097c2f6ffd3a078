"""Stream compaction: positions of the True entries of a mask, at a static capacity.

The one shared building block of NonZero, MaskedSelect, Unique and hash-table export.

>>> import jax.numpy as jnp
>>> idx, count = compact_indices(jnp.array([False, True, True, False, True]), size=2)
>>> idx.tolist(), int(count)
([1, 2], 3)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def compact_indices(mask: jax.Array, size: int, fill_value: int = -1) -> tuple[jax.Array, jax.Array]:
    """Flat positions of the True entries of 1-D ``mask``, in ascending order.

    Returns ``(indices, count)``: ``indices`` is int32 ``[size]`` holding the first
    ``min(count, size)`` positions followed by ``fill_value``; ``count`` is the total number
    of True entries (int32), which may exceed ``size`` — the caller reports the overflow.
    """
    mask = jnp.asarray(mask, bool).reshape(-1)
    count = jnp.sum(mask, dtype=jnp.int32)
    (idx,) = jnp.nonzero(mask, size=size, fill_value=fill_value)
    return idx.astype(jnp.int32), count
