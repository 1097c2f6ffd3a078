"""``save`` / ``load``: a table on any placement to disk and back.

A table on one device is one file (:mod:`~jaxops.ops.hashtable.table_file`); a table on a
mesh is a directory of one such file per shard and a manifest
(:mod:`~jaxops.ops.hashtable.sharded_checkpoint`), which loads onto any shard count.

>>> import os, tempfile, numpy as np, jaxops.hashtable as ht
>>> t = ht.init_table(8, 2, initializer_mode="constant")
>>> t, _, _ = ht.lookup_or_insert(t, np.array([1, 2], np.int64))
>>> path = os.path.join(tempfile.mkdtemp(), "table.jxht")
>>> ht.save(t, path)
>>> int(ht.load(path).live)
2
"""

from __future__ import annotations

import os
from typing import Any

from jaxops.core.errors import CheckpointError, OpArgumentError
from jaxops.ops.hashtable.checkpoint_files import check_path
from jaxops.ops.hashtable.on_mesh import MeshAxis
from jaxops.ops.hashtable.placement import Placement, placement_of
from jaxops.ops.hashtable.sharded_checkpoint import (is_sharded_checkpoint, load_sharded,
                                                     save_sharded)
from jaxops.ops.hashtable.table_file import read_table_file, write_table_file

__all__ = ["CheckpointError", "load", "save"]


def save(table: Any, path: str | os.PathLike) -> None:
    """Writes ``table`` to ``path``: one file for a table on one device (written
    atomically: a crash leaves the old file or the new one), a directory for a table on a
    mesh (every process of a multi-process run must call it: a collective).

    Raises:
        FileNotFoundError, PermissionError: (naming ``path``) the directory is missing or
            not writable.
    """
    place = placement_of("save", table)
    if place.routes:
        save_sharded(table, path)
    else:
        write_table_file(table, path)


def load(path: str | os.PathLike, *, placement: Placement | None = None, mesh: Any = None,
         axis: str | None = None, shard_size: int | None = None,
         constant_value: float = 0.0) -> Any:
    """Reads a table written by :func:`save`.

    Every file is checked before it is trusted: the header's fields and their ranges, the
    payload's length and SHA-256, every bucket, the counts, and the structure (each key on
    its probe path, none twice).

    Args:
        path: a table file, or a sharded checkpoint's directory.
        placement: where a sharded checkpoint goes (a :class:`~.on_mesh.MeshAxis`, any
            shard count; ``mesh=`` and ``axis=`` say the same). A table file loads onto one
            device.
        shard_size, constant_value: for a sharded checkpoint loaded onto another shard
            count: slots per new shard (default: the saved slots spread evenly) and the row
            of free slots.

    Raises:
        CheckpointError: not a table checkpoint, an unsupported version, a truncated file, a
            checksum mismatch, a bad header or content that is not a valid table.
    """
    path = check_path("load", path)
    if placement is None and mesh is not None:
        placement = MeshAxis(mesh, axis)
    sharded = is_sharded_checkpoint(path)
    if placement is None or not placement.routes:
        if sharded:
            raise OpArgumentError("load", "placement", "a MeshAxis (or mesh= and axis=) for a "
                                  "sharded checkpoint (a directory with a manifest)",
                                  repr(placement))
        return read_table_file(path)
    if not sharded:
        raise CheckpointError(f"{path!r}: not a sharded table checkpoint (no manifest); a "
                              "table file loads onto one device: load(path)")
    return load_sharded(path, placement, shard_size=shard_size, constant_value=constant_value)
