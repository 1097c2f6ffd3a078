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
from jaxops.golden import table_contracts  # noqa: F401  (the table cases' contracts)
from jaxops.golden.contracts import GoldenOutput
from jaxops.golden.inputs import read_named
from jaxops.golden.specs import get_spec  # noqa: F401  (the doctest's)
from jaxops.golden.specs import GoldenSpec, input_shape_dtype, register_golden
from jaxops.golden.table_inputs import (ADAM_FLOATS, DEFAULT_SIZES, SIZES, bucket_bytes,
                                        checked_list, checked_single, distinct_keys,
                                        drawn_or_given, key_input, library_table, mixed,
                                        named_input, new_keys, picked, refusal, refuse_big,
                                        seeded_table)

__all__: list[str] = []  # registers specs; nothing to import from here


def _output(name: str, data: np.ndarray, dim: int | None = None) -> GoldenOutput:
    data = np.asarray(data)
    return GoldenOutput(name, data, data.shape,
                        notes=None if dim is None else {"buckets": {"embedding_dim": dim}})



# -- InitEmbeddingHashTable -------------------------------------------------------------------

def _init_make(rng, attrs) -> dict:
    size, dim = attrs["bucket_size"], attrs["embedding_dim"]
    refuse_big("InitEmbeddingHashTable", 1, size, dim)
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
        rows = named_input(op, inputs, "sampled_values", np.float32)
        if rows.size != size * dim:
            raise refusal(op, "sampled_values", f"{size * dim} values (bucket_size * "
                          "embedding_dim)", f"shape {list(rows.shape)}")
        inputs = {"sampled_values": rows}
    else:
        inputs = {}
    table = ht.init_table(size, dim, initializer_mode=attrs.get("initializer_mode", "random"),
                          constant_value=attrs.get("constant_value", 0.0),
                          sampled_values=inputs.get("sampled_values"))
    return inputs, [_output("table", bucket_bytes(table), dim)], attrs


# -- EmbeddingHashTableLookupOrInsert ----------------------------------------------------------

def _lookup_make(rng, attrs, shape, dtype, generation=None) -> dict:
    (n,) = shape
    table, live, gone = seeded_table(rng, attrs["bucket_size"], attrs["embedding_dim"])
    buf = bucket_bytes(table)
    present = picked(rng, live, n // 2 - 1)
    revived = gone[1:] if n >= 3 else gone[:0]  # the never-exported tombstone comes back
    again = present[:1]
    keys = mixed(rng, present, again, revived,
                new_keys(rng, buf, n - present.size - again.size - revived.size, live))
    if attrs.get("filter_key_flag") and keys.size:
        keys[rng.integers(keys.size)] = attrs.get("filter_key", -1)
    return {"table": buf, "keys": keys}


def _lookup_run(op, inputs, attrs):
    dim = attrs["embedding_dim"]
    table = library_table(op, "table", inputs["table"], dim)
    kept = {k: attrs[k] for k in ("default_key_or_value", "default_key", "default_value",
                                  "filter_key_flag", "filter_key")}
    # filter_mode / filter_freq: read by CANN's tiling, used by no kernel: not applied
    table, rows, _ = ht.lookup_or_insert(table, inputs["keys"], **kept)
    return [_output("values", np.asarray(rows, np.float32).reshape(-1, dim)),
            _output("table", bucket_bytes(table), dim)]


# -- EmbeddingHashTableEvict -------------------------------------------------------------------

def _evict_make(rng, attrs, shape, dtype, generation=None) -> dict:
    (n,) = shape
    table, live, gone = seeded_table(rng, attrs["bucket_size"], attrs["embedding_dim"])
    keys = mixed(rng, picked(rng, live, n // 2 - 1), gone[:1][:max(n - 1, 0)])
    keys = mixed(rng, keys, distinct_keys(rng, n - keys.size, np.concatenate([live, gone])))
    inputs = {"table": bucket_bytes(table), "keys": keys}
    if attrs.get("init_mode") == "random":
        inputs["sampled_values"] = rng.standard_normal((n, attrs["embedding_dim"])).astype(np.float32)
    return inputs


def _evict_run(op, inputs, attrs):
    dim = attrs["embedding_dim"]
    table = library_table(op, "table", inputs["table"], dim)
    table = ht.evict(table, inputs["keys"], init_mode=attrs["init_mode"],
                     const_val=attrs["const_val"], sampled_values=inputs.get("sampled_values"))
    return [_output("table", bucket_bytes(table), dim)]


# -- EmbeddingHashTableApplyAdamW -------------------------------------------------------------

def _adam_make(rng, attrs, shape, dtype, generation=None) -> dict:
    (n,) = shape
    size, dim = attrs["bucket_size"], attrs["embedding_dim"]
    table, live, gone = seeded_table(rng, size, dim)
    present = picked(rng, live, 2 * n // 3)
    keys = mixed(rng, present, distinct_keys(rng, n - present.size, np.concatenate([live, gone])))
    v = np.abs(rng.standard_normal((size, dim))) * 0.01
    eps = 1e-8 if dtype == np.float32 else 1e-6  # 1e-8 is 0 in float16
    scalars = dict(beta1_power=0.9**3, beta2_power=0.999**3, lr=0.01, weight_decay=0.01,
                   beta1=0.9, beta2=0.999, epsilon=eps)
    return {"table": bucket_bytes(table), "keys": keys,
            "m": (rng.standard_normal((size, dim)) * 0.1).astype(dtype), "v": v.astype(dtype),
            **{k: np.array([x], dtype) for k, x in scalars.items()},
            "grad": rng.standard_normal((n, dim)).astype(dtype),
            "max_grad_norm": (v + np.abs(rng.standard_normal((size, dim))) * 0.01).astype(dtype)}


def _adam_run(op, inputs, attrs):
    dim, amsgrad = attrs["embedding_dim"], bool(attrs["amsgrad"])
    dtype = inputs["m"].dtype
    f32 = lambda name: np.asarray(inputs[name], np.float32)  # noqa: E731  (exact from float16)
    table = library_table(op, "table", inputs["table"], dim)
    state = ht.adam_w_init(table, amsgrad=amsgrad)  # moments of the slots' present keys
    state = state._replace(m=jnp.asarray(f32("m")), v=jnp.asarray(f32("v")),
                           beta1_power=jnp.asarray(f32("beta1_power")[0]),
                           beta2_power=jnp.asarray(f32("beta2_power")[0]),
                           **({"max_v": jnp.asarray(f32("max_grad_norm"))} if amsgrad else {}))
    hyper = {k: f32(k)[0] for k in ("lr", "weight_decay", "beta1", "beta2", "epsilon")}
    new, state = ht.apply_adam_w(table, state, inputs["keys"], f32("grad"), amsgrad=amsgrad,
                                 maximize=bool(attrs["maximize"]), **hyper)
    buf = bucket_bytes(new)
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



def _single_build(make, run):
    def build(spec, seed, attrs, shape, dtype, input_path):
        op = spec.op
        inputs, attrs = drawn_or_given(spec, seed, attrs, shape, dtype, input_path, make)
        inputs, attrs = checked_single(op, inputs, attrs)
        return inputs, run(op, inputs, attrs), attrs
    return build


#: The dtypes ``--dtype`` takes, and what they are of.

# -- list operators: Export, Import -------------------------------------------------------------

def _export_make(rng, attrs, shape, dtype, generation=None) -> dict:
    (count,) = shape
    size, dim = attrs["bucket_size"], attrs["embedding_dim"]
    tables = [seeded_table(rng, size, dim)[0] for _ in range(count)]
    return {"embedding_dims": np.full(count, dim, np.int64),
            "bucket_sizes": np.full(count, size, np.int64),
            **{f"table{i}": bucket_bytes(t) for i, t in enumerate(tables)}}


def _import_make(rng, attrs, shape, dtype, generation=None) -> dict:
    count, n = shape
    size, dim = attrs["bucket_size"], attrs["embedding_dim"]
    out = {"embedding_dims": np.full(count, dim, np.int64),
           "bucket_sizes": np.full(count, size, np.int64)}
    for i in range(count):
        table, live, gone = seeded_table(rng, size, dim)
        buf = bucket_bytes(table)
        present = picked(rng, live, n // 2)
        keys = mixed(rng, present, new_keys(rng, buf, n - present.size, np.concatenate([live, gone])))
        out.update({f"table{i}": buf, f"keys{i}": keys,
                    f"counters{i}": rng.integers(1, 2**40, keys.size, dtype=np.uint64),
                    f"filter_flags{i}": (rng.random(keys.size) < 0.5).astype(np.uint8),
                    f"values{i}": rng.standard_normal((keys.size, dim)).astype(np.float32)})
    return out



def _export_build(spec, seed, attrs, shape, dtype, input_path):
    op = spec.op
    inputs, attrs = drawn_or_given(spec, seed, attrs, shape, dtype, input_path, _export_make)
    checked, attrs, dims = checked_list(op, inputs, attrs)
    tables = [library_table(op, f"table{i}", checked[f"table{i}"], d) for i, d in enumerate(dims)]
    # table_sizes: what the handle says, as CANN's callers pass it (all: the live count,
    # word 2; new: the not-yet-exported count, word 4)
    word = 2 if attrs["export_mode"] == "all" else 4
    sizes = [int(ht.cann.handle_counters(t)[word]) for t in tables]
    if inputs.get("table_sizes") is not None and np.asarray(inputs["table_sizes"]).tolist() != sizes:
        raise refusal(op, "table_sizes", f"{sizes}: the entries each table exports (the kernel "
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
    tables_after = [_output(f"table{i}", bucket_bytes(t), d) for i, (t, d) in enumerate(zip(marked, dims))]
    return checked, [o for group in outs.values() for o in group] + tables_after, attrs


def _as_64(words: np.ndarray, dtype) -> np.ndarray:
    """uint32 word pairs ``[n, 2]`` (x64 off) or 64-bit values ``[n]`` → a 64-bit ``[n]``."""
    if words.ndim == 2:
        return np.ascontiguousarray(words.astype(np.uint32)).view(dtype).reshape(-1)
    return words.astype(dtype)


def _import_build(spec, seed, attrs, shape, dtype, input_path):
    op = spec.op
    inputs, attrs = drawn_or_given(spec, seed, attrs, shape, dtype, input_path, _import_make)
    checked, attrs, dims = checked_list(op, inputs, attrs)
    outputs = []
    for i, dim in enumerate(dims):
        keys = key_input(op, inputs, f"keys{i}", "CANN's kernel races on a repeated key: the last "
                     "writer of its counter and row is not defined")
        n = keys.size
        entries = {f"keys{i}": keys,
                   f"counters{i}": named_input(op, inputs, f"counters{i}", np.uint64, (n,)),
                   f"filter_flags{i}": named_input(op, inputs, f"filter_flags{i}", np.uint8, (n,)),
                   f"values{i}": named_input(op, inputs, f"values{i}", np.float32, (n, dim))}
        checked.update(entries)
        buf = checked[f"table{i}"]
        table = library_table(op, f"table{i}", buf, dim)
        # CANN does not read filter_flags: an entry keeps its bucket's FILTER (0 when new)
        held = buf[:, 16:20].copy().view("<i4").reshape(-1) == 1
        filters = dict(zip(buf[held, 0:8].copy().view("<i8").reshape(-1).tolist(),
                           (buf[held, 23] & ht.cann.FILTER).tolist()))
        kept = np.array([filters.get(k, 0) for k in keys.tolist()], np.uint8)
        table, _ = ht.import_(table, keys, entries[f"counters{i}"], kept, entries[f"values{i}"])
        outputs.append(_output(f"table{i}", bucket_bytes(table), dim))
    return checked, outputs, attrs


# -- the specs -----------------------------------------------------------------------------------

_TABLE_OPTIONS = dict(module="jaxops.hashtable", case_attrs=SIZES)

register_golden(GoldenSpec(
    "InitEmbeddingHashTable", "a new 64-bucket dim-4 table from sampled values, as CANN "
    "bucket bytes", _init_make, default_attrs=dict(DEFAULT_SIZES), build=_init_build,
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
    input_names=("table", "keys") + ADAM_FLOATS, **_TABLE_OPTIONS))
