"""Tombstone reuse in batch order, scored eviction (evict_lowest, evict_if, the "evict"
load policy) and donation of the table to eager calls."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxops.hashtable as ht
from jaxops.errors import OpArgumentError
from tests.helpers.hashtable_reference import RefTable, assert_same_table, key_hash

SIZE, DIM = 8, 2


def _rows(size=SIZE):
    return np.arange(size * DIM, dtype=np.float32).reshape(size, DIM)


def _pair(size=SIZE):
    """Both sides of a comparison: a table without load limit and its reference."""
    t = ht.set_load_policy(ht.init_table(size, DIM, sampled_values=_rows(size)),
                           max_load_factor=1.0)
    return t, RefTable(_rows(size))


def _same_home(n, size=SIZE, home=3):
    return [k for k in range(10_000) if key_hash(k) % size == home][:n]


def test_a_full_table_emptied_by_evict_takes_new_keys():
    t, ref = _pair()
    t, _, _ = ht.lookup_or_insert(t, np.arange(SIZE, dtype=np.int64))
    t = ht.evict(t, np.arange(SIZE, dtype=np.int64))
    t, _, info = ht.lookup_or_insert(t, np.arange(100, 100 + SIZE, dtype=np.int64))
    assert int(info.unplaced) == 0 and int(t.live) == SIZE
    ref.lookup_or_insert(np.arange(SIZE))
    ref.evict(np.arange(SIZE))
    ref.lookup_or_insert(np.arange(100, 100 + SIZE))
    assert_same_table(t, ref)


@pytest.mark.parametrize("order", [(0, 1, 2), (1, 0, 2), (2, 1, 0), (2, 0, 1)])
def test_tombstone_reuse_follows_batch_order(order):
    """Keys a, b, c share a home; b is evicted (its tombstone is the first slot of the
    chain's reusable slots) and d is a new key of that home. In a batch, whichever of b (it
    revives its tombstone) or the new keys comes first takes the tombstone."""
    a, b, c, d, e = _same_home(5)
    t, ref = _pair()
    for side in ("jax", "ref"):
        keys = np.array([a, b, c], np.int64)
        if side == "jax":
            t, _, _ = ht.lookup_or_insert(t, keys)
            t = ht.evict(t, np.array([b], np.int64))
        else:
            ref.lookup_or_insert(keys)
            ref.evict([b])
    batch = np.array([[b, d, e][i] for i in order], np.int64)
    t, rows, info = ht.lookup_or_insert(t, batch)
    want_rows, want = ref.lookup_or_insert(batch)
    chex.assert_trees_all_equal(np.asarray(info.slots), want["slots"])
    chex.assert_trees_all_equal(np.asarray(rows), want_rows)
    assert_same_table(t, ref)
    first = batch[0]
    assert ref.keys[want["slots"][0]] == first and want["slots"][0] == 4  # the tombstone


def test_reviving_key_placed_after_its_tombstone_was_reused_is_found_again():
    """b loses its tombstone to an earlier new key, is inserted anew further on, and a
    later find sees exactly one b."""
    a, b, d = _same_home(3)
    t, ref = _pair()
    t, _, _ = ht.lookup_or_insert(t, np.array([a, b], np.int64))
    t = ht.evict(t, np.array([b], np.int64))
    t, _, info = ht.lookup_or_insert(t, np.array([d, b, b], np.int64))
    slots = np.asarray(info.slots).tolist()
    assert slots[1] == slots[2] != slots[0] and int(info.inserted) == 2
    assert ht.find(t, np.array([b, d], np.int64))[1].tolist() == [True, True]
    keys = ht.words.to_host_int64(ht.words.join_words(t.keys))
    assert (keys == b).sum() == 1


def test_evict_lowest_orders_and_breaks_ties_as_documented():
    t, ref = _pair(16)
    t = ht.set_load_policy(t, max_load_factor=1.0)
    for step, keys in ((1, [1, 2, 3, 4, 5, 6]), (2, [2, 3, 3, 3]), (3, [4, 4])):
        t, _, _ = ht.lookup_or_insert(t, np.array(keys, np.int64), step=step)
        ref.lookup_or_insert(keys, step=step)
    for by, n in (("lru", 3), ("lfu", 2), ("lru", 10), ("lfu", 0)):
        got = ht.evict_lowest(t, n, by=by, const_val=-1.0)
        want = RefTable.from_table(t)
        want.evict_lowest(n, by=by, const_val=-1.0)
        assert_same_table(got, want)
    # lru: 1, 5, 6 are oldest (step 1, counter 1: ties by slot); lfu: counter 1 first.
    lru = ht.evict_lowest(t, 3, by="lru")
    assert ht.find(lru, np.arange(1, 7, dtype=np.int64))[1].tolist() == \
        [False, True, True, True, False, False]
    spared = ht.evict_lowest(t, 3, by="lru", keep=ht.locate(t, np.array([5], np.int64)))
    assert ht.find(spared, np.array([5], np.int64))[1].tolist() == [True]
    half = ht.evict_lowest(t, fraction=0.5, by="lfu")
    assert int(half.live) == 3


def test_evict_lowest_inside_jit_and_with_a_wrapped_clock():
    t, ref = _pair()
    for step, keys in ((2**32 - 2, [1, 2]), (2**32 - 1, [3]), (1, [4])):  # the clock wraps
        t, _, _ = ht.lookup_or_insert(t, np.array(keys, np.int64), step=step)
        ref.lookup_or_insert(keys, step=step)
    got = jax.jit(lambda t, n: ht.evict_lowest(t, n))(t, jnp.int32(2))
    ref.evict_lowest(2)
    assert_same_table(got, ref)
    assert ht.find(got, np.arange(1, 5, dtype=np.int64))[1].tolist() == [False, False, True, True]


def test_evict_if_with_the_predicate_helpers_and_a_lambda():
    t, ref = _pair()
    for step, keys in ((1, [1, 2, 2, 3]), (5, [3, 4])):
        t, _, _ = ht.lookup_or_insert(t, np.array(keys, np.int64), step=step)
        ref.lookup_or_insert(keys, step=step)
    got = ht.evict_if(t, ht.counter_below(2))
    want = RefTable.from_table(t)
    want.evict_if(lambda k, c, la, age: c < 2)
    assert_same_table(got, want)
    got = ht.evict_if(t, ht.not_seen_for(4))
    want = RefTable.from_table(t)
    want.evict_if(lambda k, c, la, age: age >= 4)
    assert_same_table(got, want)
    got = ht.evict_if(t, lambda s: (s.key.lo == 3) & (s.key.hi == 0))
    assert ht.find(got, np.arange(1, 5, dtype=np.int64))[1].tolist() == [True, True, False, True]
    assert int(got.live) == 3


def test_eviction_arguments_are_checked():
    t, _ = _pair()
    with pytest.raises(OpArgumentError, match="evict_lowest: argument 'by'"):
        ht.evict_lowest(t, 1, by="fifo")
    with pytest.raises(OpArgumentError, match="exactly one of n and fraction"):
        ht.evict_lowest(t)
    with pytest.raises(OpArgumentError, match="exactly one of n and fraction"):
        ht.evict_lowest(t, 1, fraction=0.5)
    with pytest.raises(OpArgumentError, match="argument 'fraction'"):
        ht.evict_lowest(t, fraction=1.5)
    with pytest.raises(OpArgumentError, match="evict_if: argument 'predicate'.*bool"):
        ht.evict_if(t, lambda s: s.age)
    with pytest.raises(OpArgumentError, match="argument 'step'"):
        ht.lookup_or_insert(t, np.array([1], np.int64), step=2**32)


def test_evict_policy_makes_room_by_score_before_the_insert():
    t = ht.set_load_policy(ht.init_table(16, DIM, sampled_values=_rows(16)),
                           max_load_factor=0.5, policy="evict")
    ref = RefTable(_rows(16))
    for keys in ([1, 2, 3, 4], [5, 6, 7, 8], [1, 2, 9, 10], [11, 3, 12, 1]):
        keys = np.array(keys, np.int64)
        present = {ref.live_slot(int(k)) for k in keys} - {-1}
        new = len({int(k) for k in keys if ref.live_slot(int(k)) < 0})
        if ref.live + new > 8:
            ref.evict_lowest(ref.live + new - 8, keep=present)
        t, rows, info = ht.lookup_or_insert(t, keys)
        ref.lookup_or_insert(keys)
        assert int(t.live) <= 8 and not bool(info.over_limit)
        assert_same_table(t, ref)
    # Keys 4, 5, ... were the least recently used; the batch's own keys are never evicted.
    assert ht.find(t, np.array([1, 3, 11, 12], np.int64))[1].tolist() == [True] * 4
    lfu = ht.set_load_policy(t, max_load_factor=0.5, policy="evict_lfu")
    lfu, _, _ = ht.lookup_or_insert(lfu, np.array([20], np.int64))
    assert int(lfu.live) == 8
    with pytest.raises(OpArgumentError, match="at most 8 live keys"):  # no room to make
        ht.lookup_or_insert(t, np.arange(100, 109, dtype=np.int64))
    _, _, info = jax.jit(ht.lookup_or_insert)(t, ht.words.as_words(np.arange(100, 104)))
    assert bool(info.over_limit)  # inside jit: reported


def test_donate_updates_in_place_and_consumes_the_input():
    t, _ = _pair(64)
    t, _, _ = ht.lookup_or_insert(t, np.arange(10, dtype=np.int64))
    keys = np.arange(5, 15, dtype=np.int64)
    # A copy: a result shares the buffers it leaves unchanged with its input (no copy of
    # the rows), so donating the input would delete them in the result too.
    want_table, want_rows, _ = ht.lookup_or_insert(jax.tree.map(jnp.copy, t), keys)
    pointers = {f: getattr(t, f).unsafe_buffer_pointer() for f in ("values", "key_lo", "flags")}
    got_table, got_rows, _ = ht.lookup_or_insert(t, keys, donate=True)
    chex.assert_trees_all_equal(got_table, want_table)
    chex.assert_trees_all_equal(got_rows, want_rows)
    assert t.values.is_deleted() and t.key_lo.is_deleted()
    # No copy: the new table's arrays are the old buffers, written in place.
    assert {f: getattr(got_table, f).unsafe_buffer_pointer() for f in pointers} == pointers
    with pytest.raises(RuntimeError, match="deleted"):
        ht.find(t, keys)
    evicted = ht.evict_lowest(got_table, 3, donate=True)
    assert got_table.values.is_deleted() and int(evicted.live) == 12


def test_donate_with_the_grow_policy_consumes_the_old_table():
    t = ht.set_load_policy(ht.init_table(8, DIM, initializer_mode="constant"), policy="grow")
    t, _, _ = ht.lookup_or_insert(t, np.arange(7, dtype=np.int64), donate=True)
    grown, _, _ = ht.lookup_or_insert(t, np.arange(7, 12, dtype=np.int64), donate=True)
    assert grown.bucket_size == 16 and int(grown.live) == 12
    assert t.values.is_deleted()
