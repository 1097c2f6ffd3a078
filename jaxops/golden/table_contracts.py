"""The kernel contracts of the hash-table operators' golden cases (the arch35 kernels of
hicann/ops-nn ``hash/``), registered into :mod:`jaxops.golden.contracts` when the specs of
:mod:`jaxops.golden.hashtable_specs` load. Each says what the case holds, the files it was
read from, CANN's attrs (``table_cap`` is Evict's name for ``bucket_size``) and where the
case departs from the kernel (``docs/golden.md`` says why).

>>> contract("EmbeddingHashTableEvict", {"bucket_size": 64, "embedding_dim": 4}, None).cann_attrs[:2]
(('table_cap', 64), ('embedding_dim', 4))
"""

from __future__ import annotations

from jaxops.core.errors import OpArgumentError
from jaxops.golden.contracts import Contract, contract, register_contract  # noqa: F401

__all__: list[str] = []  # registers contracts; use jaxops.golden.contracts.contract

_OPS_NN = "hicann/ops-nn"
_HASH = f"{_OPS_NN} hash/"
_HASH_COMMON = f"{_OPS_NN} common/inc/op_kernel/hashtable_common.h (MurmurHash3, RoundUpTo8)"
#: Where each table case departs from the arch35 kernels (docs/golden.md says why).
_ORDER = ("one key after another in index order; the kernel runs keys on parallel threads, "
          "so new keys whose probes meet may take their buckets in another order")
_KERNEL = ("op_graph/{}_proto.h", "op_kernel/arch35/{}.h", "op_host/arch35/{}_tiling_arch35.cpp")
_REUSE = ("a new key takes the first tombstone of another key its probe met (jaxops reclaims "
          "them); the kernel's CAS skips tombstones and probes on to an empty bucket")


#: Per table operator: what its case holds, the files read (in its ops-nn folder), CANN's
#: attrs (``cann=ours`` where the names differ) and where the case departs from the kernel.
_TABLE_CONTRACTS = {
    "InitEmbeddingHashTable": (
        "table: the bucket array the handle points at, UINT8 [bucket_size, 24 + "
        "round_up_8(4 * embedding_dim)]: every bucket key -1, counter 0, bytes 16-23 zero, the "
        "row from sampled_values (initializer_mode random, FLOAT [bucket_size * "
        "embedding_dim]) or constant_value; FLOAT values only", _KERNEL,
        ("bucket_size", "embedding_dim", "initializer_mode", "constant_value"),
        ("the padding after a row (odd embedding_dim) is zero; the kernel does not write it",)),
    "EmbeddingHashTableLookupOrInsert": (
        "values FLOAT [N, embedding_dim]: each key's row; an absent key is inserted at the "
        "first empty bucket of its probe (MurmurHash3 x86_32 of its 8 bytes, seed 0, % "
        "bucket_size, then +1; the CAS of the int32 at byte 20 writes VALID into byte 23, the "
        "key, state 1); its counter +1; an evicted key (byte 20, 0x8) is revived; filter_key "
        "(filter_key_flag) answers default_value or becomes default_key; table: the bucket "
        "array after",
        ("op_graph/{}_proto.h", "op_kernel/arch35/lookup_or_insert_base.h",
         "op_kernel/arch35/kernel_lookup_or_insert_general.h",
         "op_kernel/arch35/kernel_lookup_or_insert_opt_dim.h",
         "op_host/arch35/{}_tiling_arch35.cpp"),
        ("bucket_size", "embedding_dim", "filter_mode", "filter_freq", "default_key_or_value",
         "default_key", "default_value", "filter_key_flag", "filter_key"),
        (_ORDER, _REUSE, "an evicted key comes back with VALID alone (EXPORT and FILTER "
         "cleared, as a new key); the kernel clears byte 20's EVICTED and keeps byte 23",
         "a key that finds no bucket (a full table) gets default_value; the kernel leaves its "
         "row unwritten")),
    "EmbeddingHashTableExport": (
        "inputs table_sizes, embedding_dims, bucket_sizes: 1-D INT64, one entry per table "
        "(table{i}: the bucket array table_handles[i] points at); outputs per table keys{i} "
        "INT64 [table_sizes[i]], counters{i} UINT64, filter_flags{i} UINT8 (FILTER as 0/1), "
        "values{i} FLOAT [table_sizes[i], embedding_dims[i]]: every VALID, not EVICTED bucket "
        "in bucket order (export_mode new: not EXPORT either), EXPORT set on its first export "
        "(table{i} after); no OP_OUTSHAPE: InferShape takes the sizes from table_sizes",
        ("op_graph/{}_proto.h", "op_kernel/arch35/{}.h", "op_host/{}_infershape.cpp",
         "op_host/arch35/{}_tiling_arch35.cpp"), ("export_mode", "filtered_export_flag"),
        ("EVICTED is read from byte 20, where CANN's Evict writes it; the arch35 kernel tests "
         "0x8 in byte 23, which no CANN kernel sets, and so exports evicted keys too",)),
    "EmbeddingHashTableImport": (
        "inputs embedding_dims, bucket_sizes: 1-D INT64, one entry per table; keys{i} INT64, "
        "counters{i} UINT64, filter_flags{i} UINT8, values{i} FLOAT per table: each key found "
        "or inserted as LookupOrInsert probes, its counter and row written and VALID | EXPORT "
        "or-ed into byte 23 (the kernel's FILTER_FLAG_MASK 0b101; filter_flags is not read: "
        "FILTER stays as it was, 0 for a new key); table{i} after", _KERNEL, (),
        (_ORDER, _REUSE, "an evicted key imported is revived (EVICTED cleared); the kernel "
         "leaves byte 20 as it was, so the entry stays evicted there")),
    "EmbeddingHashTableEvict": (
        "each key found (its walk compares keys) and not evicted: EVICTED (0x8) set in byte "
        "20 (the kernel's int32 at 20 ^= 1 << 3), counter 0, the row const_val or "
        "sampled_values[i] (init_mode random: FLOAT [N, embedding_dim]); table: the bucket "
        "array after", _KERNEL,
        ("table_cap=bucket_size", "embedding_dim", "init_mode", "const_val"), ()),
    "EmbeddingHashTableApplyAdamW": (
        "for each key (distinct, as the proto requires; -1 skipped) found VALID: AdamW on its "
        "row and m, v (max_grad_norm with amsgrad) at its bucket, in float32 with the "
        "kernel's expressions; outputs m, v, beta1_power, beta2_power, max_grad_norm in the "
        "dtype of m (FLOAT16 or FLOAT; [bucket_size, embedding_dim], [1]), other rows as "
        "given (updated in place); the row written as float(T(w)); table: the bucket array "
        "after", ("op_graph/{}_proto.h", "op_kernel/arch35/{}.h", "op_host/{}_def.cpp"),
        ("embedding_dim", "bucket_size", "amsgrad", "maximize"),
        ("an evicted key is skipped (as LookupOrInsert treats it: absent); the kernel tests "
         "VALID only and updates its row",
         "float outputs: the kernel's float32 expressions; a compiler may fuse a*b±c, so check "
         "allows a few roundings of the terms (jaxops.golden.table_references)")),
}
_TABLE_FOLDERS = {"InitEmbeddingHashTable": "init_embedding_hash_table",
                  "EmbeddingHashTableLookupOrInsert": "embedding_hash_table_lookup_or_insert",
                  "EmbeddingHashTableApplyAdamW": "embedding_hash_table_apply_adam_w"}


def _attr_notes(op: str, attrs: dict) -> tuple[str, ...]:
    """Notes (or refusals) for attrs the arch35 kernel does not have or does not use."""
    if op == "EmbeddingHashTableExport":
        if attrs.get("size") is not None:
            raise OpArgumentError("golden EmbeddingHashTableExport", "size", "None: the kernel "
                                  "takes its output sizes from table_sizes", repr(attrs["size"]))
        if attrs.get("filtered_export_flag"):
            return ("filtered_export_flag is copied into filteredExportFlag_ and unused by the "
                    "arch35 kernel: every entry is exported, as with false (jaxops' export would "
                    "keep FILTER entries only)",)
    notes: tuple[str, ...] = ()
    if op == "EmbeddingHashTableLookupOrInsert" and attrs.get("filter_mode") == "counter":
        notes += ("filter_mode 'counter' is read by the tiling and used by no kernel: the case "
                  "does not filter (jaxops' lookup_or_insert does)",)
    if op == "EmbeddingHashTableLookupOrInsert" and attrs.get("filter_key_flag") \
            and attrs.get("default_key_or_value"):
        notes += ("the kernel also writes default_key over filter_key in its keys input",)
    return notes


def _table_rule(op: str):
    follows, files, cann, notes = _TABLE_CONTRACTS[op]
    folder = _TABLE_FOLDERS.get(op, "embedding_hash_table_" + op[len("EmbeddingHashTable"):].lower())
    sources = tuple(f"{_HASH}{folder}/{f.format(folder)}" for f in files) + (_HASH_COMMON,)

    def rule(attrs: dict, _: str) -> Contract:
        return Contract(op, follows, sources, fixed_shape=True, notes=notes + _attr_notes(op, attrs),
                        cann_attrs=tuple((c.split("=")[0], attrs.get(c.split("=")[-1]))
                                         for c in cann))
    return rule


for _op in _TABLE_CONTRACTS:
    register_contract(_op, "arch35")(_table_rule(_op))
