"""Input generators of the golden cases, one per operator (see :mod:`jaxops.golden`).

Shapes are small and fixed so a case is easy to inspect; values come from the seed.
"""

from __future__ import annotations

import numpy as np

from jaxops.golden import GoldenSpec, register_golden


def _sparse_ints(rng: np.random.Generator, shape, density: float = 0.3) -> np.ndarray:
    values = rng.integers(1, 10, shape).astype(np.int32)
    return np.where(rng.random(shape) < density, values, 0).astype(np.int32)


def _boxes(rng: np.random.Generator, batches: int, n: int) -> np.ndarray:
    """Corner boxes [y1, x1, y2, x2] in a 100×100 image, crowded enough to suppress."""
    centre = rng.uniform(10, 90, (batches, n, 2))
    half = rng.uniform(3, 15, (batches, n, 2))
    return np.concatenate([centre - half, centre + half], axis=-1).astype(np.float32)


register_golden(GoldenSpec(
    "NonZero", "indices of the non-zero elements of an int32 [4, 5, 6] tensor (30% set)",
    lambda rng, attrs: [_sparse_ints(rng, (4, 5, 6))]))

register_golden(GoldenSpec(
    "Unique", "unique values of 64 int32 in [0, 20) with first indices, inverse and counts",
    lambda rng, attrs: [rng.integers(0, 20, 64).astype(np.int32)]))

register_golden(GoldenSpec(
    "UniqueConsecutive", "runs of equal values in 64 int32 drawn from a few values",
    lambda rng, attrs: [np.repeat(rng.integers(0, 5, 24), rng.integers(1, 4, 24))[:64].astype(np.int32)]))

register_golden(GoldenSpec(
    "MaskedSelect", "float32 [8, 8] elements where a random mask (40%) is set",
    lambda rng, attrs: [rng.standard_normal((8, 8)).astype(np.float32), rng.random((8, 8)) < 0.4]))

register_golden(GoldenSpec(
    "NonMaxSuppression", "ONNX NMS: 2 batches × 3 classes × 40 crowded boxes",
    lambda rng, attrs: [_boxes(rng, 2, 40), rng.random((2, 3, 40)).astype(np.float32)],
    default_attrs={"max_output_boxes_per_class": 10, "iou_threshold": 0.5, "score_threshold": 0.1}))


# -- hash tables ---------------------------------------------------------------------------

def _filled_table(rng: np.random.Generator, bucket_size: int = 64, dim: int = 4):
    """A table with ~24 live keys: some exported once already, one evicted, counters > 1."""
    import jaxops.hashtable as ht

    keys = rng.integers(-2**62, 2**62, 30, dtype=np.int64)
    table = ht.init_table(bucket_size, dim, initializer_mode="random",
                          sampled_values=rng.standard_normal(bucket_size * dim).astype(np.float32))
    table, _, _ = ht.lookup_or_insert(table, keys[:16])
    table, _, _, _, _ = ht.export(table)                       # these 16 are exported once
    table, _, _ = ht.lookup_or_insert(table, np.concatenate([keys[10:], keys[10:14]]))
    return ht.evict(table, keys[:1])


def _run_export(inputs: list, attrs: dict):
    """Export through tracing.launch, then the outputs in CANN's dtypes (int64 keys, uint64
    counters) with the OP_OUTSHAPE words a CANN kernel writes for them."""
    import dataclasses

    import jaxops.hashtable as ht
    from jaxops.golden import _launch
    from tracing.outshape import encode, to_host_words

    (table,) = inputs[0]
    before = np.asarray(ht.to_cann_bytes(table))
    result = _launch("EmbeddingHashTableExport", inputs, attrs)
    keys, counters, flags, values = result.wire
    n = int(result.outputs[2].shape[0])
    wire = [_as_64(keys, np.int64), _as_64(counters, np.uint64), np.asarray(flags), np.asarray(values)]
    shapes = [(n,), (n,), (n,), (n, table.embedding_dim)]
    words = to_host_words(encode(shapes, np.int64, uint64_flag=True), np.int64)
    exact = [w.reshape(-1)[:int(np.prod(s))].reshape(s) for w, s in zip(wire, shapes)]
    after_table = ht.export(table, **attrs)[0]
    extra = {"table_before_bytes": before, "table_after_bytes": np.asarray(ht.to_cann_bytes(after_table))}
    return extra, dataclasses.replace(result, wire=wire, outputs=exact, outshape=words)


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
    lambda rng, attrs: [[_filled_table(rng)]], run=_run_export))
