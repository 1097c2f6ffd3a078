"""The public table functions, taking a :class:`HashTable` or a :class:`ShardedHashTable`.

Each public name is the single-table function, wrapped so that a sharded table (first
argument) goes to its sharded counterpart; the single-table path is unchanged.

>>> import numpy as np, jax, jaxops.hashtable as ht
>>> mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("d",))
>>> for t in (ht.init_table(16, 2, initializer_mode="constant"),
...           ht.init_sharded_table(16, 2, mesh, "d", initializer_mode="constant")):
...     t, rows, info = ht.lookup_or_insert(t, np.array([3, 4], np.int64))
...     print(type(t).__name__, int(t.live))
HashTable 2
ShardedHashTable 2
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

from jaxops.core.errors import OpArgumentError
from jaxops.ops.hashtable import adamw, cann_bytes, checkpoint, evict as evict_mod
from jaxops.ops.hashtable import export as export_mod, export_chunks as export_chunks_mod
from jaxops.ops.hashtable import gather as gather_mod, import_ as import_mod, lookup as lookup_mod
from jaxops.ops.hashtable import load as load_policy, resize as resize_mod, scored
from jaxops.ops.hashtable.sharded import checkpoint as sharded_checkpoint
from jaxops.ops.hashtable.sharded import io, lookup as sharded_lookup
from jaxops.ops.hashtable.sharded import scored as sharded_scored, update
from jaxops.ops.hashtable.checkpoint_files import check_path
from jaxops.ops.hashtable.sharded.table import ShardedHashTable

__all__ = ["adam_w_init", "apply_adam_w", "compact", "evict", "evict_if", "evict_lowest",
           "export", "export_chunks", "find", "gather", "import_", "load", "locate", "lookup",
           "lookup_or_insert", "resize", "save", "set_load_policy", "to_cann_bytes"]

_NOTE = """
    A :class:`~jaxops.ops.hashtable.sharded.table.ShardedHashTable` is accepted as well
    (see :func:`{target}`; extra keywords ``route_capacity`` and ``overflow``, which a
    single table ignores).
"""
_ROUTING = ("route_capacity", "overflow")


def _either(single: Callable, sharded: Callable) -> Callable:
    @functools.wraps(single)
    def call(table, *args, **kwargs):
        if isinstance(table, ShardedHashTable):
            return sharded(table, *args, **kwargs)
        for name in _ROUTING:  # one table routes nothing: the same step runs on either
            kwargs.pop(name, None)
        return single(table, *args, **kwargs)

    if single.__doc__:
        target = f"{sharded.__module__}.{sharded.__name__}"
        call.__doc__ = single.__doc__.rstrip() + "\n" + _NOTE.format(target=target)
    return call


lookup_or_insert = _either(lookup_mod.lookup_or_insert, sharded_lookup.lookup_or_insert)
find = _either(lookup_mod.find, sharded_lookup.find)
lookup = _either(lookup_mod.lookup, sharded_lookup.lookup)
locate = _either(lookup_mod.locate, sharded_lookup.locate)
gather = _either(gather_mod.gather, sharded_lookup.gather)
evict = _either(evict_mod.evict, update.evict)
import_ = _either(import_mod.import_, update.import_)
apply_adam_w = _either(adamw.apply_adam_w, update.apply_adam_w)
adam_w_init = _either(adamw.adam_w_init, update.adam_w_init)
export = _either(export_mod.export, io.export)
resize = _either(resize_mod.resize, io.resize)
save = _either(checkpoint.save, sharded_checkpoint.save)
compact = _either(resize_mod.compact, io.compact)
set_load_policy = _either(load_policy.set_load_policy, io.set_load_policy)
evict_lowest = _either(scored.evict_lowest, sharded_scored.evict_lowest)
evict_if = _either(scored.evict_if, sharded_scored.evict_if)
export_chunks = _either(export_chunks_mod.export_chunks, io.export_chunks)


def _cann_bytes_of_shards(table: ShardedHashTable):
    """A sharded table is not one CANN bucket array: refused, saying what to do."""
    raise OpArgumentError("to_cann_bytes", "table", "a HashTable (CANN's bucket array holds "
                          "one table; a ShardedHashTable is one table per shard)",
                          f"a ShardedHashTable of {table.num_shards} shards",
                          "Convert shard i alone: to_cann_bytes(jax.tree.map(lambda x: x[i], "
                          "table.shards)); or save(table, dir) for a checkpoint of all shards.")


to_cann_bytes = _either(cann_bytes.to_cann_bytes, _cann_bytes_of_shards)


@functools.wraps(checkpoint.load)
def load(path: str | os.PathLike, *, mesh=None, axis: str | None = None, **kwargs):
    path = check_path("load", path)
    if mesh is None and not kwargs and not sharded_checkpoint.is_sharded_checkpoint(path):
        return checkpoint.load(path)
    if mesh is None or axis is None:
        raise OpArgumentError("load", "mesh", "mesh= and axis= for a sharded checkpoint (a "
                              "directory with a manifest)", f"mesh={mesh!r}, axis={axis!r}")
    return sharded_checkpoint.load(path, mesh=mesh, axis=axis, **kwargs)


load.__doc__ = (checkpoint.load.__doc__ or "").rstrip() + """

    A sharded checkpoint (a directory written by saving a ShardedHashTable) needs
    ``mesh=`` and ``axis=`` and loads onto any shard count: see
    :func:`jaxops.ops.hashtable.sharded.checkpoint.load`.
"""
