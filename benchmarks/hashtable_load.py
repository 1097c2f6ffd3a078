"""Does a full table cost what an empty one costs? (issue 39's load targets)

Run ``python -m benchmarks [--quick] --only hashtable_load``. Two rows per walk path
(native and xla, each traced under its backend):

- **full-table step**: a jitted, donated ``lookup_or_insert`` of 8,192 new ids into a table
  of 2^16 slots that is full (every slot holds a key, as a table filled inside ``jit`` with
  no maintenance call between steps ends up), against the same step into the empty table
  (target: 1.5x). Every new key of the full table walks to the probe bound before it is
  counted as unplaced: today that bound is ``PROBE_LIMIT`` (4,096 slots), so this row
  measures what a bounded window (HierarchicalKV's 128-slot bucket) would remove.
- **find at load 0.9 vs 0.5**: ``find`` of 65,536 present keys in a 2^20-slot table at
  load 0.9 against the same call at load 0.5 (target: 1.2x).

Each side is checked before it is timed: the full table's call places nothing and counts
every key unplaced, the empty table's places every key; both finds return each key's row.
"""

from __future__ import annotations

import functools

import numpy as np

from benchmarks.common import Result, compare


def _keys(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).choice(2**62, n, replace=False).astype(np.int64)


def _full_table(slots: int):
    """A table whose every slot holds a key (inserted in batches until none is free)."""
    import jaxops.hashtable as ht

    t = ht.set_load_policy(ht.init_table(slots, 16, initializer_mode="constant",
                                         constant_value=0.01), max_load_factor=1.0)
    seed = 100
    while int(t.live) < slots:
        t, _, _ = ht.lookup_or_insert(t, _keys(slots // 2, seed), donate=True)
        seed += 1
    return t


def _step_rows(quick: bool, path: str) -> Result:
    import jax

    import jaxops.hashtable as ht
    from jaxops.core.backend_table import use_backend

    slots, batch = (1 << 14, 2048) if quick else (1 << 16, 8192)
    full = _full_table(slots)
    empty = ht.set_load_policy(ht.init_table(slots, 16, initializer_mode="constant",
                                             constant_value=0.01), max_load_factor=1.0)
    new = ht.words.as_words(_keys(batch, 1))
    with use_backend("xla" if path == "xla" else "auto"):
        step = jax.jit(lambda t, k: ht.lookup_or_insert(t, k)[::2], donate_argnums=0)
        jax.block_until_ready(step(jax.tree.map(lambda x: x.copy(), empty), new))
    box = {}

    def run(name):
        box[name], info = step(box.pop(name), new)
        return info

    def check(ours, peer):
        assert int(ours.unplaced) == batch and int(ours.inserted) == 0, "full: all unplaced"
        assert int(peer.inserted) == batch and int(peer.unplaced) == 0, "empty: all placed"

    def reset():
        box["full"] = jax.tree.map(lambda x: x.copy(), full)
        box["empty"] = jax.tree.map(lambda x: x.copy(), empty)

    return compare(f"step into a full table, {slots >> 10}K slots, {batch} new ids, {path}",
                   lambda: run("full"), "the empty table", lambda: run("empty"),
                   target=1.5, repeats=3 if quick else 7, warmup=1, reset=reset, check=check)


def _find_rows(quick: bool, path: str) -> Result:
    import jax

    import jaxops.hashtable as ht
    from jaxops.core.backend_table import use_backend

    slots, batch = (1 << 16, 8192) if quick else (1 << 20, 1 << 16)
    tables, probes = {}, {}
    for load in (0.5, 0.9):
        keys = _keys(int(load * slots), 7)
        t = ht.set_load_policy(ht.init_table(slots, 16, initializer_mode="constant",
                                             constant_value=0.01), max_load_factor=1.0)
        for chunk in np.array_split(keys, 8):
            t, _, _ = ht.lookup_or_insert(t, chunk, donate=True)
        tables[load], probes[load] = t, ht.words.as_words(keys[:batch])
    with use_backend("xla" if path == "xla" else "auto"):
        find = jax.jit(functools.partial(ht.find))
        jax.block_until_ready(find(tables[0.5], probes[0.5]))

    def check(ours, peer):
        for rows, mask in (ours, peer):
            assert bool(np.asarray(mask).all()), "find: every key present"
            assert float(np.asarray(rows).min()) == np.float32(0.01)

    return compare(f"find at load 0.9, {batch >> 10}K keys in {slots >> 20 or slots >> 10}"
                   f"{'M' if slots >= 1 << 20 else 'K'} slots, {path}",
                   lambda: find(tables[0.9], probes[0.9]), "find at load 0.5",
                   lambda: find(tables[0.5], probes[0.5]), target=1.2,
                   repeats=5 if quick else 11, warmup=2, check=check)


def run(quick: bool = False) -> list[Result]:
    from jaxops import native

    paths = ["native", "xla"] if native.available() else ["xla"]
    return [row(quick, p) for row in (_step_rows, _find_rows) for p in paths]
