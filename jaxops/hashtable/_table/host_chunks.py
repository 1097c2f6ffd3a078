"""Moving a table from the device to the host in bounded chunks of slots.

``export_chunks`` uses these so that its extra memory is one chunk, not a second table:
:func:`iter_host_chunks` reads slots ``[start, start + n)`` to numpy one chunk at a time.
(Checkpoints move tables in chunks too, of their own size,
``jaxops.hashtable.checkpoint.CHUNK_BYTES``: a restore writes each chunk into the table
preallocated on the device, in place; measured on XLA:CPU with a 256 MiB ``values`` array,
``jnp.asarray`` of a finished numpy array peaks at +3x the array, it copies twice,
``jax.device_put`` at +1x, the donated in-place writes at +1 chunk.)

>>> import numpy as np, jaxops.hashtable as ht
>>> t = ht.init_table(5, 2, initializer_mode="constant", constant_value=1.0)
>>> [(start, len(rows.flags)) for start, rows in iter_host_chunks(t, 2)]
[(0, 2), (2, 2), (4, 1)]
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.hashtable._table.table import HashTable

__all__ = ["CHUNK_BYTES", "HostRows", "chunk_slots_for", "iter_host_chunks"]

#: Bytes of table one chunk moves (about): the bound on the extra memory of a streamed
#: export, save or restore, far below the 256 MiB they are allowed.
CHUNK_BYTES = 16 << 20

_FIELDS = ("key_lo", "key_hi", "counter_lo", "counter_hi", "flags", "values", "last_access")


class HostRows(NamedTuple):
    """Slots of a table as host numpy arrays (the per-slot fields of :class:`HashTable`).

    ``last_access`` is not part of CANN's bucket; ``None`` reads as zeros.
    """

    key_lo: np.ndarray
    key_hi: np.ndarray
    counter_lo: np.ndarray
    counter_hi: np.ndarray
    flags: np.ndarray
    values: np.ndarray
    last_access: np.ndarray | None = None


def chunk_slots_for(embedding_dim: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    """Slots per chunk so that one chunk of a dim-``embedding_dim`` table is ~``chunk_bytes``.

    >>> chunk_slots_for(64)
    60567
    """
    per_slot = 21 + 4 * int(embedding_dim)  # five uint32 words, the flag byte, the row
    return max(1, int(chunk_bytes) // per_slot)


@functools.partial(jax.jit, static_argnums=2)
def _slice(fields: tuple, start: jax.Array, n: int) -> tuple:
    return tuple(jax.lax.dynamic_slice_in_dim(f, start, n, 0) for f in fields)


def iter_host_chunks(table: HashTable, chunk_slots: int) -> Iterator[tuple[int, HostRows]]:
    """Yields ``(start, rows)`` for consecutive chunks of ``chunk_slots`` slots (the last may
    be shorter); one device-to-host copy per chunk, two compiles at most."""
    fields = tuple(getattr(table, f) for f in _FIELDS)
    size, step = table.bucket_size, max(1, int(chunk_slots))
    for start in range(0, size, step):
        n = min(step, size - start)
        yield start, HostRows(*jax.device_get(_slice(fields, jnp.int32(start), n)))
