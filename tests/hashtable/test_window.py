"""A key's window (``PROBE_LIMIT`` slots from its home slot): its edges against the
plain-Python reference, on the native walks and forced to xla.

The tables are genuine (every key inserted by ``lookup_or_insert``) and past the native
kernels' parallel thresholds (batches of more than 2 x 2,048 keys are split among threads):
a run of exactly one window of keys sharing a home slot (the window exactly full), the same
run wrapping past the table's end, a tombstone in a window's last slot, keys sharing the low
key word, and a full table (looked up, and compacted).
"""

import jax
import numpy as np
import pytest

import jaxops.hashtable as ht
from jaxops.hashtable._walks.probe import PROBE_LIMIT
from tests.helpers.hashtable_reference import WINDOW, RefTable, assert_same_table
from tests.helpers.walk_paths import PATHS
from tests.helpers.walk_paths import on_path as _run

SIZE = 1 << 15
BATCH = 4_800  # every batch of every test: one compile of each operation
_home = jax.jit(ht.cann.home_slot, static_argnums=2)


def test_the_reference_window_is_the_tables():
    assert WINDOW == PROBE_LIMIT


@pytest.fixture(scope="module")
def homes():
    """Candidate keys and their home slots in a table of SIZE slots."""
    cand = np.arange(1, 1 << 24, dtype=np.int64) * 7919
    return cand, np.asarray(_home(*ht.words.as_words(cand), SIZE))


def _homed(cand, home, slot: int, count: int, skip: int = 0) -> np.ndarray:
    found = cand[home == slot % SIZE][skip:skip + count]
    assert found.size == count, "not enough candidate keys for that home slot"
    return found


def _table():
    t = ht.init_table(SIZE, 1, initializer_mode="constant", constant_value=0.5)
    return ht.set_load_policy(t, max_load_factor=1.0)


def _filler(cand, home, n: int, seed: int) -> np.ndarray:
    """n keys at random homes, none homed in [SIZE - 600, SIZE) or [0, 600) or near the runs."""
    rng = np.random.default_rng(seed)
    keep = (home > 12_000) & (home < 30_000)
    return rng.choice(cand[keep], n, replace=False)


@pytest.mark.parametrize("path", PATHS)
def test_window_exactly_full_and_wrapping(homes, path):
    """A run of ``WINDOW`` keys homed at one slot fills that slot's window exactly: one more
    key of that home is unplaced and counted; a key homed one slot later takes the slot
    after the run (its window's last); one homed just before takes its home. The same run
    from ``SIZE - 100`` wraps past the table's end. A tombstone in a full window's last slot
    is the only place left: a key homed there takes it, and the evicted key, back after it,
is unplaced. All of it in one batch of
    more than 4,096 keys beside filler keys, then the keys looked up again."""
    cand, home = homes
    runs = [5_000, SIZE - 100]
    build, extra = [], []
    for a in runs:
        build.append(_homed(cand, home, a, WINDOW))
        extra += [_homed(cand, home, a, 1, skip=WINDOW), _homed(cand, home, a + 1, 1),
                  _homed(cand, home, a - 1, 1)]
    evicted = build[0][WINDOW - 1]  # the run at 5,000: its last key, in slot 5,000 + 255
    late = _homed(cand, home, 5_000, 1, skip=WINDOW + 1)
    batch = BATCH
    first = np.concatenate(build + [_filler(cand, home, batch - 2 * WINDOW, 1)])
    second = np.concatenate(extra + [_filler(cand, home, batch - len(extra), 2)])

    def calls(t, ops):
        out = []
        for name, keys in ops:
            if name == "insert":
                t, rows, info = ht.lookup_or_insert(t, keys)
                out.append((np.asarray(info.slots), int(info.unplaced), np.asarray(rows)))
            else:
                t = ht.evict(t, keys, const_val=0.25)
        return t, out

    ops = [("insert", first), ("insert", second), ("evict", np.array([evicted])),
           ("insert", np.concatenate([late, first[:batch - 1]]))]
    t, got = _run(path, lambda: calls(_table(), ops))
    ref = RefTable(np.full((SIZE, 1), 0.5, np.float32))
    want = []
    for name, keys in ops:
        if name == "insert":
            rows, info = ref.lookup_or_insert(keys)
            want.append((info["slots"], info["unplaced"], rows))
        else:
            ref.evict(keys, const_val=0.25)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g[0], w[0])
        assert g[1] == w[1]
        np.testing.assert_array_equal(g[2], w[2])
    assert_same_table(t, ref)
    slots = got[1][0]
    for r, a in enumerate(runs):  # what the docstring says, on the table itself
        unplaced, after, before = slots[3 * r: 3 * r + 3]
        assert unplaced == -1 and after == (a + WINDOW) % SIZE and before == (a - 1) % SIZE
    assert got[1][1] == 2
    # the tombstone is the only slot of its window; its own key, back after it, finds
    # the window full: unplaced too
    assert got[2][0][0] == 5_000 + WINDOW - 1 and got[2][1] == 1 and int(t.dropped) == 3


@pytest.fixture(scope="module")
def full(homes):
    """A table of SIZE slots, every one used (filled in batches of the size
    test_window_exactly_full_and_wrapping inserts: the same programs), its keys, how far
    each lies from its home slot, and new keys."""
    cand, home = homes
    pick = np.random.default_rng(3).choice(cand.size, 4 * SIZE, replace=False)
    keys, key_home = cand[pick], home[pick]
    t = _table()
    at = 0
    while int(t.live) < SIZE:
        assert at < keys.size - SIZE, "the table did not fill"
        t, _, _ = ht.lookup_or_insert(t, keys[at:at + BATCH])
        at += BATCH
    slots = np.asarray(ht.locate(t, keys[:at]))
    held = slots >= 0
    return t, keys[:at][held], (slots[held] - key_home[:at][held]) % SIZE, keys[at:]


@pytest.mark.parametrize("path", PATHS)
def test_full_table(full, path):
    """Every slot used: new keys are all unplaced and counted, present keys (the farthest
    from their homes too) are found, on lookup_or_insert, find and locate."""
    t, held, dist, new = full
    rng = np.random.default_rng(4)
    ref = RefTable.from_table(t)
    probe = np.concatenate([held[np.argsort(-dist)[:200]], rng.choice(held, 2_300),
                            new[:2_300]])  # the farthest keys, others, new ones
    rng.shuffle(probe)

    def calls():
        located = np.asarray(ht.locate(t, probe))
        rows, found = ht.find(t, probe, default_value=-1.0)
        after, got, info = ht.lookup_or_insert(t, probe)
        return located, np.asarray(rows), np.asarray(found), np.asarray(got), info, after

    located, rows, found, got, info, after = _run(path, calls)
    want_rows, want_found = ref.find(probe, default_value=-1.0)
    want_got, want_info = ref.lookup_or_insert(probe)
    np.testing.assert_array_equal(located, [ref.live_slot(int(k)) for k in probe])
    np.testing.assert_array_equal(rows, want_rows)
    np.testing.assert_array_equal(found, want_found)
    np.testing.assert_array_equal(got, want_got)
    np.testing.assert_array_equal(np.asarray(info.slots), want_info["slots"])
    assert int(info.unplaced) == want_info["unplaced"] == 2_300 and int(info.inserted) == 0
    assert_same_table(after, ref)
    assert WINDOW // 2 < dist.max() < WINDOW  # walks went far, never past the window


@pytest.mark.parametrize("path", PATHS)
def test_compacting_a_full_table_keeps_every_key(full, path):
    """A full table with tombstones, rebuilt at its size: every live key comes back (from
    slot 0 on, keys whose probe wraps past the table's end pushed others out of their
    windows), slot for slot as the reference rebuilds it."""
    t, held, _, _ = full
    t = ht.evict(t, held[::97])
    ref = RefTable.from_table(t)
    back = _run(path, lambda: ht.compact(t))
    want = ref.resize(np.full((SIZE, 1), 0.5, np.float32))
    assert_same_table(back, want)
    assert int(back.live) == int(t.live) and int(back.dropped) == int(t.dropped)


@pytest.mark.parametrize("path", PATHS[:1])
def test_keys_sharing_the_low_word(path):
    """Keys equal in their low 32 bits, crowded into one table: a walk passes keys that
    match only the low word (the native walk's sixteen-slot steps; the xla walk's low-word
    matches are checked in test_differential) and finds its own."""
    lo = np.arange(40, dtype=np.int64)
    keys = (lo[None, :] + (np.arange(1, 60, dtype=np.int64)[:, None] << 32)).reshape(-1)
    size = 2_048
    held, probe = keys[:1_900], np.concatenate([keys[::5], keys[1_900:2_300]])

    def calls():
        t = ht.set_load_policy(ht.init_table(size, 1, initializer_mode="constant"),
                               max_load_factor=1.0)
        t, _, info = ht.lookup_or_insert(t, held)
        t = ht.evict(t, held[::7])
        return t, np.asarray(info.slots), np.asarray(ht.locate(t, probe))

    t, slots, located = _run(path, calls)
    ref = RefTable(np.zeros((size, 1), np.float32))
    _, info = ref.lookup_or_insert(held)
    ref.evict(held[::7])
    np.testing.assert_array_equal(slots, info["slots"])
    np.testing.assert_array_equal(located, [ref.live_slot(int(k)) for k in probe])
    assert_same_table(t, ref)
