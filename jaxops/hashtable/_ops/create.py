"""``init_table``: a new, empty table on any placement (CANN InitEmbeddingHashTable).

>>> t = init_table(8, 4, initializer_mode="constant", constant_value=0.5)
>>> t.bucket_size, t.embedding_dim, float(t.values[3, 1]), int(t.live)
(8, 4, 0.5, 0)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.core.errors import OpArgumentError
from jaxops.core.memory import refuse_unless_fits
from jaxops.hashtable._kernels.opdefs import INIT_OP
from jaxops.hashtable._placement.on_mesh import MeshAxis
from jaxops.hashtable._placement.placement import ONE_DEVICE, Placement
from jaxops.hashtable._table.buffers import filled
from jaxops.hashtable._table.checks import check_key_dtype
from jaxops.hashtable._table.table import HashTable, check_bucket_size, slot_bytes
from jaxops.ops.loops import while_loop

__all__ = ["RANDOM_RANGE", "init_sharded_table", "init_table", "initializer_of",
           "initializer_rows", "key_words"]

#: Rows drawn for ``initializer_mode="random"`` when only a PRNG ``key`` is given
#: (Keras' default embedding initializer).
RANDOM_RANGE = (-0.05, 0.05)

#: Values drawn per step of random init: drawing the whole table at once peaks at ~4.4x
#: the table on XLA:CPU (random bits and their conversion are materialised), drawing
#: chunk by chunk into the table at +1 chunk. Chunk ``i`` uses ``fold_in(key, i)``.
_RANDOM_CHUNK_VALUES = 1 << 20


def init_table(bucket_size: int, embedding_dim: int, *, initializer_mode: str = "random",
               constant_value: float = 0.0, sampled_values: jax.Array | None = None,
               key: jax.Array | None = None, key_dtype: Any = np.int64,
               placement: Placement | None = None,
               initializer: Callable[..., jax.Array] | None = None) -> Any:
    """A table of ``bucket_size`` empty slots, each already holding the row a new key gets.

    Args:
        bucket_size: number of slots (static); on a
            :class:`~jaxops.hashtable._placement.on_mesh.MeshAxis` the slots in all, each of the
            ``n`` shards getting ``ceil(bucket_size / n)``.
        embedding_dim: floats per row (static).
        initializer_mode: ``"random"``: the rows are ``sampled_values`` (CANN takes them from
            outside), or uniform in ``RANDOM_RANGE`` drawn with the PRNG ``key``;
            ``"constant"``: every value is ``constant_value``.
        constant_value: the value of ``"constant"`` mode.
        sampled_values: float32, ``bucket_size * embedding_dim`` values.
        key: a PRNG key, used when ``sampled_values`` is not given.
        key_dtype: ``np.int64`` (CANN's) or ``np.uint64`` (static): the keys' dtype. Host
            keys must fit it, and ``export``, ``export_chunks`` and checkpoints give keys
            back in it (see :mod:`~jaxops.hashtable._table.table`).
        placement: where the table lives: None or
            :data:`~jaxops.hashtable._placement.placement.ONE_DEVICE` (a :class:`HashTable`), or a
            :class:`~jaxops.hashtable._placement.on_mesh.MeshAxis` (a
            :class:`~jaxops.hashtable._placement.on_mesh.ShardedHashTable`, each shard built on its
            own device: no full table on one device). With ``initializer_mode="random"`` and a PRNG
            ``key``, shard ``i`` draws with ``fold_in(key, i)``; ``sampled_values`` are split by
            shard.

    Returns:
        The new table (no keys, counters zero).
    """
    op = INIT_OP.name
    bucket_size = check_bucket_size(op, bucket_size)
    embedding_dim = _check_embedding_dim(op, embedding_dim)  # before the arguments sized by it
    key_dtype = check_key_dtype(op, key_dtype)
    placement = ONE_DEVICE if placement is None else placement
    if not isinstance(placement, Placement):
        raise OpArgumentError(op, "placement", "None, ONE_DEVICE or a MeshAxis(mesh, axis)",
                              type(placement).__name__)
    if initializer_mode == "random" and sampled_values is None and key is None:
        raise OpArgumentError(op, "sampled_values", "a float32 array of bucket_size * "
                              "embedding_dim values, or key=<PRNG key>, in random mode",
                              "neither", "Pass initializer_mode='constant' for fixed rows.")
    kept = initializer_of(initializer_mode, float(constant_value), sampled_values, key)
    if initializer is not None:
        sampled_values, kept = _drawn(op, initializer, initializer_mode, sampled_values, key,
                                      placement, bucket_size, embedding_dim)
    per_device = -(-bucket_size // placement.num_shards)
    refuse_unless_fits(op, "bucket_size", per_device * slot_bytes(embedding_dim),
                       f"{per_device} slots of {slot_bytes(embedding_dim)} bytes on a device",
                       placement.mesh.devices.flat if placement.routes else None)
    statics = dict(key_dtype=key_dtype, initializer=kept)
    if placement.routes:
        return _on_shards(placement, bucket_size, embedding_dim, initializer_mode,
                          float(constant_value), sampled_values, key, statics)
    if initializer_mode == "random" and sampled_values is None:
        return _random_table(key, bucket_size, embedding_dim).replace(**statics)
    if initializer_mode != "random":
        sampled_values = None
    elif isinstance(sampled_values, np.ndarray):  # one host-to-device copy (jnp.asarray: two)
        sampled_values = jax.device_put(np.asarray(sampled_values, np.float32))
    (table,) = INIT_OP(sampled_values, bucket_size=bucket_size, embedding_dim=embedding_dim,
                       initializer_mode=initializer_mode, constant_value=constant_value)
    return table.replace(**statics)


def _drawn(op: str, initializer: Any, mode: str, sampled_values: Any, key: Any,
           placement: Placement, bucket_size: int, dim: int) -> tuple[jax.Array, tuple]:
    """The rows ``initializer`` draws for a new table (every shard's slots) and the table's
    static ``initializer`` that draws its new slots' rows when it grows."""
    if not callable(initializer) or mode != "random" or sampled_values is not None \
            or key is None:
        raise OpArgumentError(op, "initializer", "a JAX initializer f(key, shape, dtype) "
                              "with key= in random mode, and no sampled_values",
                              f"{type(initializer).__name__} in {mode!r} mode, key="
                              f"{'None' if key is None else 'given'}, sampled_values="
                              f"{'None' if sampled_values is None else 'given'}")
    slots = -(-bucket_size // placement.num_shards) * placement.num_shards
    rows = initializer(key, (slots, dim), jnp.float32)
    return rows, ("callable", initializer, key_words(key))


def initializer_of(mode: str, constant_value: float, sampled_values: Any, key: Any) -> tuple:
    """The table's static ``initializer`` (see :class:`HashTable`) for ``init_table``'s
    arguments: what a grown table's new slots get."""
    if mode != "random":
        return ("constant", constant_value)
    if sampled_values is not None:
        return ("sampled",)
    return ("uniform", *RANDOM_RANGE, key_words(key))


def key_words(key: Any) -> tuple[int, ...] | None:
    """A PRNG key's words as Python ints (a typed key or a raw uint32 key), None when traced."""
    if isinstance(key, jax.core.Tracer):
        return None
    data = jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key
    return tuple(int(w) for w in np.asarray(data, np.uint32).reshape(-1))


def initializer_rows(initializer: tuple, num_slots: int, dim: int) -> dict:
    """``init_table``'s initializer arguments that draw the rows of a table of ``num_slots``
    slots from a table's static ``initializer`` (the seed folded with ``num_slots``: a grown
    table draws fresh rows)."""
    kind, seed = initializer[0], initializer[-1]
    if kind in ("uniform", "callable") and seed is not None:
        key = jnp.asarray(seed, jnp.uint32) if len(seed) == 2 else \
            jax.random.wrap_key_data(np.asarray(seed, np.uint32))
        key = jax.random.fold_in(key, num_slots)
        if kind == "callable":
            return dict(initializer_mode="random",
                        sampled_values=initializer[1](key, (num_slots, dim), jnp.float32))
        return dict(initializer_mode="random", key=key)
    if kind == "constant":
        return dict(initializer_mode="constant", constant_value=initializer[1])
    return dict(initializer_mode="constant", constant_value=0.0)


@INIT_OP.kernel("xla")
def _init_kernel(sampled_values, *, bucket_size, embedding_dim, initializer_mode, constant_value):
    if initializer_mode == "constant":
        return (_constant_table(bucket_size, embedding_dim, constant_value),)
    want = bucket_size * embedding_dim
    if int(np.prod(np.shape(sampled_values))) != want:
        raise OpArgumentError(INIT_OP.name, "sampled_values", f"{want} values (bucket_size * "
                              "embedding_dim) in random mode", f"shape {np.shape(sampled_values)}")
    return (HashTable.empty(bucket_size, embedding_dim, sampled_values),)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _constant_table(bucket_size, embedding_dim, constant_value):
    return HashTable.empty(bucket_size, embedding_dim,
                           filled((bucket_size, embedding_dim), jnp.float32, constant_value))


def _check_embedding_dim(op: str, embedding_dim) -> int:
    if isinstance(embedding_dim, (bool, np.bool_)) or \
            not isinstance(embedding_dim, (int, np.integer)) or int(embedding_dim) < 1:
        raise OpArgumentError(op, "embedding_dim", "an int >= 1", repr(embedding_dim))
    return int(embedding_dim)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _random_table(key, bucket_size, embedding_dim):
    rows = max(1, min(bucket_size, _RANDOM_CHUNK_VALUES // embedding_dim))
    steps = -(-bucket_size // rows)

    def draw(i, values):
        chunk = jax.random.uniform(jax.random.fold_in(key, i), (rows, embedding_dim),
                                   jnp.float32, *RANDOM_RANGE)
        # The last chunk may overhang: dynamic_update_slice moves it back to end at the
        # table's end (deterministic, like every other chunk).
        return jax.lax.dynamic_update_slice_in_dim(values, chunk, i * rows, 0)

    # loops.while_loop: also inside shard_map(check_vma=True) with a device-varying key.
    _, values = while_loop(lambda s: s[0] < steps, lambda s: (s[0] + 1, draw(*s)),
                           (jnp.int32(0), filled((bucket_size, embedding_dim), jnp.float32, 0.0)))
    return HashTable.empty(bucket_size, embedding_dim, values)


def _on_shards(placement: Placement, num_slots: int, dim: int, initializer_mode: str,
               constant_value: float, sampled: Any, key: Any, table_statics: dict) -> Any:
    """Every shard built on its own device (shard ``i`` draws with ``fold_in(key, i)``)."""
    shards = placement.num_shards
    per = -(-num_slots // shards)
    if sampled is not None and initializer_mode == "random":
        sampled = jnp.asarray(sampled, jnp.float32)
        if sampled.size != per * shards * dim:
            raise OpArgumentError(INIT_OP.name, "sampled_values", f"{per * shards} x {dim} "
                                  "values (the rounded-up bucket_size x embedding_dim)",
                                  f"shape {tuple(sampled.shape)}")
        sampled = sampled.reshape(shards, per, dim)
    else:
        sampled = None
    statics = (per, dim, initializer_mode, constant_value, key is not None)
    shards_table = placement.build(_shard_table, statics, key).replace(**table_statics)
    if sampled is not None:
        shards_table = placement.map(_with_rows, None, (shards_table, sampled))[0]
    return placement.with_storage(None, shards_table)


def _with_rows(router, statics, state, replicated):
    table, rows = state  # the rows are split by shard like the table
    return table.replace(values=rows), ()


def _shard_table(router, statics, key):
    per, dim, mode, constant_value, has_key = statics
    if mode == "random" and has_key:
        return _random_table(jax.random.fold_in(key, router.index()), per, dim)
    return _constant_table(per, dim, constant_value)  # random rows: sampled_values, below


def init_sharded_table(num_slots: int, embedding_dim: int, mesh: Any, axis: str,
                       **init_kwargs) -> Any:
    """:func:`init_table` on ``MeshAxis(mesh, axis)``: ``num_slots`` slots in all.

    >>> import numpy as np, jax
    >>> mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("d",))
    >>> init_sharded_table(16, 2, mesh, "d", initializer_mode="constant").num_shards
    1
    """
    return init_table(num_slots, embedding_dim, placement=MeshAxis(mesh, axis), **init_kwargs)
