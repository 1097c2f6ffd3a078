"""Device-side embedding hash tables, faithful to CANN ops-nn's ``hash/`` operators.

A table lives on a **placement**: one device (:data:`ONE_DEVICE`, a :class:`HashTable`) or a
mesh axis (:class:`MeshAxis`, a :class:`ShardedHashTable`, one owner shard per key). Every
operation below takes a table on any placement and behaves the same.

- tables: :func:`init_table`, :func:`init_sharded_table`, :class:`HashTable`,
  :class:`ShardedHashTable`, :class:`OneDevice` / :data:`ONE_DEVICE`, :class:`MeshAxis`;
- operations: :func:`lookup_or_insert`, :func:`find`, :func:`lookup`, :func:`locate`,
  :func:`gather`, :func:`evict`, :func:`evict_lowest`, :func:`evict_if`, :func:`import_`,
  :func:`export`, :func:`export_chunks`, :func:`resize`, :func:`compact`,
  :func:`set_load_policy`, :func:`maintain` (the load policy between jitted steps),
  :func:`apply_adam_w` / :func:`adam_w_init`, :func:`save`,
  :func:`load`, :func:`host_keys`;
- what they report: :class:`LookupInfo`, :class:`ImportInfo`, :class:`RouteInfo`,
  :class:`ExportChunk`, :class:`AdamWState`, :class:`SlotScores`, :class:`LoadDemand`;
  policies and predicates: :data:`LOAD_POLICIES`, :class:`SlotPredicate`,
  :func:`counter_below`, :func:`not_seen_for`;
- sub-namespaces: :mod:`~jaxops.hashtable.optim` (row optimizers),
  :mod:`~jaxops.hashtable.words` (64-bit keys as uint32 word pairs),
  :mod:`~jaxops.hashtable.cann` (CANN's bucket bytes, handle words, flag bits, hash).

>>> import numpy as np, jaxops.hashtable as ht
>>> table = ht.init_table(64, 4, initializer_mode="constant", constant_value=0.1)
>>> table, rows, info = ht.lookup_or_insert(table, np.array([3, 5, 3], np.int64))
>>> rows.shape, int(table.live), sorted(ht.export_chunks(table)[1].__next__().keys.tolist())
((3, 4), 2, [3, 5])
"""

from jaxops.core.errors import CheckpointError
from jaxops.ops.hashtable.cann_adamw import AdamWState, adam_w_init, apply_adam_w
from jaxops.ops.hashtable.checkpoint import load, save
from jaxops.ops.hashtable.create import init_sharded_table, init_table
from jaxops.ops.hashtable.evicting import evict
from jaxops.ops.hashtable.exporting import ExportChunk, export, export_chunks
from jaxops.ops.hashtable.importing import ImportInfo, import_
from jaxops.ops.hashtable.inserting import LookupInfo, lookup_or_insert
from jaxops.ops.hashtable.load_policy import (LOAD_POLICIES, LoadDemand, Maintenance, maintain,
                                             set_load_policy)
from jaxops.ops.hashtable.on_mesh import MeshAxis, ShardedHashTable
from jaxops.ops.hashtable.placement import ONE_DEVICE, OneDevice, Placement
from jaxops.ops.hashtable.reading import find, gather, locate, lookup
from jaxops.ops.hashtable.rebuild import compact, resize
from jaxops.ops.hashtable.route import RouteInfo, owner_shard
from jaxops.ops.hashtable.scored import (SlotPredicate, SlotScores, counter_below, evict_if,
                                         evict_lowest, not_seen_for)
from jaxops.ops.hashtable.table import HashTable, host_keys

from jaxops.hashtable import cann, checkpoint, optim, words  # noqa: E402,F401  (sub-namespaces)

__all__ = [
    "AdamWState", "CheckpointError", "ExportChunk", "HashTable", "ImportInfo", "LOAD_POLICIES",
    "LoadDemand", "LookupInfo", "Maintenance", "MeshAxis", "ONE_DEVICE", "OneDevice", "Placement",
    "RouteInfo", "ShardedHashTable", "SlotPredicate", "SlotScores", "adam_w_init",
    "apply_adam_w", "cann", "checkpoint", "compact", "counter_below", "evict", "evict_if", "evict_lowest",
    "export", "export_chunks", "find", "gather", "host_keys", "import_", "init_sharded_table",
    "init_table", "load", "locate", "lookup", "lookup_or_insert", "maintain", "not_seen_for", "optim",
    "owner_shard", "resize", "save", "set_load_policy", "words",
]
