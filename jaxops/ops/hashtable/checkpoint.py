"""``save`` / ``load``: versioned, checksummed, atomically written table files.

File layout: the 8-byte magic ``b"JXHTABLE"``, uint32 LE format version, uint32 LE header
length, a JSON header (sizes, counts, payload length, SHA-256 of the payload), then the
payload: the CANN bucket array (:func:`~jaxops.ops.hashtable.cann_bytes.to_cann_bytes`).

>>> import os, tempfile, numpy as np, jaxops.hashtable as ht
>>> t = ht.init_table(8, 2, initializer_mode="constant")
>>> t, _, _ = ht.lookup_or_insert(t, np.array([1, 2], np.int64))
>>> path = os.path.join(tempfile.mkdtemp(), "table.jxht")
>>> ht.save(t, path)
>>> int(ht.load(path).live)
2
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile

import jax.numpy as jnp
import numpy as np

from jaxops.core.errors import JaxopsError
from jaxops.ops.hashtable.cann_bytes import from_cann_bytes, row_bytes, to_cann_bytes
from jaxops.ops.hashtable.table import HashTable, check_table

MAGIC = b"JXHTABLE"
VERSION = 1
_PREFIX = struct.Struct("<8sII")


class CheckpointError(JaxopsError, ValueError):
    """A table file that is not one, is of an unknown version, truncated or corrupt."""


def save(table: HashTable, path: str | os.PathLike) -> None:
    """Writes ``table`` to ``path`` atomically: a temporary file in the same directory is
    written, flushed and fsync'ed, then renamed over ``path`` (and the directory fsync'ed),
    so a crash leaves either the old file or the new one, never half of one."""
    table = check_table("save", table)
    payload = to_cann_bytes(table).tobytes()
    header = json.dumps({
        "bucket_size": table.bucket_size, "embedding_dim": table.embedding_dim,
        "live": int(table.live), "not_exported": int(table.not_exported),
        "dropped": int(table.dropped), "payload_bytes": len(payload),
        "sha256": hashlib.sha256(payload).hexdigest()}, sort_keys=True).encode()
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_PREFIX.pack(MAGIC, VERSION, len(header)) + header + payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def load(path: str | os.PathLike) -> HashTable:
    """Reads a table written by :func:`save`.

    Raises:
        CheckpointError: not a table file, an unsupported version, a truncated file, a
            checksum mismatch or a header that disagrees with the payload.
    """
    with open(path, "rb") as f:
        data = f.read()
    where = f"{os.fspath(path)!r}"
    if len(data) < _PREFIX.size:
        raise CheckpointError(f"{where}: truncated: {len(data)} bytes, shorter than the "
                              f"{_PREFIX.size}-byte prefix")
    magic, version, header_len = _PREFIX.unpack_from(data)
    if magic != MAGIC:
        raise CheckpointError(f"{where}: not a jaxops hash-table file (magic {magic!r}, "
                              f"expected {MAGIC!r})")
    if version != VERSION:
        raise CheckpointError(f"{where}: format version {version}; this jaxops reads version "
                              f"{VERSION}")
    end = _PREFIX.size + header_len
    if len(data) < end:
        raise CheckpointError(f"{where}: truncated inside the header ({len(data)} of {end} bytes)")
    try:
        header = json.loads(data[_PREFIX.size:end])
        size, dim, want = header["bucket_size"], header["embedding_dim"], header["payload_bytes"]
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{where}: corrupt header: {e}") from None
    payload = data[end:]
    if len(payload) != want:
        kind = "truncated" if len(payload) < want else "has trailing bytes"
        raise CheckpointError(f"{where}: {kind}: payload of {len(payload)} bytes, header says "
                              f"{want}")
    if want != size * row_bytes(dim):
        raise CheckpointError(f"{where}: corrupt header: {want} payload bytes for {size} "
                              f"buckets of dim {dim}")
    if hashlib.sha256(payload).hexdigest() != header.get("sha256"):
        raise CheckpointError(f"{where}: corrupt: the payload's SHA-256 does not match the header")
    table = from_cann_bytes(np.frombuffer(payload, np.uint8).reshape(size, -1), dim)
    counts = (int(table.live), int(table.not_exported))
    if counts != (header.get("live"), header.get("not_exported")):
        raise CheckpointError(f"{where}: corrupt: counts in the header disagree with the flags")
    return table.replace(dropped=jnp.int32(header.get("dropped", 0)))
