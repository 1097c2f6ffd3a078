"""``save`` / ``load``: one call to write a table (or a whole train state) as an Orbax
checkpoint and to read it back, synchronously: conveniences over
:class:`~jaxops.hashtable.checkpoint._handler.Checkpointer`, the same format that
``orbax.checkpoint.CheckpointManager`` writes with
:class:`~jaxops.hashtable.checkpoint._handler.Save`.

>>> import os, tempfile, numpy as np, jaxops.hashtable as ht
>>> t = ht.init_table(8, 2, initializer_mode="constant")
>>> t, _, _ = ht.lookup_or_insert(t, np.array([1, 2], np.int64))
>>> path = os.path.join(tempfile.mkdtemp(), "table")
>>> ht.save(t, path)
>>> int(ht.load(path).live)
2
"""

from __future__ import annotations

import os
from typing import Any

import jax

from jaxops.core.errors import CheckpointError, OpArgumentError
from jaxops.core.memory import refuse_unless_fits
from jaxops.hashtable._ops.create import init_table
from jaxops.hashtable._placement.on_mesh import MeshAxis
from jaxops.hashtable._placement.placement import ONE_DEVICE, Placement
from jaxops.hashtable._table.table import slot_bytes
from jaxops.hashtable.checkpoint._handler import Checkpointer
from jaxops.hashtable.checkpoint._meta import read_meta

__all__ = ["CheckpointError", "check_path", "load", "save"]

def check_path(op: str, path: object) -> str:
    """``path`` as a ``str`` if it is a file-system path; else an
    :class:`~jaxops.errors.OpArgumentError` naming ``op``.

    >>> check_path("save", None)
    Traceback (most recent call last):
    ...
    jaxops.core.errors.OpArgumentError: save: argument 'path': expected a file path (str or os.PathLike), got NoneType.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise OpArgumentError(op, "path", "a file path (str or os.PathLike)", type(path).__name__)
    path = os.fspath(path)
    if not isinstance(path, str):
        raise OpArgumentError(op, "path", "a file path (str or os.PathLike of str)",
                              type(path).__name__)
    return path


def save(state: Any, path: str | os.PathLike, *, force: bool = False) -> None:
    """Writes ``state`` (a table on any placement, or a train state holding tables, row
    optimizer states and arrays) to the new directory ``path``; returns when it is
    committed. Every process of a multi-process run must call it.

    A save is atomic (Orbax writes ``<path>.orbax-checkpoint-tmp`` and renames it; a
    temporary left by a killed save of ``path`` is replaced) and takes its turn: saves into
    the same directory from other threads and processes wait for it
    (:mod:`~jaxops.hashtable.checkpoint._guard`). ``force=True`` replaces an existing checkpoint (or
    an empty directory): the new one is written beside it and the two are exchanged
    atomically once it is committed (by the primary process, the others waiting), so
    ``path`` holds a whole checkpoint at every moment. Anything at ``path`` that is not a
    checkpoint is refused, never deleted. A failed save leaves nothing behind.

    Raises:
        FileNotFoundError: (naming ``path``) its directory does not exist.
        CheckpointError: ``path`` exists (without ``force``), or is not a checkpoint.
        OSError: (naming ``path``) the file system refused a write (a full disk).
    """
    path = check_path("save", path)
    with Checkpointer() as ckptr:
        ckptr.save(path, state, force=force)
        ckptr.wait_until_finished()


def load(path: str | os.PathLike, target: Any = None, *, placement: Placement | None = None,
         mesh: Any = None, axis: str | None = None, shard_size: int | None = None,
         constant_value: float = 0.0) -> Any:
    """Reads a checkpoint written by :func:`save` (or by Orbax with
    :class:`~jaxops.hashtable.checkpoint._handler.Save`), every byte checked (see
    :mod:`~jaxops.hashtable.checkpoint._handler`).

    Args:
        path: the checkpoint directory.
        target: the state to restore into (see
            :class:`~jaxops.hashtable.checkpoint._handler.Restore`). Without it the checkpoint must
            hold one table, which comes back on ``placement``.
        placement: where a lone table goes (``mesh=`` and ``axis=`` say the same; default:
            one device for a table saved on one device). Another shard count than saved
            re-owns the keys.
        shard_size, constant_value: for a lone table on another layout: slots per shard
            (default: the saved slots spread evenly) and the row of free slots.

    Raises:
        CheckpointError: not a jaxops checkpoint, a checksum mismatch, content that is not a
            valid table, or a target that does not match it.
    """
    path = check_path("load", path)
    if placement is None and mesh is not None:
        placement = MeshAxis(mesh, axis)
    if target is None:
        target = _lone_table_target(path, placement, shard_size, constant_value)
    elif placement is not None or shard_size is not None:
        raise OpArgumentError("load", "placement", "None when a target is given (the target's "
                              "tables have their placement)", repr(placement))
    with Checkpointer() as ckptr:
        return ckptr.restore(os.path.abspath(path), target)


def _lone_table_target(path: str, placement, shard_size, constant_value) -> Any:
    body = read_meta(path)
    if set(body["tables"]) != {"~root"}:
        raise OpArgumentError("load", "target", "the state to restore into (this checkpoint "
                              "holds a train state, not one table)", "None",
                              "Pass load(path, target) with the state's structure.")
    saved = body["tables"]["~root"]
    n, size, dim = saved["num_shards"], saved["shard_size"], saved["embedding_dim"]
    if placement is None:
        if saved["sharded"]:
            raise OpArgumentError("load", "placement", "a MeshAxis (or mesh= and axis=) for a "
                                  "table saved on a mesh", "None")
        placement = ONE_DEVICE
    m = placement.num_shards
    per = -(-(n * size) // m) if shard_size is None else int(shard_size)
    # the checkpoint says how big: refused before anything is allocated
    dtype = body["leaves"]["~root.values"]["dtype"]  # the rows' (checked: a row dtype)
    refuse_unless_fits("load", "path", per * slot_bytes(dim, dtype),
                       f"{path!r} holds a table of {per * m} x {dim} slots, {per} a device",
                       placement.mesh.devices.flat if placement.routes else None)

    def make():
        return init_table(per * m, dim, initializer_mode="constant",
                          constant_value=constant_value, key_dtype=saved["key_dtype"],
                          placement=placement, dtype=dtype)

    return jax.eval_shape(make) if (n, size) == (m, per) else make()


