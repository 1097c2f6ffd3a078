"""CANN interop: a table as Ascend's bucket bytes and handle words, its flag bits, its hash.

A bucket is ``row_bytes(dim)`` bytes: the int64 key, the uint64 counter, :data:`EVICTED` in
byte 20 (where CANN's evict kernel writes it), the flag byte at offset 23 (:data:`VALID`,
:data:`FILTER`, :data:`EXPORT`), then the row.
A key's home slot is ``murmur3_x86_32(key, seed 0) % bucket_size``, as CANN computes it.

>>> import numpy as np, jaxops.hashtable as ht
>>> t = ht.init_table(4, 2, initializer_mode="constant")
>>> t, _, _ = ht.lookup_or_insert(t, np.array([7], np.int64))
>>> buf = ht.cann.to_cann_bytes(t)
>>> buf.shape, int(ht.cann.from_cann_bytes(buf, 2).live), ht.cann.handle_counters(t).tolist()
((4, 32), 1, [0, 0, 1, 0, 1])
"""

from jaxops.hashtable._table.murmur import home_slot, murmur3_x86_32
from jaxops.hashtable._table.table import EVICTED, EXPORT, FILTER, VALID
from jaxops.hashtable.cann._bytes import from_cann_bytes, handle_counters, row_bytes, to_cann_bytes

__all__ = ["EVICTED", "EXPORT", "FILTER", "VALID", "from_cann_bytes", "handle_counters",
           "home_slot", "murmur3_x86_32", "row_bytes", "to_cann_bytes"]
