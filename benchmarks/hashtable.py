"""Hash-table benchmarks, side by side with their peers in one process.

Run ``python -m benchmarks --only hashtable [--quick]``. Full size is issue 5's: a
table of 2M slots at load 0.5, embedding dim 8, batches of 1M keys, on this machine's CPU.

- ``find`` of 1M present keys vs ``jnp.take`` of 1M rows from a dense 2M x 8 array (target:
  at least 1/3 of its rows/s, i.e. a time ratio <= 3); also vs ``take(mode="clip")``, the
  fastest take, and with half the keys absent.
- ``lookup_or_insert`` of 1M new keys into the empty table: keys/s, reported beside find.
- ``export`` of 1M live entries vs numpy boolean-mask compaction of the same arrays
  (target <= 3x).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import jaxops
import jaxops.hashtable as ht
from benchmarks.common import (Result, against, agree, assert_table, compare, holds_keys,
                               table_rows)


def _words(keys: np.ndarray) -> ht.words.Words64:
    return ht.words.as_words(keys, "benchmark", "keys")


def _joined(pairs: np.ndarray) -> np.ndarray:
    """uint32 ``[n, 2]`` (lo, hi) word pairs, as export gives counters with x64 off, as
    uint64."""
    return ht.words.to_host_int64(ht.words.Words64(pairs[:, 0], pairs[:, 1]), signed=False)


def run(quick: bool = False) -> list[Result]:
    size, batch, dim = (20_000, 10_000, 8) if quick else (2_000_000, 1_000_000, 8)
    repeats = 3 if quick else 7
    rng = np.random.default_rng(0)
    keys = rng.choice(2**62, batch, replace=False).astype(np.int64) - 2**61
    absent = rng.choice(2**62, batch, replace=False).astype(np.int64) + 2**62
    init = rng.standard_normal((size, dim)).astype(np.float32)
    empty = ht.init_table(size, dim, sampled_values=init)

    insert = jax.jit(lambda t, k: ht.lookup_or_insert(t, k)[0])
    new_keys = _words(keys)
    table = jax.block_until_ready(insert(empty, new_keys))
    assert_table(table, keys, "the table find reads")

    find = jax.jit(lambda t, k: ht.find(t, k)[0])
    order = rng.permutation(keys)
    mixed = np.concatenate([rng.choice(keys, batch // 2, replace=False), absent[:batch // 2]])
    present, half = _words(order), _words(mixed)
    # find's references: the rows read from the slot arrays on the host (0 where absent),
    # not jnp.take's answer, which is a speed baseline
    rows_present, rows_half = (against(table_rows(table, k)[0]) for k in (order, mixed))
    dense = jnp.asarray(init)
    rows = jnp.asarray(rng.integers(0, size, batch).astype(np.int32))
    take = jax.jit(lambda d, i: jnp.take(d, i, axis=0))
    take_clip = jax.jit(lambda d, i: jnp.take(d, i, axis=0, mode="clip"))
    n = f"{batch / 1e6:g}M"

    results = [
        compare(f"find {n} present keys", lambda: find(table, present), "jnp.take rows",
                lambda: take(dense, rows), target=3.0, repeats=repeats,
                note="target: >= 1/3 of take's rows/s", check=rows_present),
        compare(f"find {n} present keys", lambda: find(table, present), "jnp.take(mode=clip)",
                lambda: take_clip(dense, rows), repeats=repeats, note="the fastest take",
                check=rows_present),
        compare(f"find {n} keys, half absent", lambda: find(table, half), "jnp.take rows",
                lambda: take(dense, rows), repeats=repeats, check=rows_half),
    ]
    ins = compare(f"lookup_or_insert {n} new keys", lambda: insert(empty, new_keys),
                  f"find {n} present keys", lambda: find(table, present), repeats=repeats,
                  check=holds_keys(keys))  # the find peer is checked in the rows above
    ins.note = (f"{batch / ins.ours_s / 1e6:.2f} M keys/s "
                f"(find: {batch / ins.peer_s / 1e6:.2f} M keys/s)")
    results.append(ins)

    export = jax.jit(lambda t: ht.export(t))
    host = jax.device_get(table)
    h_keys = ht.words.to_host_int64(ht.words.Words64(host.key_lo, host.key_hi))
    h_counters = ht.words.to_host_int64(ht.words.Words64(host.counter_lo, host.counter_hi), signed=False)
    h_flags, h_values = np.asarray(host.flags), np.asarray(host.values)

    def numpy_export():
        mask = ((h_flags & ht.cann.VALID) != 0) & ((h_flags & ht.cann.EVICTED) == 0)
        return h_keys[mask], h_counters[mask], (h_flags[mask] & ht.cann.FILTER) != 0, h_values[mask]

    def on_host(out):  # ours as numpy gives it: keys int64, counters uint64, filter bool
        _, keys, counters, filters, values = jaxops.refresh(out)
        return ht.host_keys(table, keys), _joined(counters), filters != 0, values

    results.append(compare(f"export {n} live entries", lambda: export(table), "numpy bool mask",
                           numpy_export, target=3.0, repeats=repeats, check=agree(view=on_host)))
    return results
