"""Inputs of the hash-table golden cases: their sizes, the developer's tables checked, and
tables and keys drawn from a seed (see :mod:`jaxops.golden.hashtable_specs`).

Generated tables are made with the public face of :mod:`jaxops.hashtable` and written as
CANN bucket bytes; generated keys avoid what CANN's kernels leave undefined or do otherwise
than the library (a new key whose probe meets a tombstone, a revived key with EXPORT or
FILTER set, repeated keys where the kernels race), so a generated case is what the kernel
writes.

>>> import numpy as np
>>> table, live, evicted = seeded_table(np.random.default_rng(0), 16, 2)
>>> bucket_bytes(table).shape, live.size, evicted.size
((16, 32), 4, 2)
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

import jaxops.hashtable as ht
from jaxops.core.errors import OpArgumentError
from jaxops.core.memory import refuse_unless_fits
from jaxops.golden.inputs import read_named
from jaxops.golden.specs import input_shape_dtype

__all__ = ["ADAM_FLOATS", "DEFAULT_SIZES", "SIZES", "bucket_bytes", "checked_list",
           "checked_single", "distinct_keys", "drawn_or_given", "key_input", "library_table",
           "mixed", "named_input", "new_keys", "picked", "refusal", "refuse_big", "seeded_table",
           "size_attr", "sizes_of", "table_input"]

SIZES = ("bucket_size", "embedding_dim")
DEFAULT_SIZES = {"bucket_size": 64, "embedding_dim": 4}
ADAM_FLOATS = ("m", "v", "beta1_power", "beta2_power", "lr", "weight_decay", "beta1", "beta2",
                "epsilon", "grad", "max_grad_norm")


def refusal(op: str, arg: str, expected: str, given, hint: str = "") -> OpArgumentError:
    return OpArgumentError(f"golden {op}", arg, expected, given, hint)


# -- sizes and inputs -------------------------------------------------------------------------

def size_attr(op: str, attrs: dict, name: str) -> int:
    """``bucket_size`` or ``embedding_dim`` of ``attrs`` (default 64 and 4), checked."""
    v = attrs.get(name, DEFAULT_SIZES[name])
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) \
            or not 1 <= int(v) < 2**31:
        raise refusal(op, name, "an int in [1, 2**31 - 1]", repr(v))
    return int(v)


def refuse_big(op: str, tables: int, size: int, dim: int) -> None:
    """A case holds each table about eight times (bytes before and after, the library's
    table, the reference's)."""
    need = 8 * tables * size * ht.cann.row_bytes(dim)
    refuse_unless_fits(f"golden {op}", "bucket_size", need, f"{tables} table(s) of {size} "
                       f"buckets of {ht.cann.row_bytes(dim)} bytes", devices=())


def named_input(op: str, inputs: dict, name: str, dtype=None, shape=None) -> np.ndarray:
    """Input ``name``, of ``dtype`` and ``shape`` where given (refused naming it else)."""
    if inputs.get(name) is None:
        raise refusal(op, "input", f"an input named {name!r}", "none",
                      "Name the arrays as CANN's inputs (jaxops golden OP --help).")
    a = np.asarray(inputs[name])
    if dtype is not None and a.dtype != np.dtype(dtype):
        raise refusal(op, name, np.dtype(dtype).name, str(a.dtype))
    if shape is not None and a.shape != tuple(shape):
        raise refusal(op, name, f"shape {list(shape)}", list(a.shape))
    return a


def table_input(op: str, inputs: dict, name: str, dim: int | None, dim_given: bool
                ) -> tuple[np.ndarray, int, int]:
    """A table input: its bytes, bucket_size and embedding_dim (the given one, else the
    default where its rows have that width)."""
    buf = named_input(op, inputs, name, np.uint8)
    dim = DEFAULT_SIZES["embedding_dim"] if dim is None else dim
    if buf.ndim != 2 or buf.shape[1] != ht.cann.row_bytes(dim):
        raise refusal(op, name, f"uint8 buckets [bucket_size, {ht.cann.row_bytes(dim)}] "
                      f"(embedding_dim {dim})", f"shape {list(buf.shape)}",
                      "" if dim_given else "Pass --embedding_dim for other rows.")
    return buf, buf.shape[0], dim


def library_table(op: str, name: str, buf: np.ndarray, dim: int):
    """The library's table of CANN bytes, one that never grows (a grown table would change
    the bucket array); its reader's refusals name the golden input."""
    try:
        table = ht.cann.from_cann_bytes(buf, dim)
    except OpArgumentError as e:
        raise refusal(op, name, e.expected, e.given) from None
    return ht.set_load_policy(table, max_load_factor=1.0)


def bucket_bytes(table) -> np.ndarray:
    """The library's table as CANN's bucket array (host uint8)."""
    return np.asarray(ht.cann.to_cann_bytes(table))


def key_input(op: str, inputs: dict, name: str, distinct: str = "", no_unused: bool = False
              ) -> np.ndarray:
    """1-D int64 keys; ``distinct`` (why) refuses a repeated key, ``no_unused`` key -1."""
    keys = named_input(op, inputs, name, np.int64)
    if keys.ndim != 1:
        raise refusal(op, name, "1-D int64 keys", f"shape {list(keys.shape)}")
    if distinct:
        values, counts = np.unique(keys, return_counts=True)
        if (counts > 1).any():
            at = int(np.argmax(counts > 1))
            raise refusal(op, name, f"distinct keys ({distinct})",
                          f"key {int(values[at])} {int(counts[at])} times")
    if no_unused and (keys == -1).any():
        raise refusal(op, name, "keys other than -1 (CANN's unused key: ApplyAdamW skips it, "
                      "Evict would match an empty bucket)", "-1")
    return keys


# -- generated tables and keys ---------------------------------------------------------------

def distinct_keys(rng: np.random.Generator, n: int, avoid=()) -> np.ndarray:
    """``n`` distinct int64 keys, none in ``avoid``, never -1 (CANN's empty key)."""
    seen, out = {int(k) for k in np.asarray(avoid).reshape(-1)} | {-1}, []
    while len(out) < n:
        for k in rng.integers(-2**62, 2**62, n - len(out), dtype=np.int64).tolist():
            if k not in seen:
                seen.add(k)
                out.append(k)
    return np.array(out, np.int64)


def seeded_table(rng: np.random.Generator, size: int, dim: int):
    """``(table, live keys, evicted keys)``: 3/8 full, the first half of the keys exported
    once, a middle run seen twice (counter 2; FILTER by a counter filter, which only jaxops
    has), one exported and one never-exported key evicted (where there are 4 keys)."""
    n = 3 * size // 8
    keys = distinct_keys(rng, n)
    table = ht.set_load_policy(ht.init_table(size, dim, sampled_values=rng.standard_normal(
        (size, dim)).astype(np.float32)), max_load_factor=1.0)
    half = n // 2
    table, _, _ = ht.lookup_or_insert(table, keys[:half])
    table = ht.export(table)[0]
    again = keys[half // 2:half + (n - half) // 2]
    table, _, _ = ht.lookup_or_insert(table, np.concatenate([keys[half:], again]),
                                      filter_mode="counter", filter_freq=2)
    if n < 4:
        return table, keys, keys[:0]
    gone = keys[[0, -1]]  # keys[-1]: never exported, never seen twice (no EXPORT, no FILTER)
    return ht.evict(table, gone), keys[1:-1], gone


def _homes(keys: np.ndarray, size: int) -> np.ndarray:
    words = np.ascontiguousarray(keys, np.int64).view(np.uint32).reshape(-1, 2)
    return np.asarray(ht.cann.home_slot(jnp.asarray(words[:, 0]), jnp.asarray(words[:, 1]), size))


def new_keys(rng: np.random.Generator, buf: np.ndarray, n: int, avoid) -> np.ndarray:
    """``n`` absent keys whose probes, one after another, reach an empty bucket before any
    tombstone (there jaxops reuses the tombstone, CANN's kernel probes on)."""
    size = buf.shape[0]
    empty = (buf[:, 20] | buf[:, 23]) == 0
    evicted = (buf[:, 20] & ht.cann.EVICTED) != 0
    out: list[int] = []
    for _ in range(64):
        if len(out) == n or not empty.any():
            break
        cands = distinct_keys(rng, 2 * (n - len(out)), np.concatenate([avoid, out]))
        for key, home in zip(cands.tolist(), _homes(cands, size).tolist()):
            walk = [(home + d) % size for d in range(size)]
            stop = next(s for s in walk if empty[s] or evicted[s]) if (empty | evicted).any() else -1
            if len(out) < n and stop >= 0 and empty[stop]:
                out.append(key)
                empty[stop] = False
    return np.array(out, np.int64)


def mixed(rng: np.random.Generator, *parts) -> np.ndarray:
    keys = np.concatenate([np.asarray(p, np.int64).reshape(-1) for p in parts])
    return keys[rng.permutation(keys.size)]


def picked(rng: np.random.Generator, keys: np.ndarray, n: int) -> np.ndarray:
    return rng.choice(keys, min(max(n, 0), keys.size), replace=False).astype(np.int64)


def sizes_of(op: str, attrs: dict) -> tuple[int, int]:
    return size_attr(op, attrs, "bucket_size"), size_attr(op, attrs, "embedding_dim")



# -- the developer's inputs, checked --------------------------------------------------------

def checked_single(op: str, inputs: dict, attrs: dict) -> tuple[dict, dict]:
    """A single-table case's inputs checked and its sizes settled (given, or its table's)."""
    hint = next((inputs[n] for n in ("grad", "sampled_values", "m") if inputs.get(n) is not None
                 and np.ndim(inputs[n]) == 2), None)
    dim = attrs.get("embedding_dim", None if hint is None else np.shape(hint)[1])
    if dim is not None:
        dim = size_attr(op, {"embedding_dim": dim}, "embedding_dim")
    buf, size, dim = table_input(op, inputs, "table", dim, "embedding_dim" in attrs)
    if "bucket_size" in attrs and size_attr(op, attrs, "bucket_size") != size:
        raise refusal(op, "bucket_size", f"{size}, the table's buckets", repr(attrs["bucket_size"]))
    refuse_big(op, 1, size, dim)
    attrs = {**attrs, "bucket_size": size, "embedding_dim": dim}
    out = {"table": buf}
    if op == "EmbeddingHashTableLookupOrInsert":
        out["keys"] = key_input(op, inputs, "keys")
    elif op == "EmbeddingHashTableEvict":
        out["keys"] = key_input(op, inputs, "keys", "CANN's kernel races on a repeated key: two "
                            "threads may both toggle EVICTED", no_unused=True)
        if attrs.get("init_mode") == "random":
            out["sampled_values"] = named_input(op, inputs, "sampled_values", np.float32,
                                         (out["keys"].size, dim))
    else:  # ApplyAdamW
        out["keys"] = key_input(op, inputs, "keys", "the proto: keys should be deduplicated",
                            no_unused=True)
        dtype = named_input(op, inputs, "m").dtype
        if dtype not in (np.float16, np.float32):
            raise refusal(op, "m", "float16 or float32", str(dtype))
        shapes = {"m": (size, dim), "v": (size, dim), "max_grad_norm": (size, dim),
                  "grad": (out["keys"].size, dim)}
        for name in ADAM_FLOATS:
            out[name] = named_input(op, inputs, name, dtype, shapes.get(name, (1,)))
    return out, attrs



_DTYPES = {"EmbeddingHashTableApplyAdamW": ((np.float16, np.float32), "float16 or float32 (m, "
                                            "v, grad, the scalars, max_grad_norm)"),
           "EmbeddingHashTableExport": ((np.int64,), "int64 (table_sizes, embedding_dims, "
                                        "bucket_sizes)")}


def drawn_or_given(spec, seed, attrs, shape, dtype, input_path, make) -> tuple[dict, dict]:
    """The inputs (drawn at ``seed`` with the sizes settled, or the developer's file) and
    the attrs with the sizes drawn with."""
    op = spec.op
    if input_path is not None:
        if shape is not None or dtype is not None:
            raise refusal(op, "shape" if shape is not None else "dtype", "no --shape/--dtype "
                          "with --input (the file holds the inputs)",
                          repr(shape if shape is not None else dtype))
        return read_named(input_path, op), attrs
    shape, dtype = input_shape_dtype(spec, shape, dtype)
    kinds, doc = _DTYPES.get(op, ((np.int64,), "int64 (the keys; CANN's kernels take no other)"))
    if dtype not in kinds:
        raise refusal(op, "dtype", doc, str(dtype))
    size, dim = sizes_of(op, attrs)
    refuse_big(op, shape[0] if len(shape) > 1 or op.endswith("Export") else 1, size, dim)
    attrs = {**attrs, "bucket_size": size, "embedding_dim": dim}
    return make(np.random.default_rng(seed), attrs, shape, dtype), attrs



def checked_list(op: str, inputs: dict, attrs: dict) -> tuple[dict, dict, list]:
    """A list case's inputs checked: ``embedding_dims``/``bucket_sizes`` (given, or from
    ``--embedding_dim`` and the tables), one table per entry; returns the tables' dims."""
    count = sum(1 for k in inputs if k.startswith("table") and k[5:].isdigit())
    dims = inputs.get("embedding_dims")
    if dims is None:
        dims = np.full(count, attrs.get("embedding_dim", DEFAULT_SIZES["embedding_dim"]), np.int64)
    dims = named_input(op, {"embedding_dims": dims}, "embedding_dims", np.int64)
    if dims.ndim != 1 or dims.size != count or count == 0:
        raise refusal(op, "embedding_dims", f"1-D int64, one entry per table ({count} tables "
                      "table0, table1, ...)", f"shape {list(dims.shape)}")
    tables, sizes = {}, []
    for i, dim in enumerate(dims.tolist()):
        dim = size_attr(op, {"embedding_dim": dim}, "embedding_dim")
        buf, size, _ = table_input(op, inputs, f"table{i}", dim, True)
        tables[f"table{i}"] = buf
        sizes.append(size)
    given = inputs.get("bucket_sizes")
    out = {"embedding_dims": dims, "bucket_sizes": np.array(sizes, np.int64), **tables}
    if given is not None and np.asarray(given).tolist() != sizes:
        raise refusal(op, "bucket_sizes", f"{sizes}, the tables' buckets", np.asarray(given).tolist())
    for i, (dim, size) in enumerate(zip(dims.tolist(), sizes)):
        refuse_big(op, 1, size, dim)
    attrs = {k: v for k, v in attrs.items() if k not in SIZES}  # they are inputs here
    return out, attrs, dims.tolist()
