"""Hash tables at scale: the cost of a call follows the batch, not the table.

Run through the runner: ``python -m benchmarks [--quick] --only hashtable_scale``.

- ``lookup_or_insert`` of 4,096 present keys, jitted with the table donated, at 2^20, 2^22
  and 2^24 slots, each timed side by side with the same step on a 2^16-slot table (target:
  ratio <= 1.5, issue 14), :data:`STEPS_PER_SAMPLE` steps a sample. Embedding dim 4 keeps a
  2^24-slot table near 620 MB.
- Huge pages: at 2^24 slots a step's random accesses miss the TLB as well as the caches
  unless the table lies on huge pages. With Linux's transparent huge pages in ``madvise``
  mode (Debian's and Ubuntu's default) XLA's buffers get none; run with
  ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` (glibc >= 2.35 then advises its large
  allocations). Measured on the 2-core machine while it was quiet (this case, 2^24 vs
  2^16, wall-time median ratio): 1.29-1.39 on 4 KiB pages (five runs), 1.12-1.21 on huge
  pages (two runs). The scale rows say how much of the process's memory is on huge pages.
- Each scale row's note also gives the floor: a plain jitted gather of the lines a step reads
  per key (flags, key and counter words, last access, the row) at 4,096 random slots, at
  that size vs 2^16. No hashing or probing is in it, so it is how much a step that reads
  those lines must grow from cache misses and TLB misses alone. Measured 2026-12-04 (quiet
  machine, 4 KiB pages): the floor grew 1.5-2.1x at 2^22 and 1.9-4.3x at 2^24; the step on
  the native walks, one thread (two runs), 1.60-1.73x and 2.27-2.43x (0.37 -> 0.87-0.91 ms);
  on the native walks split among XLA's two threads (three runs) 1.48-1.54x and 1.77-1.96x
  (0.43-0.49 -> 0.79-0.87 ms; in-process A/B, threads vs one: the same at 2^16, 8 % faster
  at 2^24); on the xla walks (``JAXOPS_NATIVE=0``, one run) 1.57x and 1.36x (1.16 -> 1.57
  ms). The native step is faster at every size and grows less than the floor, but its
  self-ratio misses 1.5 because its 2^16 step is cache-resident.
- insert throughput as the table fills: a batch of new keys inserted into a table at 87.5 %
  load, side by side with the same batch into a table at 50 % load (target: >= 1/4 of
  its keys/s, i.e. a time ratio <= 4). Every timed insert goes into a fresh copy of the
  pre-filled table, copied outside the timing, so each one starts from the same load
  (a batch is 1.6 % of a 2^18-slot table: without the copy the load would climb past 95 %).
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxops.hashtable as ht
from benchmarks.common import Result, against, compare, holds_keys, table_rows

BATCH, DIM = 4096, 4


def _distinct_keys(rng: np.random.Generator, n: int) -> np.ndarray:
    return (rng.choice(2**62, n, replace=False).astype(np.int64) - 2**61)


def _filled(size: int, keys: np.ndarray, chunk: int = 1 << 16) -> ht.HashTable:
    """A table of ``size`` slots holding ``keys``, inserted in chunks by a donated step;
    random rows, so a lookup's check sees whether each key got its own row."""
    table = ht.set_load_policy(ht.init_table(size, DIM, key=jax.random.key(size)),
                               max_load_factor=1.0)
    insert = jax.jit(lambda t, k: ht.lookup_or_insert(t, k)[0], donate_argnums=0)
    for lo in range(0, keys.size, chunk):
        table = insert(table, ht.words.as_words(keys[lo:lo + chunk], "benchmark", "keys"))
    return jax.block_until_ready(table)


#: Steps per timed sample of the scale case: one step is 1-3 ms, where a scheduler hiccup
#: on a shared machine moves a single-step sample by as much (measured: medians of single
#: steps at 2^24 vs 2^16 ranged 1.03-1.80 between runs); times are reported per step.
STEPS_PER_SAMPLE = 8


def _donated_stepper(table: ht.HashTable, keys: ht.words.Words64):
    """A callable running ``STEPS_PER_SAMPLE`` donated ``lookup_or_insert`` steps on its
    own table."""
    step = jax.jit(lambda t, k: ht.lookup_or_insert(t, k)[:2], donate_argnums=0)
    holder = [table]

    def run():
        start = time.process_time()
        for _ in range(STEPS_PER_SAMPLE):
            holder[0], rows = step(holder[0], keys)
        jax.block_until_ready(rows)
        run.cpu_s.append(time.process_time() - start)
        return rows

    run.cpu_s = []
    return run


def _cpu_note(ours, base, repeats: int) -> str:
    """The ratio in process CPU time (all threads) of the timed samples: on a shared machine
    it moves less than wall time, which counts the waits for a core too."""
    a, b = ours.cpu_s[-repeats:], base.cpu_s[-repeats:]
    return (f"CPU-time ratio median {statistics.median(a) / statistics.median(b):.2f}, "
            f"best {min(a) / min(b):.2f}")


def _per_step(res: Result) -> Result:
    n = STEPS_PER_SAMPLE
    return dataclasses.replace(res, ours_s=res.ours_s / n, peer_s=res.peer_s / n,
                               ours_best_s=res.ours_best_s / n, peer_best_s=res.peer_best_s / n)


def _huge_page_note() -> str:
    """How much anonymous memory of this process is on transparent huge pages (Linux)."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            kib = next(int(line.split()[1]) for line in f if line.startswith("AnonHugePages"))
    except (OSError, StopIteration, ValueError):
        return "huge pages: unknown"
    return f"{kib // 1024} MiB on huge pages"


def _line_values(slots, xp) -> list:
    """What the floor's arrays hold at ``slots`` (uint32, numpy or jax.numpy as ``xp``):
    different per slot and array, so a gather of the wrong slots shows."""
    return [(slots % 251).astype(xp.uint8), *(slots * xp.uint32(2 * k + 3) for k in range(5)),
            ((slots % 4096)[:, None] * DIM + xp.arange(DIM, dtype=xp.uint32)).astype(xp.float32)]


def _slot_lines(size: int, rng: np.random.Generator):
    """A jitted gather of what a present-key step reads per key, at random slots of arrays
    of ``size`` slots: flags, both key words, both counter words, last access, the row. No
    hashing, no probing: the memory hierarchy's own growth with the table's size. Returns
    the call and the values it must give (numpy)."""
    arrays = _line_values(jnp.arange(size, dtype=jnp.uint32), jnp)
    slots = rng.integers(0, size, BATCH).astype(np.uint32)
    gather = jax.jit(lambda arrs, i: [a[i] for a in arrs])
    dev_slots = jnp.asarray(slots.astype(np.int32))
    return (lambda: gather(arrays, dev_slots)), _line_values(slots, np)


def _floor_note(size: int, base_size: int, repeats: int) -> str:
    """The same size ratio for a plain gather of the slots' lines (:func:`_slot_lines`)."""
    rng = np.random.default_rng(2)
    (ours, want), (base, base_want) = _slot_lines(size, rng), _slot_lines(base_size, rng)
    res = compare("floor", ours, "floor", base, repeats=repeats,
                  check=against(want, base_want))
    return (f"floor: a plain gather of {BATCH} random slots' lines grows "
            f"{res.ours_s / res.peer_s:.2f}x (best {res.ours_best_s / res.peer_best_s:.2f}x)")


def _stepper(size: int, keys: np.ndarray, words: ht.words.Words64):
    """A donated stepper on a table of ``size`` slots holding ``keys``, and the rows its
    steps must give: read from the slot arrays on the host before the table is donated."""
    table = _filled(size, keys)
    want = table_rows(table, keys)[0]
    return _donated_stepper(table, words), want


def run_scale(sizes: list[int], repeats: int) -> list[Result]:
    """Present-key lookups at each size vs the same step at the first (smallest) size,
    each side's rows checked against the host's reading of its table."""
    rng = np.random.default_rng(0)
    keys = _distinct_keys(rng, BATCH)
    words = ht.words.as_words(keys, "benchmark", "keys")
    base, base_want = _stepper(sizes[0], keys, words)
    results = []
    for size in sizes[1:]:
        ours, want = _stepper(size, keys, words)
        results.append(_per_step(compare(
            f"lookup_or_insert {BATCH} present, 2^{size.bit_length() - 1}", ours,
            f"same at 2^{sizes[0].bit_length() - 1}", base, target=1.5, repeats=repeats,
            note=f"donated, jitted; ms per step, {STEPS_PER_SAMPLE} steps a sample; "
                 f"{_huge_page_note()}", check=against(want, base_want))))
        results[-1].note += "; " + _cpu_note(ours, base, repeats)
        results[-1].note += "; " + _floor_note(size, sizes[0], repeats)
        del ours
    return results


def run_fill(size: int, repeats: int) -> list[Result]:
    """New-key inserts at 87.5 % load vs the same new keys at 50 % load, each timed insert
    into a fresh copy of its pre-filled table."""
    rng = np.random.default_rng(1)
    crowded, half = int(size * 0.875), int(size * 0.5)
    keys = _distinct_keys(rng, crowded + BATCH)
    new = ht.words.as_words(keys[crowded:], "benchmark", "keys")  # in neither table
    filled = {"50": _filled(size, keys[:half]), "87.5": _filled(size, keys[:crowded])}
    tables = dict(filled)
    step = jax.jit(lambda t, k: ht.lookup_or_insert(t, k)[0], donate_argnums=0)

    def reset():  # untimed: the step donates its table, so each call gets a fresh copy
        tables.update({k: jax.tree.map(jnp.copy, t) for k, t in filled.items()})
        return tables

    def inserter(name):
        def run():
            tables[name] = step(tables[name], new)
            return tables[name]
        return run

    # each side holds exactly its pre-filled keys and the batch: nothing dropped at 87.5 %
    held = holds_keys(keys[:crowded + BATCH], np.concatenate([keys[:half], keys[crowded:]]))
    res = compare(f"insert {BATCH} new keys at 87.5% load, 2^{size.bit_length() - 1}",
                  inserter("87.5"), "same at 50% load", inserter("50"), target=4.0,
                  repeats=repeats, reset=reset, check=held)
    res.note = (f"{BATCH / res.ours_s / 1e6:.2f} M keys/s at 87.5% vs "
                f"{BATCH / res.peer_s / 1e6:.2f} M keys/s at 50% (target: >= 1/4); "
                "each insert into a fresh copy of the pre-filled table")
    return [res]


def run(quick: bool) -> list[Result]:
    """Quick: 2^16 vs 2^20 and the fill case at 2^18; full: up to 2^24, fill at 2^22."""
    repeats = 5 if quick else 15
    sizes = [2**16, 2**20] if quick else [2**16, 2**20, 2**22, 2**24]
    return run_scale(sizes, repeats) + run_fill(2**18 if quick else 2**22, repeats)
