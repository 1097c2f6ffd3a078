"""The native kernels of the hash tables' walks (``src/hash.cc``), registered into the core's
walk table (:mod:`jaxops.core.walk_table`), where the hash ops look them up when traced.

Each function takes and returns what the xla walk of the same name in
``jaxops/hashtable/_walks/probe.py`` (``row_gather.py`` for ``gather_rows``) computes, bit for bit:
plain arrays, so this module needs nothing of the ops. ``place_new_keys`` updates the
table's flags in place (the FFI call aliases them to its output; with the table donated
nothing of the table's size is copied).

Batching: ``vmap_method="sequential"`` (a loop over the batch; an unbatched table is not
broadcast). Inside ``shard_map`` each device runs the kernel on its own shard (the sharded
tables' local steps take the native walks too).

>>> import jax.numpy as jnp
>>> from jaxops import native
>>> not native.available() or first_occurrences(jnp.array([5, 7, 5], jnp.uint32),
...     jnp.zeros(3, jnp.uint32), jnp.ones(3, bool)).tolist() == [0, 1, 0]
True
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.core.walk_table import register_walk

__all__ = ["fill", "find_rows", "find_slots", "first_occurrences", "gather_rows",
           "place_new_keys", "put_rows", "register", "take_rows"]

i32, u8 = jnp.int32, jnp.uint8


def _call(target: str, results, *args, aliases=None, **attrs):
    shapes = [jax.ShapeDtypeStruct(s, d) for s, d in results]
    out = jax.ffi.ffi_call(target, shapes, vmap_method="sequential",
                           input_output_aliases=aliases)(*args, **attrs)
    # Inside shard_map the call's outputs are typed device-invariant; they vary over the
    # mesh axes their inputs vary over (a cast, free at run time), as xla's ops would.
    axes = tuple(sorted(set().union(*map(_varying, args))))
    return [jax.lax.pcast(o, axes, to="varying") for o in out] if axes else out


def _varying(x) -> frozenset:
    kind = getattr(jax.typeof(x), "manual_axis_type", None)
    return frozenset(kind.varying) if kind is not None else frozenset()


def find_slots(key_lo, key_hi, flags, lo, hi, active, limit):
    """``(slot, dist, flags, reuse)`` of each key (``probe.find_slots`` with reuse), each
    walk at most ``limit`` slots long."""
    n = lo.shape[0]
    return _call("jaxops_hash_find", [((n,), i32), ((n,), i32), ((n,), u8), ((n,), i32)],
                 key_lo, key_hi, flags, lo, hi, active, limit=np.int64(limit))


def first_occurrences(lo, hi, pending):
    """The index of each pending key's first pending occurrence (own index otherwise)."""
    return _call("jaxops_hash_first", [((lo.shape[0],), i32)], lo, hi, pending)[0]


def place_new_keys(flags, home, start, pending, own, limit):
    """``(slot_of, flags)``: each pending key's slot (-1: none within ``limit`` slots of its
    home) and the flags with every handed-out slot marked PENDING (the caller overwrites
    them); ``flags`` is updated in place."""
    return _call("jaxops_hash_place", [((home.shape[0],), i32), (flags.shape, u8)],
                 flags, home, start, pending, own, aliases={0: 1}, limit=np.int64(limit))


def gather_rows(values, slots, default_value):
    """``values[slots]`` rows (``[N, dim]``), ``default_value`` where a slot is -1."""
    return _call("jaxops_hash_rows", [((slots.shape[0], values.shape[1]), jnp.float32)],
                 values, slots, fill=np.float32(default_value))[0]


def find_rows(values, key_lo, key_hi, flags, lo, hi, default_value, limit):
    """``(rows, slots)``: ``gather_rows`` of the live slots ``find_slots`` gives, in one pass
    (slot -1 and ``default_value`` rows for absent keys and tombstones)."""
    n = lo.shape[0]
    slots, rows = _call("jaxops_hash_find_rows", [((n,), i32), ((n, values.shape[1]), jnp.float32)],
                        key_lo, key_hi, flags, values, lo, hi, fill=np.float32(default_value),
                        limit=np.int64(limit))
    return rows, slots


def take_rows(arrays, slots):
    """``[a[slots] for a in arrays]`` along axis 0 (any dtypes, one length; rows of slots
    outside ``[0, len)`` are zeros) in one pass, each lane's rows of every array requested
    together, a prefetch ahead (``src/rows.cc``)."""
    shapes = [((slots.shape[0], *a.shape[1:]), a.dtype) for a in arrays]
    return _call("jaxops_take_rows", shapes, slots, *arrays)


def put_rows(arrays, slots, rows):
    """``[a.at[slots].set(r) for a, r in zip(arrays, rows)]`` for the slots in range
    (distinct), in place in one pass (each array is aliased to its result)."""
    k = len(arrays)
    return _call("jaxops_put_rows", [(a.shape, a.dtype) for a in arrays], slots, *arrays,
                 *(r.astype(a.dtype) for a, r in zip(arrays, rows)),
                 aliases={1 + j: j for j in range(k)})


def fill(shape, dtype, value):
    """A new array of ``shape`` filled with ``value``, its pages advised huge before the
    first write (a table's arrays, read at random rows for the table's whole life)."""
    return _call("jaxops_fill_huge", [(tuple(shape), dtype)], jnp.asarray(value, dtype))[0]


def register() -> None:
    """Registers each walk as the ``native`` backend's in the core's walk table."""
    for walk in (find_slots, first_occurrences, place_new_keys, gather_rows, find_rows,
                 take_rows, put_rows, fill):
        register_walk(walk.__name__, "native", walk)
