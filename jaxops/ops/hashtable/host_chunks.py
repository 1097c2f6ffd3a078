"""Moving a table between the device and the host in bounded chunks of slots.

``save``, ``load`` and ``export_chunks`` use these so that their extra memory is one chunk,
not a second table: :func:`iter_host_chunks` reads slots ``[start, start + n)`` to numpy one
chunk at a time, and :class:`TableWriter` writes host chunks into a table preallocated on the
device, in place (a donated ``dynamic_update_slice`` per chunk). Measured on XLA:CPU with a
256 MiB ``values`` array: ``jnp.asarray`` of a finished numpy array peaks at +3x the array
(it copies, twice), ``jax.device_put`` at +1x; the donated in-place writes at +1 chunk.

>>> import numpy as np, jaxops.hashtable as ht
>>> t = ht.init_table(5, 2, initializer_mode="constant", constant_value=1.0)
>>> [(start, len(rows.flags)) for start, rows in iter_host_chunks(t, 2)]
[(0, 2), (2, 2), (4, 1)]
>>> w = TableWriter(5, 2)
>>> for start, rows in iter_host_chunks(t, 2):
...     w.write(start, rows)
>>> back = w.finish(live=0, not_exported=0, dropped=0)
>>> float(back.values.sum()), back.bucket_size
(10.0, 5)
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.ops.hashtable.table import HashTable
from jaxops.ops.hashtable.words import as_counter

__all__ = ["CHUNK_BYTES", "HostRows", "TableWriter", "chunk_slots_for", "iter_host_chunks"]

#: Bytes of table one chunk moves (about): the bound on the extra memory of a streamed
#: save, load or export, far below the 256 MiB they are allowed.
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


@functools.partial(jax.jit, static_argnums=(0, 1))
def _blank(bucket_size: int, embedding_dim: int) -> tuple:
    return tuple(jnp.zeros(bucket_size, dt) for dt in (jnp.uint32,) * 4 + (jnp.uint8,)) \
        + (jnp.zeros((bucket_size, embedding_dim), jnp.float32), jnp.zeros(bucket_size, jnp.uint32))


@functools.partial(jax.jit, donate_argnums=0)
def _put(fields: tuple, rows: tuple, start: jax.Array) -> tuple:
    return tuple(jax.lax.dynamic_update_slice_in_dim(f, r, start, 0) for f, r in zip(fields, rows))


class TableWriter:
    """A table preallocated on the device and filled chunk by chunk, in place.

    Every slot must be written once before :meth:`finish` (unwritten slots hold zeros).
    """

    def __init__(self, bucket_size: int, embedding_dim: int):
        self._fields = _blank(int(bucket_size), int(embedding_dim))

    def write(self, start: int, rows: HostRows) -> None:
        """Writes ``rows`` at slots ``[start, start + len(rows.flags))``."""
        if rows.last_access is None:
            rows = rows._replace(last_access=np.zeros(rows.flags.shape, np.uint32))
        self._fields = _put(self._fields, tuple(rows), jnp.int32(start))

    def write_last_access(self, start: int, last_access: np.ndarray) -> None:
        """Writes only ``last_access`` at slots ``[start, start + len(last_access))``."""
        *rest, column = self._fields
        (column,) = _put((column,), (np.asarray(last_access, np.uint32),), jnp.int32(start))
        self._fields = (*rest, column)

    def finish(self, *, live: int, not_exported: int, dropped: int, clock: int = 0,
               max_load_factor: float = 0.9, load_policy: str = "error",
               key_dtype: str = "int64") -> HashTable:
        """The finished table with its counts (the writer must not be used after)."""
        fields, self._fields = self._fields, None
        return HashTable(**dict(zip(_FIELDS, fields)), epoch=jnp.zeros_like(fields[0]),
                         live=jnp.int32(live),
                         not_exported=jnp.int32(not_exported), dropped=as_counter(dropped),
                         clock=jnp.uint32(clock), max_load_factor=max_load_factor,
                         load_policy=load_policy, key_dtype=key_dtype)
