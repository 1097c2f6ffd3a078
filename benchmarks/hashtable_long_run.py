"""A long run: 10,000 evict_if calls with fresh thresholds compile a few times, RSS flat.

The pattern ``ht.evict_if(t, ht.not_seen_for(1000))`` (docs/embeddings.md) each step once compiled a
new program per call (about 0.15 s, 18 memory maps and 2 MB each) until the process hit
``vm.max_map_count`` after about 3,600 calls. Predicates are data now: their thresholds are
traced. This runs the pattern ``JAXOPS_BENCH_LONG_CALLS`` times (default 10,000; 1,000 with
``--quick``) in two forms, each call with a threshold never seen before:

- ``eager``: ``evict_if(t, not_seen_for(k))`` and ``evict_if(t, counter_below(k % 3))``
  between eager inserts, as a script would;
- ``jitted``: a donated, jitted training step (insert, evict by ``not_seen_for(k)`` with ``k``
  an argument) in a Python loop, as a training run would.

Each form is two rows: the compiles during the calls against a bound of 3 (the ratio is
compiles / 3; the "ms" columns read counts), and the growth of resident memory from the
end of the first tenth of the calls to the end (after the allocator reached its steady
state) against 32 MB (the columns read MB).
"""

from __future__ import annotations

import gc
import os

import jax
import jax.numpy as jnp
import numpy as np

import jaxops.hashtable as ht
from benchmarks.common import Result

__all__ = ["run"]

_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_COMPILE_BOUND = 3
_RSS_BOUND_MB = 32


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


class _Compiles:
    """Counts XLA compiles while active (JAX's compile-duration events)."""

    def __init__(self):
        self.count, self.active = 0, False
        jax.monitoring.register_event_duration_secs_listener(self._seen)

    def _seen(self, event, duration, **kwargs):
        if self.active and event == _COMPILE_EVENT:
            self.count += 1


def _loop(calls: int, compiles: _Compiles, table, call) -> tuple[int, float, int]:
    """Runs ``table = call(table, k)`` for ``k < calls``: the compiles during the loop, the
    resident growth from the end of its first tenth, and the live keys at the end."""
    compiles.count, compiles.active = 0, True
    early = None
    for k in range(calls):
        table = call(table, k)
        if k == calls // 10:
            jax.block_until_ready(table)
            gc.collect()
            early = _rss_mb()
    jax.block_until_ready(table)
    compiles.active = False
    gc.collect()
    return compiles.count, _rss_mb() - early, int(table.live)


def _eager(calls: int, compiles: _Compiles) -> tuple[int, float, int]:
    table = ht.init_table(1 << 12, 8, initializer_mode="constant")
    keys = np.arange(256, dtype=np.int64)
    table, _, _ = ht.lookup_or_insert(table, keys)  # warm: every program compiled once
    table = ht.evict_if(ht.evict_if(table, ht.not_seen_for(1)), ht.counter_below(1))

    def call(table, k):
        if k % 10 == 0:
            table, _, _ = ht.lookup_or_insert(table, (keys + k) % 2048)
        table = ht.evict_if(table, ht.not_seen_for(1000 + k))
        return ht.evict_if(table, ht.counter_below(k % 3))

    return _loop(calls, compiles, table, call)


def _jitted(calls: int, compiles: _Compiles) -> tuple[int, float, int]:
    def step(table, keys, horizon):
        table, rows, _ = ht.lookup_or_insert(table, keys)
        table = ht.evict_if(table, ht.not_seen_for(horizon))
        return table, jnp.sum(rows)

    step = jax.jit(step, donate_argnums=0)
    table = ht.init_table(1 << 12, 8, initializer_mode="constant", key_dtype=np.int32)
    keys = jnp.arange(256, dtype=jnp.int32)
    table, _ = step(table, (keys + 1) % 2048, jnp.uint32(1))  # warm: the loop's programs
    return _loop(calls, compiles, table,
                 lambda table, k: step(table, (keys + k) % 2048, jnp.uint32(100 + k % 900))[0])


def run(quick: bool) -> list[Result]:
    calls = int(os.environ.get("JAXOPS_BENCH_LONG_CALLS") or (1_000 if quick else 10_000))
    compiles = _Compiles()
    results = []
    for form, fn in (("eager", _eager), ("jitted", _jitted)):
        count, growth, live = fn(calls, compiles)
        print(f"  {form}: {calls} calls, {count} compiles, RSS +{growth:.1f} MB after the "
              f"first tenth, {live} keys live", flush=True)
        # The table's "ms" columns show seconds x 1000: counts and MB are given / 1000.
        results.append(Result(f"evict_if x{calls} {form}: compiles", count / 1000, "bound",
                              _COMPILE_BOUND / 1000, 1.0, note="columns read compiles"))
        results.append(Result(f"evict_if x{calls} {form}: RSS growth", max(growth, 0.0) / 1000,
                              "bound", _RSS_BOUND_MB / 1000, 1.0, note="columns read MB"))
    return results
