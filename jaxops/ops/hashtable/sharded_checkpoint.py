"""A table on a mesh saved as one table file per shard plus a manifest.

A checkpoint is a directory. ``manifest.json`` names the shard files of the current
generation, ``g-<id>/shard-<i>-of-<n>.jxht``, each written by
:func:`~jaxops.ops.hashtable.table_file.write_table_file` (versioned, checksummed, streamed). A save
writes a new generation's files, then replaces the manifest atomically, then removes older
generations: a crash at any point leaves a manifest naming a complete set, the old one or
the new one (atomic as a whole). With several processes each writes the shards its devices
hold and process 0 writes the manifest after all have finished.

:func:`load_sharded` onto the same number of shards puts every file back in
place (the same slots); onto another number (N → M, either way) it reinserts the entries:
each file is read once (and checked, as any table file), and its live entries are placed in
their new owner shards in ascending slot order, keeping key, counter, flags and row.
Tombstones are not carried over (as :func:`resize`).

>>> import os, tempfile, numpy as np, jax, jaxops.hashtable as ht
>>> mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("d",))
>>> t = ht.init_sharded_table(16, 2, mesh, "d", initializer_mode="constant")
>>> t, _, _ = ht.lookup_or_insert(t, np.array([1, 2], np.int64))
>>> path = os.path.join(tempfile.mkdtemp(), "ckpt")
>>> save_sharded(t, path)
>>> int(load_sharded(path, ht.MeshAxis(mesh, "d")).live)
2
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import shutil

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxops.core.errors import CheckpointError, OpArgumentError
from jaxops.ops.hashtable.checkpoint_files import atomic_writer, check_path
from jaxops.ops.hashtable.checks import KEY_DTYPES
from jaxops.ops.hashtable.create import init_table
from jaxops.ops.hashtable.on_mesh import MeshAxis, expand, global_replicated, squeeze
from jaxops.ops.hashtable.placement import placement_of
from jaxops.ops.hashtable.rebuild import rehash
from jaxops.ops.hashtable.route import owner_shard
from jaxops.ops.hashtable.table import EVICTED, EXPORT, VALID, HashTable
from jaxops.ops.hashtable.table_file import read_table_file, write_table_file
from jaxops.ops.hashtable.words import Counter64

__all__ = ["MANIFEST", "is_sharded_checkpoint", "load_sharded", "save_sharded"]

MANIFEST = "manifest.json"
_FORMAT = "jaxops-sharded-hashtable"


def is_sharded_checkpoint(path) -> bool:
    return os.path.isdir(path) and os.path.exists(os.path.join(path, MANIFEST))


def save_sharded(table, path: str | os.PathLike) -> None:
    """Writes ``table`` (on a mesh) into the directory ``path`` (created if missing); see
    the module docstring. Every process of a multi-process run must call it (a collective)."""
    place = placement_of("save", table)
    path = check_path("save", path)
    generation = _agree(f"g-{secrets.token_hex(8)}")
    n = table.num_shards
    names = [f"{generation}/shard-{i:05d}-of-{n:05d}.jxht" for i in range(n)]
    os.makedirs(os.path.join(path, generation), exist_ok=True)
    for i, local in place.local_shards(table.shards).items():
        if place.writes(i):
            write_table_file(local, os.path.join(path, names[i]))
    _barrier("jaxops-save-shards")
    if jax.process_index() == 0:
        shards = table.shards
        manifest = {"format": _FORMAT, "version": 1, "num_shards": n,
                    "shard_size": table.shard_size, "embedding_dim": table.embedding_dim,
                    "axis": table.axis, "files": names,
                    "max_load_factor": shards.max_load_factor, "load_policy": shards.load_policy,
                    "key_dtype": shards.key_dtype, "unrouted": int(table.unrouted)}
        with atomic_writer("save", os.path.join(path, MANIFEST)) as f:
            f.write(json.dumps(manifest, indent=1, sort_keys=True).encode())
        for entry in os.listdir(path):
            if entry.startswith("g-") and entry != generation:
                shutil.rmtree(os.path.join(path, entry), ignore_errors=True)
    _barrier("jaxops-save-manifest")


def _agree(value: str) -> str:
    """Process 0's ``value`` on every process."""
    if jax.process_count() == 1:
        return value
    from jax.experimental import multihost_utils

    raw = np.frombuffer(value.encode().ljust(32), np.uint8)
    return bytes(np.asarray(multihost_utils.broadcast_one_to_all(raw))).decode().strip()


def _barrier(name: str) -> None:
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def read_manifest(path) -> dict:
    where = repr(os.fspath(path))
    try:
        with open(os.path.join(path, MANIFEST), "rb") as f:
            manifest = json.loads(f.read())
    except FileNotFoundError:
        raise CheckpointError(f"{where}: no {MANIFEST}: not a sharded table checkpoint") from None
    except ValueError as e:
        raise CheckpointError(f"{where}: corrupt {MANIFEST}: {e}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != _FORMAT:
        raise CheckpointError(f"{where}: {MANIFEST} is not a {_FORMAT} manifest")
    if manifest.get("key_dtype", "int64") not in KEY_DTYPES:
        raise CheckpointError(f"{where}: corrupt {MANIFEST}: key_dtype "
                              f"{manifest['key_dtype']!r}, expected one of {list(KEY_DTYPES)}")
    files = manifest.get("files")
    if not isinstance(files, list) or len(files) != manifest.get("num_shards") or any(
            not isinstance(f, str) or os.path.isabs(f) or ".." in f.split("/") for f in files):
        raise CheckpointError(f"{where}: corrupt {MANIFEST}: bad 'files' list")
    return manifest


def load_sharded(path: str | os.PathLike, placement: MeshAxis, *,
                 shard_size: int | None = None, constant_value: float = 0.0):
    """Reads a checkpoint written by :func:`save_sharded` onto ``placement`` (any shard
    count).

    Args:
        path: the checkpoint directory.
        placement: where the table goes.
        shard_size: slots per new shard; default: the saved slots in all, spread evenly.
        constant_value: the row of free slots when entries are reinserted.

    Raises:
        CheckpointError: a missing or corrupt manifest or shard file.
        OpArgumentError: the entries do not fit ``shard_size`` in some shard.
    """
    m = placement.num_shards
    manifest = read_manifest(path)
    n, size, dim = manifest["num_shards"], manifest["shard_size"], manifest["embedding_dim"]
    per = -(-(n * size) // m) if shard_size is None else int(shard_size)
    files = [os.path.join(path, f) for f in manifest["files"]]
    policy = dict(max_load_factor=manifest["max_load_factor"],
                  load_policy=manifest["load_policy"],
                  key_dtype=manifest.get("key_dtype", "int64"))  # absent: an older manifest
    if n == m and per == size:
        local = {i: read_table_file(files[i]).replace(**policy) for i in placement.shards_here()}
        shards = placement.assemble(local)
    else:
        shards = _reinsert(files, placement, per, dim, float(constant_value), policy, path)
    table = placement.rebuild(None, shards)
    return table.replace(unrouted=table.unrouted + np.int32(manifest.get("unrouted", 0)))


def _reinsert(files, placement, per, dim, constant_value, policy, path) -> HashTable:
    # The new shards are built on their devices; each file is read once and replicated to
    # the devices (one shard's worth of extra memory each, never the whole table), and one
    # program (compiled once per file shape, not per device) moves every device's entries.
    mesh, axis, m = placement.mesh, placement.axis, placement.num_shards
    target = init_table(m * per, dim, initializer_mode="constant", constant_value=constant_value,
                        placement=placement).shards
    expected = jax.jit(lambda: jnp.zeros(m, jnp.int32),  # placed as the mover returns it
                       out_shardings=NamedSharding(mesh, P()))()
    dropped = 0
    for file in files:
        source = jax.device_get(read_table_file(file))
        dropped += int(source.dropped)
        words = np.array([dropped % 2**64], np.uint64).view(np.uint32)
        target, live, expected = _mover(mesh, axis, m)(
            target, *global_replicated(mesh, (expected, source, words[0], words[1])))
    live, expected = np.asarray(jax.device_get(live)), np.asarray(jax.device_get(expected))
    for j in np.flatnonzero(live != expected):
        raise OpArgumentError("load", "shard_size", f"room for {expected[j]} entries in "
                              f"shard {j}", f"{per} slots kept {live[j]}",
                              f"Pass a larger shard_size to load {os.fspath(path)!r}.")
    return target.replace(**policy)


@functools.lru_cache(maxsize=16)
def _mover(mesh, axis: str, m: int):
    """``(target, expected, source, dropped words) -> (target, live, expected)``: every
    shard rehashes the live entries it owns of the replicated ``source`` table and sets its
    counts from its flags (shard 0 carries the files' ``dropped``); ``live`` and
    ``expected`` (entries owned so far) are ``[m]``, replicated."""
    def local(target, expected, source, dropped_lo, dropped_hi):
        me = jax.lax.axis_index(axis)
        live = (source.flags & (VALID | EVICTED)) == VALID
        mine = live & (owner_shard(source.key_lo, source.key_hi, m) == me)
        owned = source.replace(flags=jnp.where(mine, source.flags, jnp.uint8(0)))
        t = rehash(owned, squeeze(target))
        live = (t.flags & (VALID | EVICTED)) == VALID
        first = me == 0
        t = t.replace(live=jnp.sum(live, dtype=jnp.int32),
                      not_exported=jnp.sum(live & ((t.flags & EXPORT) == 0), dtype=jnp.int32),
                      dropped=Counter64(jnp.where(first, dropped_lo, np.uint32(0)),
                                        jnp.where(first, dropped_hi, np.uint32(0))))
        def per_shard(x):
            return jax.lax.psum(jnp.zeros(m, jnp.int32).at[me].set(x), axis)

        return (expand(t), per_shard(t.live),
                expected + per_shard(jnp.sum(mine, dtype=jnp.int32)))

    spec = P(axis)
    return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(spec, P(), P(), P(), P()),
                                 out_specs=(spec, P(), P())), donate_argnums=(0,))
