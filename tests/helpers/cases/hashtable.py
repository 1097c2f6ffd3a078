"""Op-matrix rows of the hash tables: export (a CANN op) and the differentiable gather."""

import jax
import numpy as np

import jaxops
import jaxops.hashtable as ht
from tests.helpers.hashtable_reference import RefTable
from tests.helpers.op_matrix import OpCase

SIZE, DIM = 16, 2


def _keys(rng):
    return rng.integers(-30, 30, 12).astype(np.int64)


def _export_inputs(rng):
    values = rng.standard_normal((SIZE, DIM)).astype(np.float32)
    table, _, _ = ht.lookup_or_insert(ht.init_table(SIZE, DIM, sampled_values=values), _keys(rng),
                                      filter_mode="counter", filter_freq=2)
    return ([table],)


def _export(tables, **attrs):
    return list(jaxops.get_op("EmbeddingHashTableExport")(tables, **attrs))


def _export_reference(tables, **attrs):
    out = RefTable.from_table(tables[0]).export(attrs.get("export_mode", "all"),
                                                attrs.get("filtered_export_flag", False))
    if jax.config.jax_enable_x64:  # 64-bit keys and counters as they are
        return [out["keys"], out["counters"], out["filter_flags"], out["values"]]
    wide = lambda a: np.ascontiguousarray(a).view(np.uint32).reshape(-1, 2)  # noqa: E731 x64 off
    return [wide(out["keys"]), wide(out["counters"]), out["filter_flags"], out["values"]]


def _gather_inputs(rng):
    return (rng.standard_normal((10, 3)).astype(np.float32),
            rng.integers(-1, 10, 7).astype(np.int32))


def _gather(values, slots):
    """``ht.gather`` on a table holding ``values`` (the matrix differentiates w.r.t. them)."""
    table = ht.HashTable.empty(values.shape[0], values.shape[1], values)
    return ht.gather(table, slots)


def _gather_reference(values, slots):
    return np.where((slots >= 0)[:, None], values[np.maximum(slots, 0)], 0.0).astype(np.float32)


def _gather_grad(values, slots, ct):
    grad = np.zeros_like(values)
    np.add.at(grad, slots[slots >= 0], ct[slots >= 0])
    return [grad]


CASES = [
    OpCase("hashtable_export_all", "EmbeddingHashTableExport", _export, _export_inputs,
           _export_reference, launch_outputs=lambda outs: list(outs), vmap=False),
    OpCase("hashtable_export_new_filtered", "EmbeddingHashTableExport", _export, _export_inputs,
           _export_reference, attrs={"export_mode": "new", "filtered_export_flag": True},
           launch_outputs=lambda outs: list(outs), vmap=False),
    # gather is no CANN op (launch_outputs=None); it is how LookupOrInsert reads rows.
    OpCase("hashtable_gather", "EmbeddingHashTableLookupOrInsert", _gather, _gather_inputs,
           _gather_reference, launch_outputs=None, grad_argnums=(0,),
           grad_reference=_gather_grad),
]
