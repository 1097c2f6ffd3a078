"""A table as big as the machine: peak memory of create, fill, save, load, export vs bounds.

At full scale a 2^26 x 64 float32 table (17 GiB of rows) on a 24 GiB machine, reporting
time and peak memory per stage. ``save`` / ``load`` are the Orbax checkpoint (``ht.save``,
``ht.load`` into an abstract target of the same layout).

Run ``python -m benchmarks [--quick] --only hashtable_memory``. The full 17 GiB run never
starts by default: the slot count is ``2^26 * JAXOPS_BENCH_MEMORY_SCALE`` (an environment
variable, as the runner has no per-module options; default 1/256 with ``--quick``, 2^18
slots, 68 MiB, else 1/32, 2^21 slots, 546 MiB; ``JAXOPS_BENCH_MEMORY_SCALE=1`` for the
full table), the checkpoint goes to ``JAXOPS_BENCH_MEMORY_DIR`` (default: the temp dir).
Each stage reports its
wall time and its peak extra resident memory (VmHWM after the stage minus VmRSS before it;
the peak is reset through ``/proc/self/clear_refs`` on Linux), beside the table's bytes:
issue 28 allows save and load ``10 %`` of the table plus one checkpoint chunk
(:data:`jaxops.hashtable.checkpoint.CHUNK_BYTES`; load: plus the new table
itself), issue 14 export ``256 MiB + 10 %`` and random init the table alone. The checkpoint
is deleted at the end.

Stages: ``create`` (``init_table`` random, on the device in chunks), ``fill`` (jitted
``lookup_or_insert`` of new keys in batches with the table donated, to half the slots), ``save``, ``load`` (after the filled table is dropped), ``export_chunks`` (every
entry to the host, chunk by chunk, consumed and dropped). Each bounded stage is one row:
its peak extra memory against its bound (ratio <= 1); the row's "ms" columns read MB
(bytes / 1e6), its note gives the stage's seconds.
"""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
import time
from collections.abc import Callable

import jax
import numpy as np

import jaxops.hashtable as ht
from benchmarks.common import Result

__all__ = ["run"]

_FULL_SLOTS = 1 << 26


def _status(field: str) -> int:
    """A byte count from /proc/self/status (0 where there is none)."""
    try:
        with open("/proc/self/status") as f:
            return next((int(line.split()[1]) << 10 for line in f if line.startswith(field)), 0)
    except OSError:
        return 0


def _stage(name: str, fn: Callable, rows: list) -> object:
    gc.collect()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # peak := current
    except OSError:
        pass
    base = _status("VmRSS:")
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn())
    seconds = time.perf_counter() - t0
    rows.append({"stage": name, "seconds": round(seconds, 2), "rss_before": base,
                 "peak": _status("VmHWM:"), "peak_extra": _status("VmHWM:") - base})
    print(f"  {name:14s} {seconds:9.2f} s   peak extra {rows[-1]['peak_extra'] / 2**30:7.2f} GiB"
          f"   peak {rows[-1]['peak'] / 2**30:7.2f} GiB", flush=True)
    return out


def _warm_up(dim: int, directory: str | None) -> None:
    """Every stage once on a small table (two checkpoint chunks: a restore's programs are
    those of the big table's chunks), so that the process-wide first-compile memory (the
    XLA backend's own) is not charged to the first stage measured."""
    small = ht.init_table(2 * ht.checkpoint.CHUNK_BYTES // ht.slot_bytes(dim), dim,
                          key=jax.random.key(1))
    small, _, _ = ht.lookup_or_insert(small, np.arange(8, dtype=np.int64))
    path = tempfile.mkdtemp(dir=directory)
    try:
        ht.save(small, path, force=True)
        list(ht.export_chunks(ht.load(path))[1])
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _measure(scale: float = 1.0, dim: int = 64, load: float = 0.5, batch: int = 1 << 20,
             directory: str | None = None) -> dict:
    """Runs the five stages on ``int(2^26 * scale)`` slots; returns the measurements."""
    size = max(1024, int(_FULL_SLOTS * scale))
    rows: list[dict] = []
    _warm_up(dim, directory)
    table_bytes = size * (17 + 4 * dim)
    print(f"hashtable_memory: {size} slots x {dim} float32 = {table_bytes / 2**30:.2f} GiB, "
          f"fill to {load:.0%} in batches of {batch}", flush=True)
    table = _stage("create", lambda: ht.init_table(size, dim, key=jax.random.key(0)), rows)

    step = jax.jit(lambda t, w: (lambda r: (r[0], r[2].unplaced))(ht.lookup_or_insert(t, w)),
                   donate_argnums=0)
    rng = np.random.default_rng(0)
    target = int(size * load)
    unplaced = 0

    def fill():
        nonlocal table, unplaced
        done = 0
        while done < target:
            n = min(batch, target - done)
            keys = rng.integers(-2**62, 2**62, n, dtype=np.int64)
            if n < batch:  # one compiled shape: pad with repeats of the batch's first key
                keys = np.concatenate([keys, np.full(batch - n, keys[0])])
            table, lost = step(table, ht.words.as_words(keys, "benchmark", "keys"))
            unplaced += int(lost)
            done += n
        return table

    _stage("fill", fill, rows)
    live = int(table.live)
    path = os.path.join(directory or tempfile.gettempdir(), f"hashtable_memory_{os.getpid()}")
    try:
        _stage("save", lambda: ht.save(table, path), rows)
        file_bytes = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path)
                         for f in fs)
        del table
        table = _stage("load", lambda: ht.load(path), rows)
    finally:
        shutil.rmtree(path, ignore_errors=True)
    exported = _stage("export_chunks", lambda: sum(
        len(c.keys) for c in ht.export_chunks(table, export_mode="all")[1]), rows)
    allowed = (256 << 20) + table_bytes // 10
    return {"slots": size, "dim": dim, "table_bytes": table_bytes, "file_bytes": file_bytes,
            "live": live, "loaded_live": int(table.live), "exported": int(exported),
            "unplaced": unplaced, "allowed_extra": allowed,
            "checkpoint_extra": table_bytes // 10 + ht.checkpoint.CHUNK_BYTES, "stages": rows}


def run(quick: bool) -> list[Result]:
    """The stages at ``JAXOPS_BENCH_MEMORY_SCALE`` (small by default; 1 for 17 GiB), one
    Result per bounded stage: peak extra memory vs its bound, as bytes / 1e9."""
    scale = float(os.environ.get("JAXOPS_BENCH_MEMORY_SCALE") or (1 / 256 if quick else 1 / 32))
    size = max(1024, int(_FULL_SLOTS * scale))
    result = _measure(scale, batch=min(1 << 20, max(1024, size // 16)),
                      directory=os.environ.get("JAXOPS_BENCH_MEMORY_DIR") or None)
    if not result["loaded_live"] == result["live"] == result["exported"]:
        raise AssertionError(f"hashtable_memory: {result['live']} live entries, "
                             f"{result['loaded_live']} after load, {result['exported']} exported")
    limits = {"create": result["table_bytes"] * 11 // 10 + (64 << 20),
              "save": result["checkpoint_extra"], "export_chunks": result["allowed_extra"],
              "load": result["table_bytes"] + result["checkpoint_extra"]}
    tag = f"2^{size.bit_length() - 1}x{result['dim']}"
    seconds = {r["stage"]: r["seconds"] for r in result["stages"]}
    return [Result(f"memory {r['stage']} peak extra MB, {tag}", r["peak_extra"] / 1e9,
                   "bound MB", limits[r["stage"]] / 1e9, 1.0,
                   f"{r['seconds']} s (fill {seconds['fill']} s, {result['unplaced']} "
                   f"unplaced); ms columns read MB")
            for r in result["stages"] if r["stage"] in limits]
