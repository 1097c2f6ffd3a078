"""Long random sequences of every table operation against the sequential reference.

Small tables (24 slots) so that probe chains meet, batches collide, tombstones come back
and the table fills up; keys mix small, negative and full 64-bit values. After every step
the whole table (per slot: key, counter, flags, row) and the live / not-exported / dropped
counts must equal the reference's; every returned value is compared too.
"""

import chex
import jax
import numpy as np
import pytest


import jaxops
import jaxops.hashtable as ht
from tests.helpers.hashtable_reference import RefAdamW, RefTable, assert_same_table

SIZE, DIM = 24, 3
LOOKUP_CONFIGS = [
    {},
    {"filter_mode": "counter", "filter_freq": 3},
    {"filter_key_flag": True, "filter_key": 5, "default_value": -2.0},
    {"filter_key_flag": True, "filter_key": 5, "default_key_or_value": True, "default_key": 2**40 + 7},
]
EXPORT_CONFIGS = [("all", False), ("new", False), ("all", True), ("new", True)]


def _universe(rng):
    return np.concatenate([np.arange(12), [-1, -7, 2**40 + 7, -(2**62), 2**63 - 1],
                           rng.integers(-2**63, 2**63 - 1, 8, dtype=np.int64)]).astype(np.int64)


def _run_sequence(seed: int, steps: int):
    rng = np.random.default_rng(seed)
    universe = _universe(rng)
    init_values = rng.standard_normal((SIZE, DIM)).astype(np.float32)
    table = ht.init_table(SIZE, DIM, sampled_values=init_values)
    table = ht.set_load_policy(table, max_load_factor=1.0)  # fills up: unplaced keys counted
    ref = RefTable(init_values)
    state, ref_state = ht.adam_w_init(table), RefAdamW(ref)
    touched_by_float_math = False
    for step in range(steps):
        kind = rng.choice(["lookup", "lookup", "find", "export", "import", "evict", "adamw"])
        keys = rng.choice(universe, 6)
        if kind == "lookup":
            cfg = LOOKUP_CONFIGS[rng.integers(len(LOOKUP_CONFIGS))]
            table, rows, info = ht.lookup_or_insert(table, keys, **cfg)
            want_rows, want = ref.lookup_or_insert(keys, **cfg)
            chex.assert_trees_all_equal(
                {k: np.asarray(getattr(info, k)) for k in want}, want)
            chex.assert_trees_all_close(np.asarray(rows), want_rows, rtol=1e-6)
        elif kind == "find":
            rows, found = ht.find(table, keys, default_value=0.5)
            want_rows, want_found = ref.find(keys, default_value=0.5)
            chex.assert_trees_all_equal(np.asarray(found), want_found)
            chex.assert_trees_all_close(np.asarray(rows), want_rows, rtol=1e-6)
        elif kind == "export":
            mode, filtered = EXPORT_CONFIGS[rng.integers(len(EXPORT_CONFIGS))]
            table, *outs = ht.export(table, export_mode=mode, filtered_export_flag=filtered)
            got = jaxops.refresh(dict(zip(["keys", "counters", "filter_flags", "values"], outs)))
            got["keys"] = ht.words.to_host_int64(got["keys"])
            got["counters"] = ht.words.to_host_int64(got["counters"], signed=False)
            want = ref.export(mode, filtered)
            got_values, want_values = got.pop("values"), want.pop("values")
            chex.assert_trees_all_equal(got, want)
            chex.assert_trees_all_close(got_values, want_values, rtol=1e-6)
        elif kind == "import":
            keys = keys[:4]
            counters = rng.integers(0, 2**64 - 1, 4, dtype=np.uint64)
            flags = rng.integers(0, 2, 4).astype(np.uint8)
            values = rng.standard_normal((4, DIM)).astype(np.float32)
            table, info = ht.import_(table, keys, counters, flags, values)
            want = ref.import_(keys, counters, flags, values)
            chex.assert_trees_all_equal({"inserted": int(info.inserted),
                                         "unplaced": int(info.unplaced)}, want)
        elif kind == "evict":
            keys = keys[:3]
            if rng.random() < 0.5:
                table = ht.evict(table, keys, const_val=0.25)
                ref.evict(keys, const_val=0.25)
            else:
                sampled = rng.standard_normal((3, DIM)).astype(np.float32)
                table = ht.evict(table, keys, init_mode="random", sampled_values=sampled)
                ref.evict(keys, init_mode="random", sampled_values=sampled)
        else:
            keys = keys[:5]
            grads = rng.standard_normal((5, DIM)).astype(np.float32)
            table, state = ht.apply_adam_w(table, state, keys, grads, lr=0.01, weight_decay=0.1)
            ref_state.apply(ref, keys, grads, lr=0.01, weight_decay=0.1)
            assert int(state.skipped) == ref_state.skipped
            chex.assert_trees_all_close(np.asarray(state.m), ref_state.m, rtol=1e-5, atol=1e-7)
            touched_by_float_math = True
        assert_same_table(table, ref, rtol=1e-5 if touched_by_float_math else 0.0)
    return ref


@pytest.mark.parametrize("seed", [0, 1])
def test_random_sequences_match_reference(seed):
    ref = _run_sequence(seed, steps=120)
    # The sequence must have exercised the interesting states, or it proves little.
    flags = np.array(ref.flags)
    assert (flags & ht.cann.EVICTED).any() and (flags & ht.cann.EXPORT).any() and (flags & ht.cann.FILTER).any()


def test_random_sequence_with_x64():
    with jax.enable_x64(True):
        _run_sequence(7, steps=40)


@pytest.mark.parametrize("size,load", [(8, 3.0), (64, 0.9)])
def test_batches_into_a_nearly_full_table(size, load):
    """Many new keys at once, colliding inside the batch; fills up and overflows."""
    rng = np.random.default_rng(size)
    init = rng.standard_normal((size, 2)).astype(np.float32)
    table, ref = ht.init_table(size, 2, sampled_values=init), RefTable(init)
    table = ht.set_load_policy(table, max_load_factor=1.0)
    for _ in range(3):
        keys = rng.integers(-50, 50, int(size * load / 3) + 1).astype(np.int64)
        table, rows, info = ht.lookup_or_insert(table, keys)
        want_rows, want = ref.lookup_or_insert(keys)
        chex.assert_trees_all_equal(np.asarray(info.slots), want["slots"])
        chex.assert_trees_all_equal(np.asarray(rows), want_rows)
        assert int(info.unplaced) == want["unplaced"]
        assert_same_table(table, ref)
    if load > 1:
        assert ref.dropped > 0 and ref.live == size


def test_large_batch_uses_compacted_stages():
    """A batch far above the lane-stage threshold (512) still matches the reference."""
    rng = np.random.default_rng(3)
    size = 3000
    init = np.zeros((size, 1), np.float32)
    table, ref = ht.init_table(size, 1, sampled_values=init), RefTable(init)
    keys = rng.integers(0, 2500, 4000).astype(np.int64)
    table, _, info = ht.lookup_or_insert(table, keys, filter_mode="counter", filter_freq=2)
    _, want = ref.lookup_or_insert(keys, filter_mode="counter", filter_freq=2)
    chex.assert_trees_all_equal(np.asarray(info.slots), want["slots"])
    chex.assert_trees_all_equal(np.asarray(info.admitted), want["admitted"])
    assert_same_table(table, ref)


def test_keys_sharing_the_low_word():
    """The walk compares low words first; keys equal there must still be told apart."""
    keys = (np.arange(30, dtype=np.int64) << 32) | 5
    init = np.zeros((SIZE * 2, 1), np.float32)
    table, ref = ht.init_table(SIZE * 2, 1, sampled_values=init), RefTable(init)
    table, _, info = ht.lookup_or_insert(table, keys)
    _, want = ref.lookup_or_insert(keys)
    chex.assert_trees_all_equal(np.asarray(info.slots), want["slots"])
    probe = np.concatenate([keys, keys + (100 << 32)])
    chex.assert_trees_all_equal(np.asarray(ht.find(table, probe)[1]), ref.find(probe)[1])
    assert_same_table(table, ref)


def test_keys_that_look_empty_in_the_low_word():
    """Keys whose low word is the empty key's (0xFFFFFFFF), and the key -1 itself, are
    inserted, found and walked past like any other key."""
    keys = np.concatenate([(np.arange(30, dtype=np.int64) << 32) | 0xFFFFFFFF, [-1]])
    init = np.zeros((SIZE * 2, 1), np.float32)
    table, ref = ht.init_table(SIZE * 2, 1, sampled_values=init), RefTable(init)
    table, _, info = ht.lookup_or_insert(table, keys[::2])
    _, want = ref.lookup_or_insert(keys[::2])
    chex.assert_trees_all_equal(np.asarray(info.slots), want["slots"])
    chex.assert_trees_all_equal(np.asarray(ht.find(table, keys)[1]), ref.find(keys)[1])
    table, _, info = ht.lookup_or_insert(table, keys)
    _, want = ref.lookup_or_insert(keys)
    chex.assert_trees_all_equal(np.asarray(info.slots), want["slots"])
    assert_same_table(table, ref)


def test_crowded_table_with_a_large_batch():
    """At load 0.9 most keys walk far past the first window, in every lane stage."""
    rng = np.random.default_rng(11)
    size, n = 10_000, 9_000
    init = np.zeros((size, 1), np.float32)
    table, ref = ht.init_table(size, 1, sampled_values=init), RefTable(init)
    keys = rng.choice(2**40, n, replace=False).astype(np.int64)
    table, _, info = ht.lookup_or_insert(table, keys)
    _, want = ref.lookup_or_insert(keys)
    chex.assert_trees_all_equal(np.asarray(info.slots), want["slots"])
    assert_same_table(table, ref)
    probe = np.concatenate([rng.permutation(keys), rng.choice(2**40, n) + 2**41])
    chex.assert_trees_all_equal(np.asarray(ht.locate(table, probe)),
                                np.array([ref.live_slot(int(k)) for k in probe]))
