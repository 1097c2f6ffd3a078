"""Golden specs of the hash-table operators: CANN's inputs and outputs, made with the public
face of :mod:`jaxops.hashtable` (never its internals).

A case holds what the arch35 kernel takes and leaves (:mod:`jaxops.golden.contracts`): a
table is the bucket array its handle points at, uint8 ``[bucket_size, 24 +
round_up_8(4 * embedding_dim)]`` (``table`` among the inputs; among the outputs the same
memory after the kernel), keys int64 and the rest in CANN's dtypes and names. List
operators (Export, Import) number their tables: ``table0``, ``keys0``, ... . Sizes:
``bucket_size`` and ``embedding_dim`` (CANN's attrs; ``--bucket_size``, ``--embedding_dim``),
``--shape`` the keys (Export: the tables; Import: tables and keys), ``--dtype``
ApplyAdamW's float dtype; ``--input`` a ``.npz`` of CANN's inputs by name (a table's sizes
come from its bytes). Generated tables are about 3/8 full: half of the keys exported once,
some seen twice (counter 2, FILTER set), one exported and one never-exported key evicted;
generated keys avoid what CANN's kernels leave undefined or do otherwise (see
``docs/golden.md``).

>>> get_spec("EmbeddingHashTableImport").shape
(2, 12)
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

import jaxops.hashtable as ht
from jaxops.core.errors import OpArgumentError
from jaxops.core.memory import refuse_unless_fits
from jaxops.golden.contracts import GoldenOutput
from jaxops.golden.inputs import read_named
from jaxops.golden.specs import get_spec  # noqa: F401  (the doctest's)
from jaxops.golden.specs import GoldenSpec, input_shape_dtype, register_golden

__all__: list[str] = []  # registers specs; nothing to import from here

_SIZES = ("bucket_size", "embedding_dim")
_DEFAULT = {"bucket_size": 64, "embedding_dim": 4}
_ADAM_FLOATS = ("m", "v", "beta1_power", "beta2_power", "lr", "weight_decay", "beta1", "beta2",
                "epsilon", "grad", "max_grad_norm")


def _error(op: str, arg: str, expected: str, given, hint: str = "") -> OpArgumentError:
    return OpArgumentError(f"golden {op}", arg, expected, given, hint)


# -- sizes and inputs -------------------------------------------------------------------------

def _size(op: str, attrs: dict, name: str) -> int:
    v = attrs.get(name, _DEFAULT[name])
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) \
            or not 1 <= int(v) < 2**31:
        raise _error(op, name, "an int in [1, 2**31 - 1]", repr(v))
    return int(v)


def _refuse_big(op: str, tables: int, size: int, dim: int) -> None:
    """A case holds each table about eight times (bytes before and after, the library's
    table, the reference's)."""
    need = 8 * tables * size * ht.cann.row_bytes(dim)
    refuse_unless_fits(f"golden {op}", "bucket_size", need, f"{tables} table(s) of {size} "
                       f"buckets of {ht.cann.row_bytes(dim)} bytes", devices=())


def _get(op: str, inputs: dict, name: str, dtype=None, shape=None) -> np.ndarray:
    if inputs.get(name) is None:
        raise _error(op, "input", f"an input named {name!r}", "none",
                     "Name the arrays as CANN's inputs (jaxops golden OP --help).")
    a = np.asarray(inputs[name])
    if dtype is not None and a.dtype != np.dtype(dtype):
        raise _error(op, name, np.dtype(dtype).name, str(a.dtype))
    if shape is not None and a.shape != tuple(shape):
        raise _error(op, name, f"shape {list(shape)}", list(a.shape))
    return a


def _table(op: str, inputs: dict, name: str, dim: int | None, dim_given: bool
           ) -> tuple[np.ndarray, int, int]:
    """A table input: its bytes, bucket_size and embedding_dim (the given one, else the
    default where its rows have that width)."""
    buf = _get(op, inputs, name, np.uint8)
    dim = _DEFAULT["embedding_dim"] if dim is None else dim
    if buf.ndim != 2 or buf.shape[1] != ht.cann.row_bytes(dim):
        raise _error(op, name, f"uint8 buckets [bucket_size, {ht.cann.row_bytes(dim)}] "
                     f"(embedding_dim {dim})", f"shape {list(buf.shape)}",
                     "" if dim_given else "Pass --embedding_dim for other rows.")
    return buf, buf.shape[0], dim


def _library_table(op: str, name: str, buf: np.ndarray, dim: int):
    """The library's table of CANN bytes, one that never grows (a grown table would change
    the bucket array); its reader's refusals name the golden input."""
    try:
        table = ht.cann.from_cann_bytes(buf, dim)
    except OpArgumentError as e:
        raise _error(op, name, e.expected, e.given) from None
    return ht.set_load_policy(table, max_load_factor=1.0)


def _bytes(table) -> np.ndarray:
    return np.asarray(ht.cann.to_cann_bytes(table))


def _keys(op: str, inputs: dict, name: str, distinct: str = "", no_unused: bool = False
          ) -> np.ndarray:
    keys = _get(op, inputs, name, np.int64)
    if keys.ndim != 1:
        raise _error(op, name, "1-D int64 keys", f"shape {list(keys.shape)}")
    if distinct:
        values, counts = np.unique(keys, return_counts=True)
        if (counts > 1).any():
            raise _error(op, name, f"distinct keys ({distinct})",
                         f"key {int(values[np.argmax(counts > 1)])} {int(counts.max())} times")
    if no_unused and (keys == -1).any():
        raise _error(op, name, "keys other than -1 (CANN's unused key: ApplyAdamW skips it, "
                     "Evict would match an empty bucket)", "-1")
    return keys


def _output(name: str, data: np.ndarray, dim: int | None = None) -> GoldenOutput:
    data = np.asarray(data)
    return GoldenOutput(name, data, data.shape,
                        notes=None if dim is None else {"buckets": {"embedding_dim": dim}})


# -- generated tables and keys ---------------------------------------------------------------

def _distinct_keys(rng: np.random.Generator, n: int, avoid=()) -> np.ndarray:
    """``n`` distinct int64 keys, none in ``avoid``, never -1 (CANN's empty key)."""
    seen, out = {int(k) for k in np.asarray(avoid).reshape(-1)} | {-1}, []
    while len(out) < n:
        for k in rng.integers(-2**62, 2**62, n - len(out), dtype=np.int64).tolist():
            if k not in seen:
                seen.add(k)
                out.append(k)
    return np.array(out, np.int64)


def _seeded_table(rng: np.random.Generator, size: int, dim: int):
    """``(table, live keys, evicted keys)``: 3/8 full, the first half of the keys exported
    once, a middle run seen twice (counter 2; FILTER by a counter filter, which only jaxops
    has), one exported and one never-exported key evicted (where there are 4 keys)."""
    n = 3 * size // 8
    keys = _distinct_keys(rng, n)
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


def _new_keys(rng: np.random.Generator, buf: np.ndarray, n: int, avoid) -> np.ndarray:
    """``n`` absent keys whose probes, one after another, reach an empty bucket before any
    tombstone (there jaxops reuses the tombstone, CANN's kernel probes on)."""
    size = buf.shape[0]
    empty = (buf[:, 20] | buf[:, 23]) == 0
    evicted = (buf[:, 20] & ht.cann.EVICTED) != 0
    out: list[int] = []
    for _ in range(64):
        if len(out) == n or not empty.any():
            break
        cands = _distinct_keys(rng, 2 * (n - len(out)), np.concatenate([avoid, out]))
        for key, home in zip(cands.tolist(), _homes(cands, size).tolist()):
            walk = [(home + d) % size for d in range(size)]
            stop = next(s for s in walk if empty[s] or evicted[s]) if (empty | evicted).any() else -1
            if len(out) < n and stop >= 0 and empty[stop]:
                out.append(key)
                empty[stop] = False
    return np.array(out, np.int64)


def _mix(rng: np.random.Generator, *parts) -> np.ndarray:
    keys = np.concatenate([np.asarray(p, np.int64).reshape(-1) for p in parts])
    return keys[rng.permutation(keys.size)]


def _pick(rng: np.random.Generator, keys: np.ndarray, n: int) -> np.ndarray:
    return rng.choice(keys, min(max(n, 0), keys.size), replace=False).astype(np.int64)


def _sizes_of(op: str, attrs: dict) -> tuple[int, int]:
    return _size(op, attrs, "bucket_size"), _size(op, attrs, "embedding_dim")


# -- InitEmbeddingHashTable -------------------------------------------------------------------

def _init_make(rng, attrs) -> dict:
    size, dim = attrs["bucket_size"], attrs["embedding_dim"]
    _refuse_big("InitEmbeddingHashTable", 1, size, dim)
    if attrs.get("initializer_mode", "random") != "random":
        return {}
    return {"sampled_values": rng.standard_normal((size, dim)).astype(np.float32)}


def _init_build(spec, seed, attrs, shape, dtype, input_path):
    op = spec.op
    input_shape_dtype(spec, shape, dtype)  # refuses both: the attrs size the table
    size, dim = attrs["bucket_size"], attrs["embedding_dim"]
    inputs = (_init_make(np.random.default_rng(seed), attrs) if input_path is None
              else read_named(input_path, op))
    random = attrs.get("initializer_mode", "random") == "random"
    if random:
        rows = _get(op, inputs, "sampled_values", np.float32)
        if rows.size != size * dim:
            raise _error(op, "sampled_values", f"{size * dim} values (bucket_size * "
                         "embedding_dim)", f"shape {list(rows.shape)}")
        inputs = {"sampled_values": rows}
    else:
        inputs = {}
    table = ht.init_table(size, dim, initializer_mode=attrs.get("initializer_mode", "random"),
                          constant_value=attrs.get("constant_value", 0.0),
                          sampled_values=inputs.get("sampled_values"))
    return inputs, [_output("table", _bytes(table), dim)], attrs


# -- EmbeddingHashTableLookupOrInsert ----------------------------------------------------------

def _lookup_make(rng, attrs, shape, dtype, generation=None) -> dict:
    (n,) = shape
    table, live, gone = _seeded_table(rng, attrs["bucket_size"], attrs["embedding_dim"])
    buf = _bytes(table)
    present = _pick(rng, live, n // 2 - 1)
    revived = gone[1:] if n >= 3 else gone[:0]  # the never-exported tombstone comes back
    again = present[:1]
    keys = _mix(rng, present, again, revived,
                _new_keys(rng, buf, n - present.size - again.size - revived.size, live))
    if attrs.get("filter_key_flag") and keys.size:
        keys[rng.integers(keys.size)] = attrs.get("filter_key", -1)
    return {"table": buf, "keys": keys}


def _lookup_run(op, inputs, attrs):
    dim = attrs["embedding_dim"]
    table = _library_table(op, "table", inputs["table"], dim)
    kept = {k: attrs[k] for k in ("default_key_or_value", "default_key", "default_value",
                                  "filter_key_flag", "filter_key")}
    # filter_mode / filter_freq: read by CANN's tiling, used by no kernel: not applied
    table, rows, _ = ht.lookup_or_insert(table, inputs["keys"], **kept)
    return [_output("values", np.asarray(rows, np.float32).reshape(-1, dim)),
            _output("table", _bytes(table), dim)]


# -- EmbeddingHashTableEvict -------------------------------------------------------------------

def _evict_make(rng, attrs, shape, dtype, generation=None) -> dict:
    (n,) = shape
    table, live, gone = _seeded_table(rng, attrs["bucket_size"], attrs["embedding_dim"])
    keys = _mix(rng, _pick(rng, live, n // 2 - 1), gone[:1][:max(n - 1, 0)])
    keys = _mix(rng, keys, _distinct_keys(rng, n - keys.size, np.concatenate([live, gone])))
    inputs = {"table": _bytes(table), "keys": keys}
    if attrs.get("init_mode") == "random":
        inputs["sampled_values"] = rng.standard_normal((n, attrs["embedding_dim"])).astype(np.float32)
    return inputs


def _evict_run(op, inputs, attrs):
    dim = attrs["embedding_dim"]
    table = _library_table(op, "table", inputs["table"], dim)
    table = ht.evict(table, inputs["keys"], init_mode=attrs["init_mode"],
                     const_val=attrs["const_val"], sampled_values=inputs.get("sampled_values"))
    return [_output("table", _bytes(table), dim)]


# -- EmbeddingHashTableApplyAdamW -------------------------------------------------------------

def _adam_make(rng, attrs, shape, dtype, generation=None) -> dict:
    (n,) = shape
    size, dim = attrs["bucket_size"], attrs["embedding_dim"]
    table, live, gone = _seeded_table(rng, size, dim)
    present = _pick(rng, live, 2 * n // 3)
    keys = _mix(rng, present, _distinct_keys(rng, n - present.size, np.concatenate([live, gone])))
    v = np.abs(rng.standard_normal((size, dim))) * 0.01
    eps = 1e-8 if dtype == np.float32 else 1e-6  # 1e-8 is 0 in float16
    scalars = dict(beta1_power=0.9**3, beta2_power=0.999**3, lr=0.01, weight_decay=0.01,
                   beta1=0.9, beta2=0.999, epsilon=eps)
    return {"table": _bytes(table), "keys": keys,
            "m": (rng.standard_normal((size, dim)) * 0.1).astype(dtype), "v": v.astype(dtype),
            **{k: np.array([x], dtype) for k, x in scalars.items()},
            "grad": rng.standard_normal((n, dim)).astype(dtype),
            "max_grad_norm": (v + np.abs(rng.standard_normal((size, dim))) * 0.01).astype(dtype)}


def _adam_run(op, inputs, attrs):
    dim, amsgrad = attrs["embedding_dim"], bool(attrs["amsgrad"])
    dtype = inputs["m"].dtype
    f32 = lambda name: np.asarray(inputs[name], np.float32)  # noqa: E731  (exact from float16)
    table = _library_table(op, "table", inputs["table"], dim)
    state = ht.adam_w_init(table, amsgrad=amsgrad)  # moments of the slots' present keys
    state = state._replace(m=jnp.asarray(f32("m")), v=jnp.asarray(f32("v")),
                           beta1_power=jnp.asarray(f32("beta1_power")[0]),
                           beta2_power=jnp.asarray(f32("beta2_power")[0]),
                           **({"max_v": jnp.asarray(f32("max_grad_norm"))} if amsgrad else {}))
    hyper = {k: f32(k)[0] for k in ("lr", "weight_decay", "beta1", "beta2", "epsilon")}
    new, state = ht.apply_adam_w(table, state, inputs["keys"], f32("grad"), amsgrad=amsgrad,
                                 maximize=bool(attrs["maximize"]), **hyper)
    buf = _bytes(new)
    if dtype != np.float32:  # the kernel writes static_cast<T>(w) into the float row
        slots = np.asarray(ht.locate(table, inputs["keys"]))
        slots = slots[slots >= 0]
        rows = buf[slots, 24:24 + 4 * dim].copy().view("<f4")
        buf[slots, 24:24 + 4 * dim] = rows.astype(dtype).astype("<f4").view(np.uint8)
    as_t = lambda a: np.asarray(a, np.float32).astype(dtype)  # noqa: E731
    top = as_t(state.max_v) if amsgrad else inputs["max_grad_norm"]
    return [_output("m", as_t(state.m)), _output("v", as_t(state.v)),
            _output("beta1_power", as_t(state.beta1_power).reshape(1)),
            _output("beta2_power", as_t(state.beta2_power).reshape(1)),
            _output("max_grad_norm", top), _output("table", buf, dim)]


# -- single-table builds ------------------------------------------------------------------------

def _checked_single(op: str, inputs: dict, attrs: dict) -> tuple[dict, dict]:
    """A single-table case's inputs checked and its sizes settled (given, or its table's)."""
    hint = next((inputs[n] for n in ("grad", "sampled_values", "m") if inputs.get(n) is not None
                 and np.ndim(inputs[n]) == 2), None)
    dim = attrs.get("embedding_dim", None if hint is None else np.shape(hint)[1])
    if dim is not None:
        dim = _size(op, {"embedding_dim": dim}, "embedding_dim")
    buf, size, dim = _table(op, inputs, "table", dim, "embedding_dim" in attrs)
    if "bucket_size" in attrs and _size(op, attrs, "bucket_size") != size:
        raise _error(op, "bucket_size", f"{size}, the table's buckets", repr(attrs["bucket_size"]))
    _refuse_big(op, 1, size, dim)
    attrs = {**attrs, "bucket_size": size, "embedding_dim": dim}
    out = {"table": buf}
    if op == "EmbeddingHashTableLookupOrInsert":
        out["keys"] = _keys(op, inputs, "keys")
    elif op == "EmbeddingHashTableEvict":
        out["keys"] = _keys(op, inputs, "keys", "CANN's kernel races on a repeated key: two "
                            "threads may both toggle EVICTED", no_unused=True)
        if attrs.get("init_mode") == "random":
            out["sampled_values"] = _get(op, inputs, "sampled_values", np.float32,
                                         (out["keys"].size, dim))
    else:  # ApplyAdamW
        out["keys"] = _keys(op, inputs, "keys", "the proto: keys should be deduplicated",
                            no_unused=True)
        dtype = _get(op, inputs, "m").dtype
        if dtype not in (np.float16, np.float32):
            raise _error(op, "m", "float16 or float32", str(dtype))
        shapes = {"m": (size, dim), "v": (size, dim), "max_grad_norm": (size, dim),
                  "grad": (out["keys"].size, dim)}
        for name in _ADAM_FLOATS:
            out[name] = _get(op, inputs, name, dtype, shapes.get(name, (1,)))
    return out, attrs


def _single_build(make, run):
    def build(spec, seed, attrs, shape, dtype, input_path):
        op = spec.op
        if input_path is None:
            shape, dtype = input_shape_dtype(spec, shape, dtype)
            if op != "EmbeddingHashTableApplyAdamW" and dtype != np.int64:
                raise _error(op, "dtype", "int64 (the keys; CANN's kernel takes no other)", str(dtype))
            if op == "EmbeddingHashTableApplyAdamW" and dtype not in (np.float16, np.float32):
                raise _error(op, "dtype", "float16 or float32 (m, v, grad, the scalars)", str(dtype))
            size, dim = _sizes_of(op, attrs)
            _refuse_big(op, 1, size, dim)
            inputs = make(np.random.default_rng(seed), {**attrs, "bucket_size": size,
                                                         "embedding_dim": dim}, shape, dtype)
            attrs = {**attrs, "bucket_size": size, "embedding_dim": dim}
        else:
            _no_shape(op, shape, dtype)
            inputs = read_named(input_path, op)
        inputs, attrs = _checked_single(op, inputs, attrs)
        return inputs, run(op, inputs, attrs), attrs
    return build


def _no_shape(op: str, shape, dtype) -> None:
    if shape is not None or dtype is not None:
        raise _error(op, "shape" if shape is not None else "dtype", "no --shape/--dtype with "
                     "--input (the file holds the inputs)", repr(shape if shape is not None else dtype))


# -- list operators: Export, Import -------------------------------------------------------------

def _export_make(rng, attrs, shape, dtype, generation=None) -> dict:
    (count,) = shape
    size, dim = attrs["bucket_size"], attrs["embedding_dim"]
    tables = [_seeded_table(rng, size, dim)[0] for _ in range(count)]
    return {"embedding_dims": np.full(count, dim, np.int64),
            "bucket_sizes": np.full(count, size, np.int64),
            **{f"table{i}": _bytes(t) for i, t in enumerate(tables)}}


def _import_make(rng, attrs, shape, dtype, generation=None) -> dict:
    count, n = shape
    size, dim = attrs["bucket_size"], attrs["embedding_dim"]
    out = {"embedding_dims": np.full(count, dim, np.int64),
           "bucket_sizes": np.full(count, size, np.int64)}
    for i in range(count):
        table, live, gone = _seeded_table(rng, size, dim)
        buf = _bytes(table)
        present = _pick(rng, live, n // 2)
        keys = _mix(rng, present, _new_keys(rng, buf, n - present.size, np.concatenate([live, gone])))
        out.update({f"table{i}": buf, f"keys{i}": keys,
                    f"counters{i}": rng.integers(1, 2**40, keys.size, dtype=np.uint64),
                    f"filter_flags{i}": (rng.random(keys.size) < 0.5).astype(np.uint8),
                    f"values{i}": rng.standard_normal((keys.size, dim)).astype(np.float32)})
    return out


def _checked_list(op: str, inputs: dict, attrs: dict) -> tuple[dict, dict, list]:
    """A list case's inputs checked: ``embedding_dims``/``bucket_sizes`` (given, or from
    ``--embedding_dim`` and the tables), one table per entry; returns the tables' dims."""
    count = sum(1 for k in inputs if k.startswith("table") and k[5:].isdigit())
    dims = inputs.get("embedding_dims")
    if dims is None:
        dims = np.full(count, attrs.get("embedding_dim", _DEFAULT["embedding_dim"]), np.int64)
    dims = _get(op, {"embedding_dims": dims}, "embedding_dims", np.int64)
    if dims.ndim != 1 or dims.size != count or count == 0:
        raise _error(op, "embedding_dims", f"1-D int64, one entry per table ({count} tables "
                     "table0, table1, ...)", f"shape {list(dims.shape)}")
    tables, sizes = {}, []
    for i, dim in enumerate(dims.tolist()):
        dim = _size(op, {"embedding_dim": dim}, "embedding_dim")
        buf, size, _ = _table(op, inputs, f"table{i}", dim, True)
        tables[f"table{i}"] = buf
        sizes.append(size)
    given = inputs.get("bucket_sizes")
    out = {"embedding_dims": dims, "bucket_sizes": np.array(sizes, np.int64), **tables}
    if given is not None and np.asarray(given).tolist() != sizes:
        raise _error(op, "bucket_sizes", f"{sizes}, the tables' buckets", np.asarray(given).tolist())
    for i, (dim, size) in enumerate(zip(dims.tolist(), sizes)):
        _refuse_big(op, 1, size, dim)
    attrs = {k: v for k, v in attrs.items() if k not in _SIZES}  # they are inputs here
    return out, attrs, dims.tolist()


def _export_build(spec, seed, attrs, shape, dtype, input_path):
    op = spec.op
    if input_path is None:
        shape, dtype = input_shape_dtype(spec, shape, dtype)
        if dtype != np.int64:
            raise _error(op, "dtype", "int64 (table_sizes, embedding_dims, bucket_sizes)", str(dtype))
        size, dim = _sizes_of(op, attrs)
        _refuse_big(op, shape[0], size, dim)
        inputs = _export_make(np.random.default_rng(seed), {**attrs, "bucket_size": size,
                                                            "embedding_dim": dim}, shape, dtype)
    else:
        _no_shape(op, shape, dtype)
        inputs = read_named(input_path, op)
    checked, attrs, dims = _checked_list(op, inputs, attrs)
    tables = [_library_table(op, f"table{i}", checked[f"table{i}"], d) for i, d in enumerate(dims)]
    # table_sizes: what the handle says, as CANN's callers pass it (all: the live count,
    # word 2; new: the not-yet-exported count, word 4)
    word = 2 if attrs["export_mode"] == "all" else 4
    sizes = [int(ht.cann.handle_counters(t)[word]) for t in tables]
    if inputs.get("table_sizes") is not None and np.asarray(inputs["table_sizes"]).tolist() != sizes:
        raise _error(op, "table_sizes", f"{sizes}: the entries each table exports (the kernel "
                     "writes that many rows; InferShape sizes the outputs by table_sizes)",
                     np.asarray(inputs["table_sizes"]).tolist())
    checked = {"table_sizes": np.array(sizes, np.int64), **checked}
    marked, keys, counters, flags, values = ht.export(tables, export_mode=attrs["export_mode"])
    outs = {"keys": [], "counters": [], "filter_flags": [], "values": []}
    for i, n in enumerate(sizes):
        got = [np.asarray(a.data)[:int(a.actual_shape[0])] for a in
               (keys[i], counters[i], flags[i], values[i])]
        outs["keys"].append(_output(f"keys{i}", _as_64(got[0], np.int64)))
        outs["counters"].append(_output(f"counters{i}", _as_64(got[1], np.uint64)))
        outs["filter_flags"].append(_output(f"filter_flags{i}", got[2].astype(np.uint8)))
        outs["values"].append(_output(f"values{i}", got[3].astype(np.float32).reshape(-1, dims[i])))
    tables_after = [_output(f"table{i}", _bytes(t), d) for i, (t, d) in enumerate(zip(marked, dims))]
    return checked, [o for group in outs.values() for o in group] + tables_after, attrs


def _as_64(words: np.ndarray, dtype) -> np.ndarray:
    """uint32 word pairs ``[n, 2]`` (x64 off) or 64-bit values ``[n]`` → a 64-bit ``[n]``."""
    if words.ndim == 2:
        return np.ascontiguousarray(words.astype(np.uint32)).view(dtype).reshape(-1)
    return words.astype(dtype)


def _import_build(spec, seed, attrs, shape, dtype, input_path):
    op = spec.op
    if input_path is None:
        shape, dtype = input_shape_dtype(spec, shape, dtype)
        if dtype != np.int64:
            raise _error(op, "dtype", "int64 (the keys)", str(dtype))
        size, dim = _sizes_of(op, attrs)
        _refuse_big(op, shape[0], size, dim)
        inputs = _import_make(np.random.default_rng(seed), {**attrs, "bucket_size": size,
                                                            "embedding_dim": dim}, shape, dtype)
    else:
        _no_shape(op, shape, dtype)
        inputs = read_named(input_path, op)
    checked, attrs, dims = _checked_list(op, inputs, attrs)
    outputs = []
    for i, dim in enumerate(dims):
        keys = _keys(op, inputs, f"keys{i}", "CANN's kernel races on a repeated key: the last "
                     "writer of its counter and row is not defined")
        n = keys.size
        entries = {f"keys{i}": keys,
                   f"counters{i}": _get(op, inputs, f"counters{i}", np.uint64, (n,)),
                   f"filter_flags{i}": _get(op, inputs, f"filter_flags{i}", np.uint8, (n,)),
                   f"values{i}": _get(op, inputs, f"values{i}", np.float32, (n, dim))}
        checked.update(entries)
        buf = checked[f"table{i}"]
        table = _library_table(op, f"table{i}", buf, dim)
        # CANN does not read filter_flags: an entry keeps its bucket's FILTER (0 when new)
        held = buf[:, 16:20].copy().view("<i4").reshape(-1) == 1
        filters = dict(zip(buf[held, 0:8].copy().view("<i8").reshape(-1).tolist(),
                           (buf[held, 23] & ht.cann.FILTER).tolist()))
        kept = np.array([filters.get(k, 0) for k in keys.tolist()], np.uint8)
        table, _ = ht.import_(table, keys, entries[f"counters{i}"], kept, entries[f"values{i}"])
        outputs.append(_output(f"table{i}", _bytes(table), dim))
    return checked, outputs, attrs


# -- the specs -----------------------------------------------------------------------------------

_TABLE_OPTIONS = dict(module="jaxops.hashtable", case_attrs=_SIZES)

register_golden(GoldenSpec(
    "InitEmbeddingHashTable", "a new 64-bucket dim-4 table from sampled values, as CANN "
    "bucket bytes", _init_make, default_attrs=dict(_DEFAULT), build=_init_build,
    shape_doc="--bucket_size and --embedding_dim size the table", module="jaxops.hashtable",
    input_names=("sampled_values",)))

register_golden(GoldenSpec(
    "EmbeddingHashTableLookupOrInsert", "12 keys (5 present, one twice, a tombstone revived, "
    "new ones) into a 64-bucket dim-4 table: rows, the table after",
    _lookup_make, build=_single_build(_lookup_make, _lookup_run), shape=(12,), dtype="int64",
    shape_doc="keys [N]; --dtype: int64 (the keys)", input_names=("table", "keys"), **_TABLE_OPTIONS))

register_golden(GoldenSpec(
    "EmbeddingHashTableExport", "export of 2 tables of 64 buckets, dim 4 (~22 live keys "
    "each, half exported before, 2 evicted): keys, counters, filter flags, rows per table, "
    "the tables after", _export_make, build=_export_build, shape=(2,), dtype="int64",
    shape_doc="table_sizes [tables] (one entry per table); --dtype: int64",
    input_names=("table_sizes", "embedding_dims", "bucket_sizes", "table0", "table1", "..."),
    **_TABLE_OPTIONS))

register_golden(GoldenSpec(
    "EmbeddingHashTableImport", "import into 2 tables of 64 buckets, dim 4: 12 entries each "
    "(6 present keys, 6 new) with counters, filter flags and rows; the tables after",
    _import_make, build=_import_build, shape=(2, 12), dtype="int64",
    shape_doc="[tables, keys per table] (keys0, keys1, ...); --dtype: int64",
    input_names=("embedding_dims", "bucket_sizes", "table0", "keys0", "counters0",
                 "filter_flags0", "values0", "..."), **_TABLE_OPTIONS))

register_golden(GoldenSpec(
    "EmbeddingHashTableEvict", "evict 12 distinct keys (5 present, a tombstone, 6 absent) "
    "from a 64-bucket dim-4 table: the table after",
    _evict_make, build=_single_build(_evict_make, _evict_run), shape=(12,), dtype="int64",
    shape_doc="keys [N] (distinct); --dtype: int64", input_names=("table", "keys", "sampled_values"),
    **_TABLE_OPTIONS))

register_golden(GoldenSpec(
    "EmbeddingHashTableApplyAdamW", "an AdamW step (lr 0.01, weight decay 0.01, third step) "
    "on 12 distinct keys (8 present, 4 absent) of a 64-bucket dim-4 table: m, v, beta powers, "
    "max_grad_norm, the table after", _adam_make, build=_single_build(_adam_make, _adam_run),
    shape=(12,), dtype="float32", shape_doc="keys [N] (distinct); --dtype: m, v, grad, the "
    "scalars and max_grad_norm (float32 or float16)",
    input_names=("table", "keys") + _ADAM_FLOATS, **_TABLE_OPTIONS))
