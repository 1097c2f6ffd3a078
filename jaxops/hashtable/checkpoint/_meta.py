"""``jaxops.json``: what jaxops adds to an Orbax checkpoint of a train state, and its checks.

Orbax stores the arrays; this file, beside them in the same directory (written in the
same atomic commit), holds what Orbax does not: every stored array's shape, dtype and
checksum (per shard for a table's and its optimizer state's arrays; see
:mod:`~jaxops.hashtable.checkpoint._checksums`), each table's layout and static fields, and which
optimizer state belongs to which table. The file is ``{"body": ..., "sha256": ...}``, the
SHA-256 of the body's canonical JSON, so that every byte a restore depends on is checked:
this file by its digest, Orbax's files by the arrays' checksums.

:func:`read_meta` checks the digest, then every field (type, range, and that the tables'
and states' arrays are listed with shapes that fit their layout), and raises
:class:`~jaxops.errors.CheckpointError` naming the file and the field.

>>> import os, tempfile, numpy as np, jaxops.hashtable as ht
>>> from jaxops.hashtable.checkpoint._tree import parts
>>> from jaxops.hashtable.checkpoint._checksums import hex_sums, host_sums
>>> t = ht.init_table(8, 2, initializer_mode="constant")
>>> found = parts({"table": t})
>>> body = make_body(found, {n: [hex_sums(host_sums(np.asarray(x)))] for n, x in found.flat().items()})
>>> d = tempfile.mkdtemp()
>>> write_meta(d, body)
>>> read_meta(d)["tables"]["table"]["load_policy"]
'error'
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from typing import Any

import numpy as np

from jaxops.core.errors import CheckpointError
from jaxops.hashtable._placement.load_policy import LOAD_POLICIES
from jaxops.hashtable._table.checks import KEY_DTYPES
from jaxops.hashtable._table.row_dtype import ROW_DTYPES
from jaxops.hashtable._table.table import MAX_BUCKET_SIZE
from jaxops.hashtable.checkpoint._tree import SHARD_FIELDS, SLOT_FIELDS, Parts

__all__ = ["FORMAT", "META_FILE", "PY_SCALARS", "VERSION", "dtype_name", "make_body",
           "is_checkpoint", "read_meta", "write_meta"]

#: The Python scalar types a state may hold, by the name the metadata gives them.
PY_SCALARS = {"py:bool": bool, "py:int": int, "py:float": float, "py:complex": complex}

META_FILE = "jaxops.json"
FORMAT = "jaxops-train-state"
VERSION = 1
_MAX_META_BYTES = 16 << 20  # ~150 bytes a leaf: 100,000 leaves; more is not a jaxops file
_NAME = re.compile(r"^(~root|[A-Za-z0-9_~-]+(\.[A-Za-z0-9_~-]+)*)$")
_SUM = re.compile(r"^[0-9a-f]{16}$")
_KINDS = ("plain", "table", "slot", "shard")
_TABLE_DTYPES = {"key_lo": "uint32", "key_hi": "uint32", "counter_lo": "uint32",
                 "counter_hi": "uint32", "flags": "uint8", "values": "float32",
                 "last_access": "uint32", "epoch": "uint32", "live": "int32",
                 "not_exported": "int32", "dropped.lo": "uint32", "dropped.hi": "uint32", "clock": "uint32",
                 "unrouted": "int32"}


def make_body(found: Parts, sums: dict[str, list[str]]) -> dict:
    """The metadata of a train state taken apart (``sums``: name → checksums as hex)."""
    flat = found.flat()
    leaves = {n: {"kind": found.kinds[n], "shape": [int(d) for d in np.shape(x)],
                  "dtype": dtype_name(x), "sums": list(sums[n])} for n, x in flat.items()}
    tables = {n: t.statics() for n, t in found.tables.items()}
    states = {n: {"table": s.table, "slot": sorted(s.slot),
                  "shard": sorted(set(s.leaves) - set(s.slot))} for n, s in found.states.items()}
    return {"format": FORMAT, "version": VERSION, "leaves": leaves, "tables": tables,
            "states": states}


def dtype_name(x: Any) -> str:
    """The dtype of an array; ``"py:int"`` (``float``, ``bool``, ``complex``) for a Python
    scalar, which a restore gives back as one whatever the target's dtype (as Orbax does)."""
    if isinstance(x, (bool, int, float, complex)):
        return f"py:{type(x).__name__}"
    return str(getattr(x, "dtype", None) or np.asarray(x).dtype)


def _canonical(body: dict) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def write_meta(directory: str | os.PathLike, body: dict) -> None:
    """Writes ``jaxops.json`` into ``directory`` (a checkpoint being committed)."""
    data = json.dumps({"body": body, "sha256": hashlib.sha256(_canonical(body)).hexdigest()},
                      sort_keys=True).encode()
    with open(os.path.join(os.fspath(directory), META_FILE), "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def read_meta(directory: str | os.PathLike) -> dict:
    """The checked body of ``directory``'s ``jaxops.json`` (see the module docstring).

    Raises:
        CheckpointError: no such file (not a jaxops checkpoint), a digest mismatch, or a
            field that is missing, of the wrong type or out of range.
    """
    body, where = _signed_body(directory)
    _check_body(body, where)
    return body


def is_checkpoint(directory: str | os.PathLike) -> bool:
    """Whether ``directory`` is a jaxops checkpoint: it holds a ``jaxops.json`` whose SHA-256
    matches its body. jaxops writes that file in the checkpoint's own atomic commit, so every
    checkpoint it saved holds one, whatever else Orbax writes beside it, and no directory
    holds one by chance.

    >>> import tempfile
    >>> is_checkpoint(tempfile.mkdtemp())
    False
    """
    try:
        _signed_body(directory)
    except CheckpointError:
        return False
    return True


def _signed_body(directory: str | os.PathLike) -> tuple[dict, str]:
    """The body of ``directory``'s ``jaxops.json`` once its digest is checked, and the
    file's name for messages."""
    if not os.path.isdir(directory):
        raise CheckpointError(f"{os.fspath(directory)!r}: not a directory (missing, or a "
                              "file): a checkpoint is the directory that save or Orbax wrote")
    path = os.path.join(os.fspath(directory), META_FILE)
    where = repr(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise CheckpointError(f"{where}: no such file: {os.fspath(directory)!r} is not a "
                              "jaxops train-state checkpoint (saved with "
                              "jaxops.hashtable.checkpoint.Save or ht.save)") from None
    if not os.path.isfile(path) or os.path.islink(path):
        raise CheckpointError(f"{where}: not a regular file")
    if st.st_size > _MAX_META_BYTES:
        raise CheckpointError(f"{where}: {st.st_size} bytes, more than the "
                              f"{_MAX_META_BYTES} a jaxops.json can hold")
    with open(path, "rb") as f:
        raw = f.read(_MAX_META_BYTES + 1)
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise CheckpointError(f"{where}: corrupt: not JSON ({e})") from None
    if not isinstance(doc, dict) or set(doc) != {"body", "sha256"} or \
            not isinstance(doc["body"], dict):
        raise CheckpointError(f"{where}: corrupt: expected an object with 'body' and 'sha256'")
    if hashlib.sha256(_canonical(doc["body"])).hexdigest() != doc["sha256"]:
        raise CheckpointError(f"{where}: corrupt: its SHA-256 does not match its content")
    return doc["body"], where


def _fail(where: str, field: str, value: Any, expected: str) -> None:
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    raise CheckpointError(f"{where}: corrupt: field {field!r} is {shown}, expected {expected}")


def _int(where: str, field: str, value: Any, lo: int, hi: int) -> int:
    if type(value) is not int or not lo <= value <= hi:
        _fail(where, field, value, f"an int in [{lo}, {hi}]")
    return value


def _check_body(body: dict, where: str) -> None:
    if body.get("format") != FORMAT:
        _fail(where, "format", body.get("format"), repr(FORMAT))
    if body.get("version") != VERSION:
        raise CheckpointError(f"{where}: format version {body.get('version')!r}; this jaxops "
                              f"reads version {VERSION}")
    for key in ("leaves", "tables", "states"):
        if not isinstance(body.get(key), dict):
            _fail(where, key, body.get(key), "an object")
    for name, leaf in body["leaves"].items():
        _check_leaf(where, name, leaf)
    for name, table in body["tables"].items():
        _check_table(where, name, table, body["leaves"])
    for name, state in body["states"].items():
        _check_state(where, name, state, body)


def _check_leaf(where: str, name: str, leaf: Any) -> None:
    field = f"leaves[{name!r}]"
    if not _NAME.match(name):
        _fail(where, field, name, "a leaf name")
    if not isinstance(leaf, dict) or set(leaf) != {"kind", "shape", "dtype", "sums"}:
        _fail(where, field, leaf, "an object with kind, shape, dtype and sums")
    if leaf["kind"] not in _KINDS:
        _fail(where, f"{field}.kind", leaf["kind"], f"one of {_KINDS}")
    shape = leaf["shape"]
    if not isinstance(shape, list) or len(shape) > 32:
        _fail(where, f"{field}.shape", shape, "a list of at most 32 sizes")
    for d in shape:
        _int(where, f"{field}.shape", d, 0, 2**48)
    if int(np.prod(shape, dtype=object)) > 2**48:
        _fail(where, f"{field}.shape", shape, "at most 2**48 elements")
    if not isinstance(leaf["dtype"], str) or len(leaf["dtype"]) > 40:
        _fail(where, f"{field}.dtype", leaf["dtype"], "a dtype name")
    if leaf["dtype"].startswith("py:") and (leaf["dtype"] not in PY_SCALARS or shape):
        _fail(where, f"{field}.dtype", leaf["dtype"], f"one of {sorted(PY_SCALARS)} (a scalar)")
    sums = leaf["sums"]
    if not isinstance(sums, list) or not sums or not all(
            isinstance(s, str) and _SUM.match(s) for s in sums):
        _fail(where, f"{field}.sums", sums, "a non-empty list of 16 hex digits each")


def _check_table(where: str, name: str, table: Any, leaves: dict) -> None:
    field = f"tables[{name!r}]"
    keys = {"sharded", "num_shards", "shard_size", "embedding_dim", "max_load_factor",
            "load_policy", "key_dtype", "initializer", "route_capacity"}
    if not isinstance(table, dict) or set(table) != keys:
        _fail(where, field, table, f"an object with {sorted(keys)}")
    if type(table["sharded"]) is not bool:
        _fail(where, f"{field}.sharded", table["sharded"], "true or false")
    n = _int(where, f"{field}.num_shards", table["num_shards"], 1, 2**20)
    if not table["sharded"] and n != 1:
        _fail(where, f"{field}.num_shards", n, "1 for a table on one device")
    per = _int(where, f"{field}.shard_size", table["shard_size"], 1, MAX_BUCKET_SIZE)
    dim = _int(where, f"{field}.embedding_dim", table["embedding_dim"], 1, 2**31 - 1)
    factor = table["max_load_factor"]
    if type(factor) not in (int, float) or not 0.0 < factor <= 1.0:
        _fail(where, f"{field}.max_load_factor", factor, "a number in (0, 1]")
    if not isinstance(table["load_policy"], str) or table["load_policy"] not in LOAD_POLICIES:
        _fail(where, f"{field}.load_policy", table["load_policy"],
              f"one of {sorted(LOAD_POLICIES)}")
    if table["key_dtype"] not in KEY_DTYPES:
        _fail(where, f"{field}.key_dtype", table["key_dtype"], f"one of {list(KEY_DTYPES)}")
    _check_initializer(where, f"{field}.initializer", table["initializer"])
    capacity = table["route_capacity"]
    if capacity is not None and (not table["sharded"] or type(capacity) is not int or
                                 capacity < 1):
        _fail(where, f"{field}.route_capacity", capacity, "null, or an int >= 1 on a mesh")
    lead = [n] if table["sharded"] else []
    want = {f: lead + [per] for f in SLOT_FIELDS}
    want["values"] = lead + [per, dim]
    want.update({f: list(lead) for f in SHARD_FIELDS})
    if table["sharded"]:
        want["unrouted"] = []
    for f, shape in want.items():
        leaf = leaves.get(f"{name}.{f}")
        dtypes = ROW_DTYPES if f == "values" else (_TABLE_DTYPES[f],)  # rows: any row dtype
        if leaf is None or leaf["kind"] != "table" or leaf["shape"] != shape or \
                leaf["dtype"] not in dtypes or len(leaf["sums"]) != (
                    n if lead and f != "unrouted" else 1):
            _fail(where, f"leaves[{name + '.' + f!r}]", leaf,
                  f"a table array of shape {shape}, dtype {' or '.join(dtypes)}")


def _check_initializer(where: str, field: str, init: Any) -> None:
    """``["constant", number]``, ``["uniform", low, high, seed]``, ``["sampled"]`` or
    ``["callable", name, seed]``, a seed being null or a list of uint32 words."""
    number = lambda x: type(x) in (int, float)  # noqa: E731
    seed = lambda x: x is None or (isinstance(x, list) and len(x) <= 8 and all(  # noqa: E731
        type(w) is int and 0 <= w < 2**32 for w in x))
    ok = isinstance(init, list) and bool(init) and (
        (init[0] == "constant" and len(init) == 2 and number(init[1])) or
        (init[0] == "uniform" and len(init) == 4 and number(init[1]) and number(init[2])
         and seed(init[3])) or
        (init == ["sampled"]) or
        (init[0] == "callable" and len(init) == 3 and isinstance(init[1], str)
         and len(init[1]) < 400 and seed(init[2])))
    if not ok:
        _fail(where, field, init, "['constant', x], ['uniform', low, high, seed], ['sampled'] "
              "or ['callable', name, seed]")


def _check_state(where: str, name: str, state: Any, body: dict) -> None:
    field = f"states[{name!r}]"
    if not isinstance(state, dict) or set(state) != {"table", "slot", "shard"}:
        _fail(where, field, state, "an object with table, slot and shard")
    table = body["tables"].get(state["table"]) if isinstance(state["table"], str) else None
    if table is None:
        _fail(where, f"{field}.table", state["table"], "the name of a table of the checkpoint")
    lead = [table["num_shards"]] if table["sharded"] else []
    for kind in ("slot", "shard"):
        names = state[kind]
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            _fail(where, f"{field}.{kind}", names, "a list of leaf names")
        for n in names:
            leaf = body["leaves"].get(n)
            ok = leaf is not None and leaf["kind"] == kind and n.startswith(name + ".")
            if ok and kind == "slot":
                ok = leaf["shape"][:len(lead) + 1] == lead + [table["shard_size"]]
            if ok and lead:
                ok = leaf["shape"][:1] == lead and len(leaf["sums"]) == lead[0]
            if not ok:
                _fail(where, f"leaves[{n!r}]", leaf, f"a {kind} leaf of state {name!r} laid "
                      f"out like table {state['table']!r}")
