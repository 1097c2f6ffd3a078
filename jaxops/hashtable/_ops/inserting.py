"""``lookup_or_insert``: rows of keys, inserting absent ones (CANN
EmbeddingHashTableLookupOrInsert), on any placement.

>>> import numpy as np, jaxops.hashtable as ht
>>> t = ht.init_table(16, 2, initializer_mode="constant", constant_value=1.0)
>>> t, rows, info = ht.lookup_or_insert(t, np.array([7, 9, 7], np.int64))
>>> rows.shape, int(info.inserted), int(t.live)
((3, 2), 2, 2)

**Batch order.** A batch behaves exactly like a loop over its keys in index order: new keys
are inserted in the order of their first occurrence (that decides their slots when probe
sequences meet and which keys miss out when the table fills up), every occurrence adds 1 to
its key's counter, and with counter filtering occurrence ``r`` of a key (1-based) sees the
counter ``before + r``. A new key takes the first reusable slot of its probe walk (empty, or
another key's tombstone — beyond CANN), so a key reviving its tombstone finds it taken when
an earlier key of the batch reused it, and is then inserted anew (see
:mod:`~jaxops.hashtable._walks.probe`). On a mesh each shard sees its keys in global
batch order, so a sharded table answers exactly as one table does.

The call goes once through each layer: this function checks the arguments,
:func:`~jaxops.hashtable._placement.run.run_batch` applies the load policy and the routing
capacity and runs the placement's frame, which runs
:func:`~jaxops.hashtable._kernels.insert_kernel.insert_on_shard` on every shard.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.core.errors import OpArgumentError
from jaxops.hashtable._kernels.insert_kernel import LookupInfo, insert_on_shard
from jaxops.hashtable._kernels.opdefs import LOOKUP_OR_INSERT_OP
from jaxops.hashtable._placement.load_policy import Inserting
from jaxops.hashtable._placement.placement import placement_of
from jaxops.hashtable._placement.run import run_batch
from jaxops.hashtable._walks.batch import flat_words, shaped

__all__ = ["LookupInfo", "checked_attrs", "lookup_or_insert"]


def lookup_or_insert(table: Any, keys: Any, *, filter_mode: str = "no_filter",
                     filter_freq: int = 0, default_key_or_value: bool = False,
                     default_key: int = 0, default_value: float = 0.0,
                     filter_key_flag: bool = False, filter_key: int = -1,
                     step: Any = None, donate: bool = False, route_capacity: int | None = None,
                     overflow: str = "expand") -> tuple[Any, jax.Array, LookupInfo]:
    """Rows of ``keys``, inserting absent keys (CANN EmbeddingHashTableLookupOrInsert).

    Every occurrence adds 1 to its key's counter. A new key takes the first reusable slot
    its probe met (an empty slot, or — beyond CANN — another key's tombstone) with the row
    already there (from :func:`init_table` or an eviction) and counter 0, and counts as an
    insert (live and not-exported counts +1); so does a tombstone of the same key, which
    comes back as new (EVICTED, EXPORT and FILTER cleared). See the module docstring for
    the batch order.

    Beyond CANN each call is a step of the table's clock: ``table.clock`` (every shard's)
    becomes ``step`` (default: the old clock + 1) and every slot the call touches (keys
    that got a slot, admitted or not) gets ``last_access = table.clock``, the score of LRU
    eviction (:func:`~jaxops.hashtable._ops.scored.evict_lowest`).

    Args:
        table: the table (any placement).
        keys: int64 keys in any accepted form (any shape).
        filter_mode: ``"no_filter"``, or ``"counter"``: admission, which CANN declares but
            does not implement — an occurrence whose counter (this one included) is below
            ``filter_freq`` gets ``default_value`` and the key no FILTER bit; from
            ``filter_freq`` on FILTER is set and the real row returned. A key with FILTER
            already set is admitted. With ``"no_filter"`` FILTER is never set (as CANN).
        filter_freq: the admission threshold (``0 <= filter_freq < 2**31``).
        default_key_or_value: with ``filter_key_flag``, replace ``filter_key`` by
            ``default_key`` (True) instead of answering ``default_value`` (False).
        default_key: the replacement key.
        default_value: the value of rows not read from the table (filtered, not admitted,
            table full, not routed).
        filter_key_flag: whether ``filter_key`` is special.
        filter_key: the special key.
        step: the clock value of this call, an int in ``[0, 2**32)`` or a uint32-castable
            scalar array (e.g. the training step); it should not decrease (ages are
            ``clock - last_access`` modulo 2**32). Default: ``table.clock + 1``.
        donate: eagerly, hand the table's buffers to the call so that the new table is
            written in place — no copy of the table, which a table larger than half the
            memory needs. ``table`` is consumed: its arrays are deleted, and only the
            returned table may be used. Inside ``jit`` donation is the outer jit's
            (``donate_argnums``) and this flag changes nothing.
        route_capacity: on a mesh, lanes per destination buffer on each device (static).
            ``None``: the device's batch slice, which nothing can overflow; smaller buffers
            move less data but may leave keys unserved (reported in ``info.route``).
        overflow: what an eager call does when keys did not fit their routing buffer:
            ``"expand"`` (rerun at the next power of two that fits), ``"error"`` or
            ``"truncate"`` (keys not served get ``default_value``; warns). Inside ``jit``,
            ``info.route`` reports it. One device routes nothing.

    Returns:
        ``(table, values, info)``: the new table, float32 ``keys.shape + (dim,)`` rows
        (differentiable w.r.t. ``table.values``) and a :class:`LookupInfo`. Keys that find
        no free slot get ``default_value``, are counted in ``info.unplaced`` and in
        ``table.dropped`` — never dropped silently. A call that would leave more than
        ``max_live`` live keys in a shard applies the table's load policy
        (:mod:`~jaxops.hashtable._placement.load_policy`: raise, grow the table or evict by score,
        eagerly and before the insert; inside ``jit`` ``info.over_limit``).

    >>> import numpy as np, jaxops.hashtable as ht
    >>> t = ht.init_table(16, 2, initializer_mode="constant")
    >>> t, rows, info = ht.lookup_or_insert(t, np.array([3, 4], np.int64), step=7, donate=True)
    >>> int(t.clock), np.asarray(t.last_access)[np.asarray(info.slots)].tolist()
    (7, [7, 7])
    """
    op = LOOKUP_OR_INSERT_OP.name
    storage = placement_of(op, table).storage(table)
    attrs = checked_attrs(dict(filter_mode=filter_mode, filter_freq=filter_freq,
                               default_key_or_value=default_key_or_value,
                               default_key=default_key, default_value=default_value,
                               filter_key_flag=filter_key_flag, filter_key=filter_key))
    if isinstance(step, (int, np.integer)):
        if not 0 <= int(step) < 2**32:
            raise OpArgumentError(op, "step", "an int in [0, 2**32)", repr(step))
        step = np.uint32(step)
    step = None if step is None else jnp.asarray(step)
    words, shape = flat_words(op, keys, storage.key_dtype)
    skip = (filter_key_flag, filter_key, default_key_or_value, default_key)
    ran = run_batch(op, table, insert_on_shard, tuple(sorted(attrs.items())), words, step,
                    inserting=Inserting(words, skip), route_capacity=route_capacity,
                    overflow=overflow, donate=donate)
    rows, slots, admitted = ran.per_key
    counts, over = ran.totals
    route = ran.route._replace(served=shaped(ran.route.served, shape))
    info = LookupInfo(shaped(slots, shape), shaped(admitted, shape), *counts, over, route)
    return ran.table, shaped(rows, (*shape, storage.embedding_dim)), info


def checked_attrs(attrs: dict) -> dict:
    """The attributes checked (a bad name or value raises, naming it)."""
    out = LOOKUP_OR_INSERT_OP.check_attrs(attrs)
    if not 0 <= int(out["filter_freq"]) < 2**31:
        raise OpArgumentError(LOOKUP_OR_INSERT_OP.name, "filter_freq", "an int in [0, 2**31)",
                              repr(out["filter_freq"]))
    return out
