"""The CANN ``hash/`` operators as OpDefs (their kernels live in the operation modules).

Names, attributes and defaults follow ops-nn's ``*_def.cpp``. Where CANN passes a table
handle, jaxops passes one shard's :class:`~jaxops.hashtable._table.table.HashTable` pytree and gets
the new one back (JAX has no in-place state); ``bucket_size`` / ``embedding_dim`` attributes
that restate the table's shape are dropped.
"""

from __future__ import annotations

import jax

from jaxops.core.dtypes import DataType
from jaxops.core.registry import AttrDef, Input, OpDef, Output, register_op
from jaxops.core.walk_table import uses_walks


def _non_negative(v) -> bool:
    return v >= 0


def _int64(v) -> bool:
    return -2**63 <= v < 2**64


_INT64 = "a key in [-2**63, 2**64) (int64, or a uint64 bit pattern)"


INIT_OP = register_op(OpDef(
    name="InitEmbeddingHashTable",
    inputs=[Input("sampled_values", {DataType.FLOAT}, "optional",
                  doc="[bucket_size, embedding_dim] rows for initializer_mode='random'")],
    outputs=[Output("table", None)],
    attrs=[AttrDef("bucket_size", "int", check=lambda v: 1 <= v < 2**31,
                   expected="an int in [1, 2**31 - 1]"),
           AttrDef("embedding_dim", "int", check=lambda v: v >= 1, expected="an int >= 1"),
           AttrDef("initializer_mode", "str", "random", choices=("random", "constant")),
           AttrDef("constant_value", "float", 0.0),
           AttrDef("dtype", "str", "float32", choices=("float32", "bfloat16", "float16"))],
    doc="A new empty table whose slots hold sampled_values or constant_value rows (dtype: "
        "the rows', beyond CANN).",
))

LOOKUP_OR_INSERT_OP = register_op(OpDef(
    name="EmbeddingHashTableLookupOrInsert",
    inputs=[Input("table", None),
            Input("keys", None,
                  doc="int64 keys, or uint64 for a key_dtype=uint64 table (see as_words)")],
    outputs=[Output("table", None), Output("values", {DataType.FLOAT}), Output("info", None)],
    attrs=[AttrDef("filter_mode", "str", "no_filter", choices=("no_filter", "counter")),
           AttrDef("filter_freq", "int", 0, check=_non_negative, expected="an int >= 0"),
           AttrDef("default_key_or_value", "bool", False),
           AttrDef("default_key", "int", 0, check=_int64, expected=_INT64),
           AttrDef("default_value", "float", 0.0),
           AttrDef("filter_key_flag", "bool", False),
           AttrDef("filter_key", "int", -1, check=_int64, expected=_INT64)],
    doc="Rows of keys, inserting absent ones; counts accesses; optional admission filter.",
))


def _export_shapes(ctx) -> list[tuple[int, ...]]:
    tables = ctx.inputs[0]
    wide = () if jax.config.jax_enable_x64 else (2,)
    size = ctx.attrs["size"]
    cap = [t.bucket_size if size is None else size for t in tables]
    words = [(c, *wide) for c in cap]
    return (words + words + [(c,) for c in cap]
            + [(c, t.embedding_dim) for c, t in zip(cap, tables)])


def _export_dtypes(ctx) -> list[DataType]:
    n = len(ctx.inputs[0])
    x64 = jax.config.jax_enable_x64
    return ([DataType.INT64 if x64 else DataType.UINT32] * n
            + [DataType.UINT64 if x64 else DataType.UINT32] * n
            + [DataType.UINT8] * n + [DataType.FLOAT] * n)


EXPORT_OP = register_op(OpDef(
    name="EmbeddingHashTableExport",
    inputs=[Input("tables", None, "dynamic", doc="a list of HashTables (CANN: table_handles)")],
    outputs=[Output("keys", {DataType.INT64, DataType.UINT32}, "dynamic"),
             Output("counters", {DataType.UINT64, DataType.UINT32}, "dynamic"),
             Output("filter_flags", {DataType.UINT8}, "dynamic"),
             Output("values", {DataType.FLOAT}, "dynamic")],
    attrs=[AttrDef("export_mode", "str", "all", choices=("all", "new")),
           AttrDef("filtered_export_flag", "bool", False),
           AttrDef("size", "int", None, optional=True, check=lambda v: 0 <= v < 2**31,
                   expected="None or an int in [0, 2**31 - 1]",
                   doc="output capacity per table (not in CANN); None: bucket_size")],
    infer_shape=_export_shapes,
    infer_dtype=_export_dtypes,
    data_dependent=True,
    fill_values=[-1, 0, 0, 0],
    doc="Exported entries of each table in ascending slot order: keys of every table, then "
        "counters, filter flags and values (CANN's output order). Through tracing.launch "
        "only these outputs come back, so the tables' EXPORT bits and not-exported counts are "
        "not updated there (jaxops.hashtable.export returns the marked tables); with "
        "jax_enable_x64 off keys and counters are [n, 2] uint32 word pairs (OP_OUTSHAPE rank "
        "2), with it on int64/uint64 [n] as CANN's kernel writes them.",
))

IMPORT_OP = register_op(OpDef(
    name="EmbeddingHashTableImport",
    inputs=[Input("table", None), Input("keys", None), Input("counters", None),
            Input("filter_flags", None), Input("values", {DataType.FLOAT})],
    outputs=[Output("table", None), Output("info", None)],
    doc="Inserts or overwrites entries (counter, flags, row), marking them exported.",
))

EVICT_OP = register_op(OpDef(
    name="EmbeddingHashTableEvict",
    inputs=[Input("table", None), Input("keys", None),
            Input("sampled_values", {DataType.FLOAT}, "optional")],
    outputs=[Output("table", None)],
    attrs=[AttrDef("init_mode", "str", "constant", choices=("constant", "random")),
           AttrDef("const_val", "float", 0.0)],
    doc="Turns present keys into tombstones: counter 0, row reset.",
))

APPLY_ADAM_W_OP = register_op(OpDef(
    name="EmbeddingHashTableApplyAdamW",
    inputs=[Input("table", None), Input("state", None), Input("keys", None),
            Input("grad", {DataType.FLOAT}), Input("lr", None), Input("weight_decay", None),
            Input("beta1", None), Input("beta2", None), Input("epsilon", None),
            Input("slots", None, "optional",
                  doc="int32 slots from LookupOrInsert instead of keys (not in CANN)")],
    outputs=[Output("table", None), Output("state", None)],
    attrs=[AttrDef("amsgrad", "bool", False), AttrDef("maximize", "bool", False)],
    doc="In-table AdamW on the rows of keys (decoupled weight decay, bias correction).",
))

# Operators built from the table walks: explain() names the walks' path (native or xla).
for _op in (LOOKUP_OR_INSERT_OP, IMPORT_OP, EVICT_OP, APPLY_ADAM_W_OP):
    uses_walks(_op.name)
