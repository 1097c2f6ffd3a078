"""One table in one file: versioned, checksummed, atomically written, streamed.

:func:`write_table_file` and :func:`read_table_file` are what ``save`` / ``load`` of a
table on one device do (see :mod:`~jaxops.ops.hashtable.checkpoint`); a table on a mesh is
one such file per shard.

File layout: the 8-byte magic ``b"JXHTABLE"``, uint32 LE format version, uint32 LE header
length, a JSON header (sizes, counts, payload length, SHA-256 of the payload), then the
payload: the CANN bucket array (:func:`~jaxops.ops.hashtable.cann_bytes.to_cann_bytes`),
byte-exact, and from version 2 the uint32 LE ``last_access`` of every slot after it.
Version 2 headers also hold the table's ``clock``, ``max_load_factor`` and ``load_policy``,
and may hold its ``key_dtype`` (``"int64"`` when absent, as in files written before it);
version 1 files (no scores, no load fields) still load, with ``last_access`` and ``clock``
0 and the default load limit and policy.

Both directions move the table in chunks of about
:data:`~jaxops.ops.hashtable.host_chunks.CHUNK_BYTES`: ``save`` never builds the byte image
(it writes a header with a placeholder checksum, streams the payload while hashing it, then
writes the real checksum in place); ``load`` reads each chunk into one reused buffer,
checks it and writes it into a table preallocated on the device. Temporary files are named
``.<name>.<pid>.<random>.tmp`` next to the target; a save or load of the target removes the
ones left by a writer that died (see :func:`~jaxops.ops.hashtable.checkpoint_files.is_stale`).

>>> import os, tempfile, numpy as np, jaxops.hashtable as ht
>>> t = ht.init_table(8, 2, initializer_mode="constant")
>>> t, _, _ = ht.lookup_or_insert(t, np.array([1, 2], np.int64))
>>> path = os.path.join(tempfile.mkdtemp(), "table.jxht")
>>> write_table_file(t, path)
>>> int(read_table_file(path).live)
2
"""

from __future__ import annotations

import hashlib
import json
import os
import struct

import jax
import numpy as np

from jaxops.core.errors import CheckpointError
from jaxops.ops.hashtable.cann_bytes import cann_rows, live_counts, parse_cann_rows, row_bytes
from jaxops.ops.hashtable.checkpoint_files import atomic_writer, check_path, remove_stale_temps
from jaxops.ops.hashtable.checks import KEY_DTYPES
from jaxops.ops.hashtable.host_chunks import TableWriter, chunk_slots_for, iter_host_chunks
from jaxops.ops.hashtable.load_policy import LOAD_POLICIES
from jaxops.ops.hashtable.murmur import home_slot
from jaxops.ops.hashtable.probe_check import ProbeCheck
from jaxops.ops.hashtable.table import MAX_BUCKET_SIZE, HashTable, check_table

__all__ = ["MAGIC", "VERSION", "CheckpointError", "read_table_file", "write_table_file"]

MAGIC = b"JXHTABLE"
VERSION = 2
_READS = (1, 2)  # versions this jaxops loads
_SCORE_BYTES = 4  # per slot, after the buckets (version 2): last_access
_PREFIX = struct.Struct("<8sII")
_MAX_HEADER = 1 << 16  # today's headers are ~200 bytes; more is a corrupt length word
_NO_SUM = "0" * 64  # the checksum's placeholder while the payload streams
_home = jax.jit(home_slot, static_argnums=2)


def write_table_file(table: HashTable, path: str | os.PathLike) -> None:
    """Writes ``table`` to ``path`` atomically: a temporary file in the same directory is
    written chunk by chunk, flushed and fsync'ed, then renamed over ``path`` (and the
    directory fsync'ed), so a crash leaves either the old file or the new one. The file's
    mode follows the umask, like any new file's.

    Raises:
        FileNotFoundError, PermissionError: (naming ``path``) the directory is missing or
            not writable.
    """
    table = check_table("save", table)
    size, dim = table.bucket_size, table.embedding_dim
    fields = {"bucket_size": size, "embedding_dim": dim, "live": int(table.live),
              "not_exported": int(table.not_exported), "dropped": int(table.dropped),
              "clock": int(table.clock), "max_load_factor": table.max_load_factor,
              "load_policy": table.load_policy, "key_dtype": table.key_dtype,
              "payload_bytes": size * (row_bytes(dim) + _SCORE_BYTES)}
    with atomic_writer("save", path) as f:
        header = _header_bytes(fields, _NO_SUM)
        f.write(_PREFIX.pack(MAGIC, VERSION, len(header)) + header)
        digest = hashlib.sha256()

        def put(chunk: np.ndarray) -> None:
            digest.update(chunk)
            f.write(memoryview(chunk).cast("B"))

        for _, rows in iter_host_chunks(table, chunk_slots_for(dim)):
            put(cann_rows(rows))
        step = chunk_slots_for(dim)
        for start in range(0, size, step):
            put(np.ascontiguousarray(jax.device_get(_slice_scores(table.last_access, start,
                                                                  min(step, size - start))),
                                     "<u4").view(np.uint8))
        f.seek(_PREFIX.size)
        f.write(_header_bytes(fields, digest.hexdigest()))  # same length: fixed-width hex


def _slice_scores(last_access, start: int, n: int):
    return _slice_column(last_access, np.int32(start), n)


_slice_column = jax.jit(lambda a, start, n: jax.lax.dynamic_slice_in_dim(a, start, n),
                        static_argnums=2)


def _header_bytes(fields: dict, sha256: str) -> bytes:
    return json.dumps({**fields, "sha256": sha256}, sort_keys=True).encode()


def read_table_file(path: str | os.PathLike) -> HashTable:
    """Reads a table written by :func:`write_table_file`, chunk by chunk into a new table.

    Every file is checked before it is trusted: the header's fields and their ranges, the
    payload's length and SHA-256, every bucket (as :func:`from_cann_bytes`), the counts, and
    the structure: each used slot's key lies on its probe path (no empty slot between its
    home slot and it) and no key is held twice.

    Raises:
        CheckpointError: not a table file, an unsupported version, a truncated file, a
            checksum mismatch, a bad header or content that is not a valid table.
    """
    path = check_path("load", path)
    remove_stale_temps(path)
    where = repr(path)
    with open(path, "rb") as f:
        size, dim, header = _read_header(f, where)
        rest = os.fstat(f.fileno()).st_size - f.tell()
        if rest != header["payload_bytes"]:
            kind = "truncated" if rest < header["payload_bytes"] else "has trailing bytes"
            raise CheckpointError(f"{where}: {kind}: payload of {rest} bytes, header says "
                                  f"{header['payload_bytes']}")
        return _read_payload(f, where, size, dim, header)


def _read_header(f, where: str) -> tuple[int, int, dict]:
    prefix = f.read(_PREFIX.size)
    if len(prefix) < _PREFIX.size:
        raise CheckpointError(f"{where}: truncated: {len(prefix)} bytes, shorter than the "
                              f"{_PREFIX.size}-byte prefix")
    magic, version, header_len = _PREFIX.unpack(prefix)
    if magic != MAGIC:
        raise CheckpointError(f"{where}: not a jaxops hash-table file (magic {magic!r}, "
                              f"expected {MAGIC!r})")
    if version not in _READS:
        raise CheckpointError(f"{where}: format version {version}; this jaxops reads versions "
                              f"{', '.join(map(str, _READS))}")
    if header_len > _MAX_HEADER:
        raise CheckpointError(f"{where}: corrupt header: length {header_len} (at most "
                              f"{_MAX_HEADER})")
    raw = f.read(header_len)
    if len(raw) < header_len:
        raise CheckpointError(f"{where}: truncated inside the header "
                              f"({_PREFIX.size + len(raw)} of {_PREFIX.size + header_len} bytes)")
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise CheckpointError(f"{where}: corrupt header: {e}") from None
    _check_header(header, where, version)
    size, dim = header["bucket_size"], header["embedding_dim"]
    header["version"] = version
    per_slot = row_bytes(dim) + (_SCORE_BYTES if version >= 2 else 0)
    if header["payload_bytes"] != size * per_slot:
        raise CheckpointError(f"{where}: corrupt header: {header['payload_bytes']} payload "
                              f"bytes for {size} buckets of dim {dim} (version {version})")
    return size, dim, header


_INT32_MAX = 2**31 - 1
_HEADER_INTS = {"bucket_size": (1, MAX_BUCKET_SIZE), "embedding_dim": (1, _INT32_MAX),
                "live": (0, MAX_BUCKET_SIZE), "not_exported": (0, MAX_BUCKET_SIZE),
                "dropped": (0, 2**64 - 1), "payload_bytes": (0, 2**63 - 1)}


def _check_header(header, where: str, version: int) -> None:
    """Every field present, of its type and in its range: a file from elsewhere fails here
    with a CheckpointError, never with a TypeError/OverflowError further on."""
    if not isinstance(header, dict):
        raise CheckpointError(f"{where}: corrupt header: a JSON {type(header).__name__}, "
                              "expected an object")
    ints = {**_HEADER_INTS, "clock": (0, 2**32 - 1)} if version >= 2 else _HEADER_INTS
    for name, (lo, hi) in ints.items():
        v = header.get(name)
        if type(v) is not int or not lo <= v <= hi:
            raise CheckpointError(f"{where}: corrupt header: field {name!r} is {v!r}, expected "
                                  f"an int in [{lo}, {hi}]")
    if version >= 2:
        factor, policy = header.get("max_load_factor"), header.get("load_policy")
        if type(factor) not in (int, float) or not 0.0 < factor <= 1.0:
            raise CheckpointError(f"{where}: corrupt header: field 'max_load_factor' is "
                                  f"{factor!r}, expected a number in (0, 1]")
        if not isinstance(policy, str) or policy not in LOAD_POLICIES:
            raise CheckpointError(f"{where}: corrupt header: field 'load_policy' is "
                                  f"{policy!r}, expected one of {sorted(LOAD_POLICIES)}")
    if header.get("key_dtype", "int64") not in KEY_DTYPES:
        raise CheckpointError(f"{where}: corrupt header: field 'key_dtype' is "
                              f"{header['key_dtype']!r}, expected one of {list(KEY_DTYPES)}")
    sha = header.get("sha256")
    if not isinstance(sha, str) or len(sha) != 64 or set(sha) - set("0123456789abcdef"):
        raise CheckpointError(f"{where}: corrupt header: field 'sha256' is {sha!r}, expected "
                              "64 lowercase hex digits")


def _read_payload(f, where: str, size: int, dim: int, header: dict) -> HashTable:
    """Reads, checks and writes into a new table chunk by chunk. A content fault found
    mid-way is raised after the rest is hashed, so that a damaged file is reported as a
    checksum mismatch (its cause) rather than as whatever the damage looks like."""
    width = row_bytes(dim)
    step = chunk_slots_for(dim)
    buf = np.empty(min(step, size) * width, np.uint8)
    digest, probe, writer = hashlib.sha256(), ProbeCheck(size), TableWriter(size, dim)
    live = not_exported = 0
    fault = None
    for start in range(0, size, step):
        n = min(step, size - start)
        chunk = buf[:n * width]
        if f.readinto(memoryview(chunk)) != chunk.size:  # a regular file reads in full
            raise CheckpointError(f"{where}: truncated while reading (the file changed?)")
        digest.update(chunk)
        if fault is not None:
            continue
        try:
            rows = parse_cann_rows(chunk.reshape(n, width), dim, "load", start)
            probe.feed(start, rows.key_lo, rows.key_hi, rows.flags,
                       np.asarray(_home(rows.key_lo, rows.key_hi, size)))
        except ValueError as e:  # OpArgumentError from a bucket, ValueError from ProbeCheck
            fault = e
            continue
        counts = live_counts(rows.flags)
        live, not_exported = live + counts[0], not_exported + counts[1]
        writer.write(start, rows)
    if header["version"] >= 2:
        _read_scores(f, where, size, step, digest, writer if fault is None else None)
    if digest.hexdigest() != header["sha256"]:
        raise CheckpointError(f"{where}: corrupt: the payload's SHA-256 does not match the header")
    try:
        if fault is not None:
            raise fault
        probe.finish()
    except ValueError as e:
        raise CheckpointError(f"{where}: corrupt content (valid checksum): {e}") from None
    if (live, not_exported) != (header["live"], header["not_exported"]):
        raise CheckpointError(f"{where}: corrupt: counts in the header (live "
                              f"{header['live']}, not exported {header['not_exported']}) "
                              f"disagree with the flags ({live}, {not_exported})")
    loads = {} if header["version"] < 2 else {
        "clock": header["clock"], "max_load_factor": float(header["max_load_factor"]),
        "load_policy": header["load_policy"]}
    return writer.finish(live=live, not_exported=not_exported, dropped=header["dropped"],
                         key_dtype=header.get("key_dtype", "int64"), **loads)


def _read_scores(f, where: str, size: int, step: int, digest, writer: TableWriter | None
                 ) -> None:
    """Reads the ``last_access`` section (version 2) into ``writer`` (None: only hashed)."""
    buf = np.empty(min(step, size), "<u4")
    for start in range(0, size, step):
        chunk = buf[:min(step, size - start)]
        if f.readinto(memoryview(chunk).cast("B")) != chunk.nbytes:
            raise CheckpointError(f"{where}: truncated while reading (the file changed?)")
        digest.update(chunk)
        if writer is not None:
            writer.write_last_access(start, chunk.copy())  # buf is reused: dispatch is async
