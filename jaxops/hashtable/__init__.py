"""Device-side embedding hash tables, faithful to CANN ops-nn's ``hash/`` operators.

>>> import numpy as np, jaxops.hashtable as ht
>>> table = ht.init_table(64, 4, initializer_mode="constant", constant_value=0.1)
>>> table, rows, info = ht.lookup_or_insert(table, np.array([3, 5, 3], np.int64))
>>> rows.shape, int(table.live), ht.to_host_int64(ht.join_words(table.keys))[table.flags > 0].size
((3, 4), 2, 2)
"""

from jaxops.ops.hashtable.adamw import AdamWState
from jaxops.ops.hashtable.cann_bytes import from_cann_bytes, handle_counters, row_bytes
from jaxops.ops.hashtable.checkpoint import CheckpointError
from jaxops.ops.hashtable.create import init_table
from jaxops.ops.hashtable.export_chunks import ExportChunk
from jaxops.ops.hashtable.import_ import ImportInfo
from jaxops.ops.hashtable.load import LOAD_POLICIES
from jaxops.ops.hashtable.lookup import LookupInfo
from jaxops.ops.hashtable.murmur import home_slot, murmur3_x86_32
from jaxops.ops.hashtable.scored import SlotScores, counter_below, not_seen_for
from jaxops.ops.hashtable.sharded.dispatch import (adam_w_init, apply_adam_w, compact, evict,
                                                   evict_if, evict_lowest, export,
                                                   export_chunks, find, gather, import_, load,
                                                   locate, lookup, lookup_or_insert, resize,
                                                   save, set_load_policy, to_cann_bytes)
from jaxops.ops.hashtable.sharded.lookup import ShardedLookupInfo
from jaxops.ops.hashtable.sharded.route import RouteInfo
from jaxops.ops.hashtable.sharded.table import ShardedHashTable, init_sharded_table, owner_shard
from jaxops.ops.hashtable.table import (EVICTED, EXPORT, FILTER, VALID, Counter64, HashTable,
                                        Words64, as_words, host_keys, join_words,
                                        to_host_int64)

from jaxops.hashtable import optim  # noqa: E402,F401  (jaxops.hashtable.optim, row optimizers)

__all__ = [
    "AdamWState", "CheckpointError", "Counter64", "EVICTED", "EXPORT", "ExportChunk", "FILTER",
    "HashTable", "ImportInfo", "LOAD_POLICIES", "LookupInfo", "RouteInfo", "ShardedHashTable",
    "ShardedLookupInfo", "SlotScores", "VALID", "Words64", "adam_w_init", "apply_adam_w",
    "as_words", "compact", "counter_below", "evict", "evict_if", "evict_lowest", "export",
    "export_chunks", "find", "from_cann_bytes", "gather", "handle_counters", "home_slot",
    "host_keys", "import_", "init_sharded_table", "init_table", "join_words", "load", "locate",
    "lookup", "lookup_or_insert", "murmur3_x86_32", "not_seen_for", "optim", "owner_shard",
    "resize", "row_bytes", "save", "set_load_policy", "to_cann_bytes", "to_host_int64",
]
