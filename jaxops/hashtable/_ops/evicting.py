"""``evict``: turn keys into tombstones (CANN EmbeddingHashTableEvict), on any placement.

>>> import numpy as np, jaxops.hashtable as ht
>>> t = ht.init_table(8, 2, initializer_mode="constant", constant_value=1.0)
>>> t, _, _ = ht.lookup_or_insert(t, np.array([3, 4], np.int64))
>>> t = ht.evict(t, np.array([3, 3, 99], np.int64), const_val=-1.0)
>>> int(t.live), ht.find(t, np.array([3, 4], np.int64))[1].tolist()
(1, [False, True])
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxops.core.errors import OpArgumentError
from jaxops.hashtable._kernels.evict_kernel import evict_on_shard
from jaxops.hashtable._kernels.opdefs import EVICT_OP
from jaxops.hashtable._placement.placement import placement_of
from jaxops.hashtable._placement.run import run_batch
from jaxops.hashtable._walks.batch import flat_words

__all__ = ["evict"]


def evict(table: Any, keys: Any, *, init_mode: str = "constant", const_val: float = 0.0,
          sampled_values: jax.Array | None = None, route_capacity: int | None = None,
          overflow: str = "expand") -> Any:
    """Present, non-evicted keys become tombstones: EVICTED set, counter and ``last_access``
    0, row reset.

    The key stays in its slot (probe chains stay intact); the same key revives it as a new
    key (:func:`lookup_or_insert`), and, beyond CANN, a new key whose probe proved it absent
    may take the slot (CANN reuses it only for the same key). Absent keys and repeats
    are no-ops. The live count drops by one per tombstone, the not-exported count only for
    keys never exported (CANN lowers it unconditionally and keeps EVICTED in byte 20 of the
    bucket while export tests byte 23; here the flag byte is one).

    Args:
        table: the table (any placement).
        keys: int64 keys ``[N]`` in any accepted form.
        init_mode: ``"constant"`` (rows become ``const_val``) or ``"random"`` (row of key
            ``i`` becomes ``sampled_values[i]``).
        const_val: the constant row value.
        sampled_values: float32 ``[N, embedding_dim]`` for ``"random"``.
        route_capacity, overflow: on a mesh, as in ``lookup_or_insert``.

    Returns:
        The new table.
    """
    op = EVICT_OP.name
    storage = placement_of(op, table).storage(table)
    words, _ = flat_words(op, keys, storage.key_dtype)
    n = int(words.lo.size)
    dim = storage.embedding_dim
    if init_mode == "random":
        if sampled_values is None or jnp.size(sampled_values) != n * dim:
            raise OpArgumentError(op, "sampled_values", f"[{n}, {dim}] float32 rows in random "
                                  "mode", "None" if sampled_values is None
                                  else f"shape {jnp.shape(sampled_values)}")
        sampled_values = jnp.asarray(sampled_values, jnp.float32).reshape(n, dim)
    else:
        sampled_values = None
    attrs = EVICT_OP.check_attrs(dict(init_mode=init_mode, const_val=const_val))
    statics = (attrs["init_mode"], attrs["const_val"])
    return run_batch(op, table, evict_on_shard, statics, (words, sampled_values),
                     route_capacity=route_capacity, overflow=overflow).table
