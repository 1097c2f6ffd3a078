"""Device-side embedding hash tables, faithful to CANN ops-nn's ``hash/`` operators.

A table lives on a **placement**: one device (:data:`ONE_DEVICE`, a :class:`HashTable`) or a
mesh axis (:class:`MeshAxis`, a :class:`ShardedHashTable`, each key held by one shard,
:func:`owner_shard`). Every operation below takes a table on any placement and behaves the
same.

- tables: :func:`init_table`, :func:`init_sharded_table`, :class:`HashTable`,
  :class:`ShardedHashTable`, :class:`OneDevice` / :data:`ONE_DEVICE`, :class:`MeshAxis`;
- operations: :func:`lookup_or_insert` (the only one that inserts), the reads :func:`find`,
  :func:`lookup`, :func:`locate`, :func:`gather` (and :func:`with_route` of each, which
  also returns its :class:`RouteInfo`), :func:`evict`, :func:`evict_lowest`, :func:`evict_if`,
  :func:`import_`, :func:`export`, :func:`export_chunks`, :func:`resize`, :func:`compact`,
  :func:`set_load_policy`, :func:`maintain` (the load policy between jitted steps),
  :func:`apply_adam_w` / :func:`adam_w_init`, :func:`save`,
  :func:`load`, :func:`host_keys`, :func:`slot_bytes` (the device memory of a slot);
- what they report: :class:`LookupInfo`, :class:`ImportInfo`, :class:`RouteInfo`,
  :class:`ExportChunk`, :class:`AdamWState`, :class:`SlotScores`, :class:`LoadDemand`;
  policies and predicates: :data:`LOAD_POLICIES`, :class:`SlotPredicate`,
  :func:`counter_below`, :func:`not_seen_for`;
- sub-namespaces: :mod:`~jaxops.hashtable.optim` (row optimizers),
  :mod:`~jaxops.hashtable.words` (64-bit keys as uint32 word pairs),
  :mod:`~jaxops.hashtable.cann` (CANN's bucket bytes, handle words, flag bits, hash),
  :mod:`~jaxops.hashtable.checkpoint` (train states in Orbax checkpoints).

The implementation lies in private folders, one per layer, each importing only those below
it: ``_table`` (the table type, its words and hash), ``_walks`` (one shard's probe walks),
``_kernels`` (what one shard does in each operation), ``_placement`` (placements, routing and
the one call every batched operation runs through), ``_ops`` (the operations above); the
public subpackages ``optim``, ``cann`` and ``checkpoint`` come next, and this face last.

>>> import numpy as np, jaxops.hashtable as ht
>>> table = ht.init_table(64, 4, initializer_mode="constant", constant_value=0.1)
>>> table, rows, info = ht.lookup_or_insert(table, np.array([3, 5, 3], np.int64))
>>> rows.shape, int(table.live), sorted(ht.export_chunks(table)[1].__next__().keys.tolist())
((3, 4), 2, [3, 5])
"""

from jaxops.core.errors import CheckpointError
from jaxops.hashtable._ops.cann_adamw import AdamWState, adam_w_init, apply_adam_w
from jaxops.hashtable._ops.create import init_sharded_table, init_table
from jaxops.hashtable._ops.evicting import evict
from jaxops.hashtable._ops.exporting import ExportChunk, export, export_chunks
from jaxops.hashtable._ops.importing import ImportInfo, import_
from jaxops.hashtable._ops.inserting import LookupInfo, lookup_or_insert
from jaxops.hashtable._ops.maintaining import Maintenance, maintain, set_load_policy
from jaxops.hashtable._ops.reading import find, gather, locate, lookup, with_route
from jaxops.hashtable._ops.resizing import compact, resize
from jaxops.hashtable._ops.scored import (SlotPredicate, SlotScores, counter_below, evict_if,
                                          evict_lowest, not_seen_for)
from jaxops.hashtable._placement.load_policy import LOAD_POLICIES, LoadDemand
from jaxops.hashtable._placement.on_mesh import MeshAxis, ShardedHashTable
from jaxops.hashtable._placement.placement import ONE_DEVICE, OneDevice, Placement
from jaxops.hashtable._placement.route import RouteInfo, owner_shard
from jaxops.hashtable._table.table import HashTable, host_keys, slot_bytes

from jaxops.hashtable import cann, checkpoint, optim, words  # noqa: E402,F401  (sub-namespaces)
from jaxops.hashtable.checkpoint import load, save  # noqa: E402

__all__ = [
    "AdamWState", "CheckpointError", "ExportChunk", "HashTable", "ImportInfo", "LOAD_POLICIES",
    "LoadDemand", "LookupInfo", "Maintenance", "MeshAxis", "ONE_DEVICE", "OneDevice", "Placement",
    "RouteInfo", "ShardedHashTable", "SlotPredicate", "SlotScores", "adam_w_init",
    "apply_adam_w", "cann", "checkpoint", "compact", "counter_below", "evict", "evict_if",
    "evict_lowest", "export", "export_chunks", "find", "gather", "host_keys", "import_",
    "init_sharded_table", "init_table", "load", "locate", "lookup", "lookup_or_insert",
    "maintain", "not_seen_for", "optim", "owner_shard", "resize", "save", "set_load_policy",
    "slot_bytes", "with_route", "words",
]
