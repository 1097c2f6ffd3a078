"""Golden specs of the hash-table operators: tables as CANN bucket bytes before and after.

Their inputs are fixed (a 64-slot, dim-4 table with about 24 live keys), so these cases take
no ``--shape``/``--dtype``.

>>> get_spec("EmbeddingHashTableExport").shape is None
True
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxops.core.impl_mode import OpImplMode
from jaxops.core.outshape_format import encode, to_host_words
from jaxops.core.registry import OpDef
from jaxops.golden.cases import GoldenRun, run_opdef
from jaxops.golden.specs import GoldenSpec, get_spec, register_golden
from jaxops.hashtable import (AdamWState, HashTable, adam_w_init, apply_adam_w, evict, export,
                              import_, init_table, lookup_or_insert)
from jaxops.hashtable.cann import to_cann_bytes

__all__: list[str] = []  # registers specs; nothing to import from here


def _filled_table_and_keys(rng: np.random.Generator, bucket_size: int = 64, dim: int = 4):
    """A table with ~24 live keys (some exported once already, one evicted, counters > 1)
    and those keys."""
    keys = rng.integers(-2**62, 2**62, 30, dtype=np.int64)
    table = init_table(bucket_size, dim, initializer_mode="random",
                       sampled_values=rng.standard_normal(bucket_size * dim).astype(np.float32))
    table, _, _ = lookup_or_insert(table, keys[:16])
    table, _, _, _, _ = export(table)                       # these 16 are exported once
    table, _, _ = lookup_or_insert(table, np.concatenate([keys[10:], keys[10:14]]))
    return evict(table, keys[:1]), keys[1:]


def _run_export(opdef: OpDef, inputs: list, attrs: dict) -> tuple[dict, GoldenRun]:
    """The OpDef's run, then the outputs in CANN's dtypes (int64 keys, uint64 counters) with
    the OP_OUTSHAPE words a CANN kernel writes for them."""
    (table,) = inputs[0]
    before = np.asarray(to_cann_bytes(table))
    run = run_opdef(opdef, inputs, attrs)
    keys, counters, flags, values = run.wire
    n = int(run.actual_shapes[2][0])
    wire = [_as_64(keys, np.int64), _as_64(counters, np.uint64), np.asarray(flags), np.asarray(values)]
    shapes = [(n,), (n,), (n,), (n, table.embedding_dim)]
    words = to_host_words(encode(shapes, np.int64, uint64_flag=True), np.int64)
    after_table = export(table, **attrs)[0]
    extra = {"table_before_bytes": before, "table_after_bytes": np.asarray(to_cann_bytes(after_table))}
    return extra, dataclasses.replace(run, wire=wire, outshape=words, actual_shapes=shapes)


def _as_64(words: np.ndarray, dtype) -> np.ndarray:
    """uint32 word pairs [n, 2] (x64 off) or 64-bit values [n] → a 64-bit array [n]."""
    words = np.asarray(words)
    if words.ndim == 2:
        return np.ascontiguousarray(words.astype(np.uint32)).view(dtype).reshape(-1)
    return words.astype(dtype)


register_golden(GoldenSpec(
    "EmbeddingHashTableExport",
    "export of a 64-slot dim-4 table (~24 live keys, 16 exported before, one evicted); "
    "tables before/after as CANN bucket bytes",
    lambda rng, attrs: [[_filled_table_and_keys(rng)[0]]], run=_run_export))


def _table_case(call):
    """A ``run=`` for the table-changing operators: ``call(inputs, attrs)`` gives the outputs
    in OpDef order; tables become CANN bucket bytes (the one before is saved too), optimizer
    state its stacked moments, a lookup's info its slots (counts as extra arrays)."""
    def run(opdef: OpDef, inputs: list, attrs: dict) -> tuple[dict, GoldenRun]:
        extra = {"table_before_bytes": np.asarray(to_cann_bytes(inputs[0]))} \
            if isinstance(inputs[0], HashTable) else {}
        if len(inputs) > 1 and isinstance(inputs[1], AdamWState):
            extra["state_before"] = _moments(inputs[1])
        wire = []
        for out in call(inputs, attrs):
            if isinstance(out, HashTable):
                wire.append(np.asarray(to_cann_bytes(out)))
            elif isinstance(out, AdamWState):
                wire.append(_moments(out))
                extra["state_beta_powers"] = np.array([out.beta1_power, out.beta2_power], np.float32)
            elif hasattr(out, "_fields"):  # LookupInfo / ImportInfo: the per-key slots + counts
                fields = out._asdict()
                fields.pop("route", None)  # one table: every key is served
                wire.append(np.asarray(fields.pop("slots")).astype(np.int64))
                extra.update({f"info_{k}": np.asarray(v) for k, v in fields.items()})
            else:
                wire.append(np.asarray(out))
        return extra, GoldenRun(wire, OpImplMode.HIGH_PRECISION)
    return run


def _moments(state) -> np.ndarray:
    return np.stack([np.asarray(state.m), np.asarray(state.v)])  # [2, bucket_size, dim]


def _keys(rng: np.random.Generator, present: np.ndarray, n: int = 12) -> np.ndarray:
    """n int64 keys: ``n // 2`` drawn from ``present`` (the first one twice), the rest new."""
    picked = rng.choice(present, n // 2 - 1, replace=False)
    new = rng.integers(-2**62, 2**62, n - n // 2, dtype=np.int64)
    return np.concatenate([picked, picked[:1], new]).astype(np.int64)


def _table_inputs(rng: np.random.Generator):
    table, live = _filled_table_and_keys(rng)
    return table, _keys(rng, live)


def _adam_inputs(rng: np.random.Generator, attrs: dict) -> list:
    table, keys = _table_inputs(rng)
    grad = rng.standard_normal((keys.size, table.embedding_dim)).astype(np.float32)
    hyper = [np.float32(v) for v in (0.01, 0.01, 0.9, 0.999, 1e-8)]  # lr, wd, b1, b2, eps
    state = adam_w_init(table, amsgrad=bool(attrs.get("amsgrad", False)))
    table, state = apply_adam_w(table, state, keys, grad, lr=hyper[0], weight_decay=hyper[1])
    return [table, state, keys, grad[::-1].copy(), *hyper]  # a second step from moments != 0


def _import_inputs(rng: np.random.Generator, attrs: dict) -> list:
    table, keys = _table_inputs(rng)
    n, dim = keys.size, table.embedding_dim
    counters = rng.integers(1, 2**40, n, dtype=np.uint64)
    flags = (rng.random(n) < 0.5).astype(np.uint8)
    return [table, keys, counters, flags, rng.standard_normal((n, dim)).astype(np.float32)]


def _lookup(inputs, attrs):
    return lookup_or_insert(inputs[0], inputs[1], **attrs)


def _apply_adam_w(inputs, attrs):
    table, state, keys, grad, lr, wd, b1, b2, eps = inputs
    return apply_adam_w(table, state, keys, grad, lr=lr, weight_decay=wd, beta1=b1,
                           beta2=b2, epsilon=eps, **attrs)


def _evict(inputs, attrs):
    return (evict(inputs[0], inputs[1], sampled_values=inputs[2], **attrs),)


def _import(inputs, attrs):
    return import_(*inputs)


def _init(inputs, attrs):
    return (init_table(attrs["bucket_size"], attrs["embedding_dim"], sampled_values=inputs[0],
                          **{k: v for k, v in attrs.items() if k not in ("bucket_size", "embedding_dim")}),)


register_golden(GoldenSpec(
    "EmbeddingHashTableLookupOrInsert",
    "12 keys (5 present, one twice, 6 new) into the export case's table; tables before/after "
    "as CANN bucket bytes, the rows, and each key's slot",
    lambda rng, attrs: list(_table_inputs(rng)), run=_table_case(_lookup)))

register_golden(GoldenSpec(
    "EmbeddingHashTableApplyAdamW",
    "a second AdamW step (lr 0.01, weight decay 0.01) on 12 keys (duplicate and absent ones "
    "included); tables and moments before/after",
    _adam_inputs, run=_table_case(_apply_adam_w)))

register_golden(GoldenSpec(
    "EmbeddingHashTableEvict",
    "evict 12 keys (5 present, one twice, 6 absent); tables before/after",
    lambda rng, attrs: [*_table_inputs(rng), None], run=_table_case(_evict)))

register_golden(GoldenSpec(
    "EmbeddingHashTableImport",
    "import 12 entries (5 existing keys, one twice, 6 new) with counters, filter flags and "
    "rows; tables before/after and each entry's slot",
    _import_inputs, run=_table_case(_import)))

register_golden(GoldenSpec(
    "InitEmbeddingHashTable",
    "a new 64-slot dim-4 table from sampled values, as CANN bucket bytes",
    lambda rng, attrs: [rng.standard_normal((attrs["bucket_size"], attrs["embedding_dim"]))
                        .astype(np.float32)],
    default_attrs={"bucket_size": 64, "embedding_dim": 4}, run=_table_case(_init)))
