"""The native hash-table walks (C++ through the XLA FFI) equal the xla walks bit for bit.

Each test runs the same random sequence of table operations twice, once with the walks on
the native path and once forced to xla (``use_backend("xla")``), and compares every output
and every table array. Walk choice is made when a function is traced, so the two runs
trace under different default-device settings (``_both_paths``, through
``tests/helpers/walk_paths.py``). Tables are small (64
slots) and nearly full, batches hold duplicates and keys evicted before, so tombstone
reuse, revival and unplaced keys occur.
(Where the library is built, the other hash-table tests, against the plain-Python model,
run on the native walks too.)
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxops
import jaxops.hashtable as ht
from jaxops import native
from jaxops.core import walk_table
from jaxops.core.backend_table import use_backend
from tests.helpers.walk_paths import on_path

pytestmark = pytest.mark.skipif(not native.available(),
                                reason=f"native kernels unavailable: {native.why_unavailable()}")

SLOTS, DIM, BATCH = 64, 2, 24


def _sequence(seed: int, key_dtype, x64: bool) -> list:
    """Outputs of a random sequence of operations, the final table included."""
    rng = np.random.default_rng(seed)
    universe = rng.choice(2**40, 120, replace=False).astype(np.int64) - 2**39
    if key_dtype == np.uint64:
        universe = universe.astype(np.uint64) + np.uint64(2**63)  # keys >= 2**63 too
    t = ht.init_table(SLOTS, DIM, initializer_mode="constant", constant_value=0.5,
                      key_dtype=key_dtype)
    t = ht.set_load_policy(t, max_load_factor=1.0)
    out = []
    for step in range(6):
        keys = rng.choice(universe, BATCH)  # with duplicates
        t, rows, info = ht.lookup_or_insert(t, keys)
        out += [rows, info]
        t = ht.evict(t, rng.choice(universe, 6))
        out.append(ht.find(t, rng.choice(universe, BATCH)))  # find_rows; the others find_slots
        if step == 2:
            t, info = ht.import_(t, rng.choice(universe, 8), np.arange(8, dtype=np.uint64),
                                 np.arange(8) % 2, np.ones((8, DIM), np.float32))
            out.append(info)
    out.append(t)
    return out


def _both_paths(fn):
    """``fn()`` on the native walks, then forced to xla, each traced for its path
    (:func:`tests.helpers.walk_paths.on_path`)."""
    return tuple(jax.device_get(on_path(path, fn)) for path in ("native", "xla"))


@pytest.mark.parametrize("x64, key_dtype", [(False, np.int64), (True, np.uint64)])
def test_random_sequences_equal_the_xla_walks(x64, key_dtype):
    with jax.enable_x64(x64):
        got, want = _both_paths(lambda: _sequence(int(x64), key_dtype, x64))
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    table = got[-1]
    # The sequences reach the cases the walks must agree on: a nearly full table, keys
    # that found no slot, tombstones.
    assert int(table.live) >= SLOTS - 8 and int(table.dropped) > 0
    infos = [x for x in got if isinstance(x, ht.LookupInfo)]
    assert sum(int(i.unplaced) for i in infos) > 0


def test_walks_run_natively_inside_jit_and_in_place():
    t = ht.init_table(SLOTS, DIM, initializer_mode="constant")
    words = ht.words.as_words(np.arange(BATCH, dtype=np.int64), "test", "keys")
    step = jax.jit(lambda t, k: ht.lookup_or_insert(t, k)[:2], donate_argnums=0)
    text = step.lower(t, words).as_text()
    for target in ("jaxops_hash_find", "jaxops_hash_first", "jaxops_hash_place",
                   "jaxops_hash_rows"):
        assert target in text
    # The flags go through place in place: the FFI call aliases its flags input and output,
    # and the compiled step copies no array of the table's size.
    assert "output_operand_aliases" in text
    compiled = step.lower(t, words).compile()
    copies = [line for line in compiled.as_text().splitlines()
              if re.search(rf"\[{SLOTS}[,\]].* copy(-start)?\(", line)]
    assert not copies, copies
    t, rows = compiled(t, words)
    assert int(t.live) == BATCH and rows.shape == (BATCH, DIM)


def test_explain_names_the_walk_path(monkeypatch):
    said = str(jaxops.backends.explain("EmbeddingHashTableLookupOrInsert"))
    assert "Hash probing: native" in said
    with use_backend("xla"):
        said = str(jaxops.backends.explain("EmbeddingHashTableLookupOrInsert"))
    assert "Hash probing: xla (use_backend asks for 'xla')" in said
    monkeypatch.setenv(native.ENV_VAR, "0")
    assert walk_table.walk_path() == ("xla", f"the native backend is unavailable: "
                                      f"{native.ENV_VAR}=0 forces the xla kernels")
    assert walk_table.walk_kernel("find_slots") is None
    assert "Hash probing" not in str(jaxops.backends.explain("NonZero"))


def test_find_under_vmap_equals_xla():
    t = ht.init_table(SLOTS, DIM, initializer_mode="constant", constant_value=1.0,
                      key_dtype=np.int32)  # JAX int32 ids: a table of 32-bit ids
    t, _, _ = ht.lookup_or_insert(t, np.arange(0, 40, 2, dtype=np.int64))
    batches = jnp.arange(24, dtype=jnp.int32).reshape(3, 8)
    got, want = _both_paths(lambda: jax.vmap(lambda k: ht.find(t, k))(batches))
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0], want[0])
    assert got[1].sum() == 12


def test_batches_split_among_threads_equal_the_xla_walks():
    """Batches of thousands of keys: the native walks split them among XLA's intra-op
    threads (find and find_rows by home region), hash eight keys at a time (AVX2, the
    scalar loop for the rest: odd batch sizes) and test four slots at once. A table 90 %
    full makes long walks and walks that wrap past the last slot."""
    slots = 8192

    def run():
        rng = np.random.default_rng(7)
        universe = rng.choice(2**40, 12000, replace=False).astype(np.int64) - 2**39
        t = ht.init_table(slots, DIM, initializer_mode="constant", constant_value=0.5)
        t = ht.set_load_policy(t, max_load_factor=1.0)
        out = []
        for batch in (6001, 6001):  # one compile a path
            t, rows, info = ht.lookup_or_insert(t, rng.choice(universe, batch))
            out += [rows, info]
        t = ht.evict(t, rng.choice(universe, 700))
        out.append(ht.find(t, rng.choice(universe, 6003)))
        out.append(ht.locate(t, rng.choice(universe, 4097)))
        return out + [t]

    got, want = _both_paths(run)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    table = got[-1]
    assert int(table.live) > 0.8 * slots
    found = got[-3][1]
    assert 0 < int(found.sum()) < found.size  # present and absent keys both looked up


def test_find_of_a_crowded_batch_equals_the_xla_walks():
    """find_rows puts each key in a bucket of its home region with room for an even share
    of the batch; a batch crowding one region (here a key repeated 2,500 times in 6,000)
    overflows that room, and the buckets are then counted and laid end to end. Both ways
    give the xla walks' answer."""
    slots = 1 << 16

    def run():
        rng = np.random.default_rng(11)
        universe = rng.choice(2**40, 40000, replace=False).astype(np.int64) - 2**39
        t = ht.init_table(slots, DIM, initializer_mode="constant", constant_value=0.5)
        t, _, _ = ht.lookup_or_insert(t, universe[:30000])
        spread = rng.permutation(np.concatenate([np.repeat(universe[5], 2500),
                                                 rng.choice(universe, 3500)]))
        return [ht.find(t, spread), ht.find(t, universe[::6][:6000])]  # one compile a path

    got, want = _both_paths(run)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    found = got[0][1]
    assert 2500 < int(found.sum()) < found.size


def test_walks_stop_at_the_probe_limit_and_count_the_key():
    """A run of used slots longer than the probe bound: a key whose home lies in it is not
    placed even though free slots lie beyond (counted, never silent), a key beyond the run
    still is, and the native and xla walks agree; a full table costs a bounded walk."""
    from jaxops.hashtable._walks.probe import PROBE_LIMIT

    size = 2 * PROBE_LIMIT
    run = PROBE_LIMIT + 64  # slots [0, run) hold keys 10**9 + slot, homes ignored
    t = ht.init_table(size, 1, initializer_mode="constant")
    used = np.arange(size) < run
    t = t.replace(key_lo=jnp.where(used, jnp.arange(size, dtype=jnp.uint32) + 10**9,
                                   t.key_lo), key_hi=jnp.where(used, 0, t.key_hi),
                  flags=jnp.where(used, jnp.uint8(ht.cann.VALID), t.flags),
                  live=jnp.int32(run))
    t = ht.set_load_policy(t, max_load_factor=1.0)
    cand = np.arange(200_000, dtype=np.int64)
    home = np.asarray(ht.cann.home_slot(*ht.words.as_words(cand), size))
    inside = cand[home < 8][:1]  # walks from the run's start: past PROBE_LIMIT used slots
    outside = cand[(home > run + 10) & (home < size - 10)][:1]
    keys = np.concatenate([inside, outside])

    def insert():
        new, _, info = jax.jit(ht.lookup_or_insert)(t, ht.words.as_words(keys))
        return info.slots, info.unplaced, new.dropped.lo

    got, want = _both_paths(insert)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    slots, unplaced, dropped = got
    assert slots[0] == -1 and slots[1] >= run and int(unplaced) == 1 == int(dropped)


def test_a_loaded_table_with_a_key_beyond_the_probe_bound_is_refused():
    from jaxops.hashtable._walks.probe import PROBE_LIMIT
    from jaxops.hashtable._walks.probe_check import ProbeCheck

    size, run = 2 * PROBE_LIMIT, PROBE_LIMIT + 2
    flags = (np.arange(size) < run).astype(np.uint8)
    keys = np.arange(size, dtype=np.uint32)
    check = ProbeCheck(size)  # every key's home is slot 0: the last ones lie too far
    with pytest.raises(ValueError, match=rf"slot {PROBE_LIMIT} lies {PROBE_LIMIT} slots past "
                                         rf"its home slot, beyond its window"):
        check.feed(0, keys, np.zeros(size, np.uint32), flags, home=np.zeros(size, np.int64))
