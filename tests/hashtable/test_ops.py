"""Hand-made edge cases of each table operation, the CANN launch path and the errors."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxops
import jaxops.hashtable as ht
import tracing
from jaxops.errors import OpArgumentError, UnknownAttrError
from tests.helpers.hashtable_reference import RefTable, assert_same_table

K = lambda *keys: np.array(keys, np.int64)  # noqa: E731


def _at(x, *index):
    """``x[index]`` read on the host (an eager jax index compiles a program per shape)."""
    return np.asarray(x)[index]


def _table(size=16, dim=2, value=0.0):
    return ht.init_table(size, dim, initializer_mode="constant", constant_value=value)


def test_all_six_cann_operators_are_registered():
    names = {"InitEmbeddingHashTable", "EmbeddingHashTableLookupOrInsert",
             "EmbeddingHashTableExport", "EmbeddingHashTableImport", "EmbeddingHashTableEvict",
             "EmbeddingHashTableApplyAdamW"}
    assert names <= set(jaxops.list_ops())


def test_empty_batches_and_empty_table():
    t = _table()
    t2, rows, info = ht.lookup_or_insert(t, K())
    assert rows.shape == (0, 2) and int(info.inserted) == 0 and int(t2.live) == 0
    assert ht.find(t, K())[0].shape == (0, 2)
    _, keys, counters, flags, values = ht.export(t)
    assert jaxops.refresh(keys).shape[0] == 0 and jaxops.refresh(values).shape == (0, 2)


def test_keys_keep_their_shape():
    t, rows, info = ht.lookup_or_insert(_table(), K(1, 2, 3, 4).reshape(2, 2))
    assert rows.shape == (2, 2, 2) and info.slots.shape == (2, 2)
    assert ht.locate(t, K(4, 3).reshape(1, 2)).shape == (1, 2)


def test_duplicates_count_every_occurrence_and_insert_once():
    t, _, info = ht.lookup_or_insert(_table(), K(9, 9, 9, 4, 9))
    assert int(info.inserted) == 2 and int(t.live) == 2 and int(t.not_exported) == 2
    slot = int(_at(ht.locate(t, K(9)), 0))
    assert int(_at(t.counter_lo, slot)) == 4 and int(_at(t.flags, slot)) == ht.cann.VALID


def test_counters_carry_into_the_high_word():
    t = _table()
    t, _ = ht.import_(t, K(5), np.array([2**32 - 2], np.uint64), np.zeros(1, np.uint8),
                      np.zeros((1, 2), np.float32))
    t, _, _ = ht.lookup_or_insert(t, K(5, 5, 5))
    _, _, counters, _, _ = ht.export(t)
    assert ht.words.to_host_int64(jaxops.refresh(counters), signed=False).tolist() == [2**32 + 1]


def test_full_table_is_reported_never_silent():
    t = ht.set_load_policy(_table(size=4, value=3.0), max_load_factor=1.0)
    t, rows, info = ht.lookup_or_insert(t, K(1, 2, 3, 4, 5, 6, 5), default_value=-1.0)
    assert int(info.inserted) == 4 and int(info.unplaced) == 3 and int(t.dropped) == 3
    chex.assert_trees_all_equal(np.asarray(info.slots) >= 0, np.array([1, 1, 1, 1, 0, 0, 0], bool))
    chex.assert_trees_all_equal(np.asarray(rows)[4:], np.full((3, 2), -1.0, np.float32))
    t, rows, info = ht.lookup_or_insert(t, K(3))  # present keys still work when full
    assert int(info.unplaced) == 0 and float(_at(rows, 0, 0)) == 3.0


def test_tombstone_comes_back_as_a_new_key():
    t = _table(value=1.0)
    t, _, _ = ht.lookup_or_insert(t, K(7, 7), filter_mode="counter", filter_freq=1)
    t, *_ = ht.export(t)
    slot = int(_at(ht.locate(t, K(7)), 0))
    assert int(_at(t.flags, slot)) == ht.cann.VALID | ht.cann.FILTER | ht.cann.EXPORT
    t = ht.evict(t, K(7), const_val=-4.0)
    assert int(_at(t.flags, slot)) == (ht.cann.VALID | ht.cann.FILTER | ht.cann.EXPORT
                                       | ht.cann.EVICTED)
    assert int(t.live) == 0 and int(t.not_exported) == 0  # it had been exported
    assert not bool(_at(ht.find(t, K(7))[1], 0))
    t, rows, info = ht.lookup_or_insert(t, K(7))
    assert int(info.inserted) == 1 and int(_at(info.slots, 0)) == slot
    assert int(_at(t.flags, slot)) == ht.cann.VALID and int(_at(t.counter_lo, slot)) == 1
    assert float(_at(rows, 0, 0)) == -4.0 and int(t.live) == 1 and int(t.not_exported) == 1


def test_filter_key_default_value_and_default_key():
    t, rows, info = ht.lookup_or_insert(_table(value=2.0), K(5, 6), filter_key_flag=True,
                                        filter_key=5, default_value=9.0)
    assert np.asarray(rows)[:, 0].tolist() == [9.0, 2.0]
    assert int(info.filtered) == 1 and int(t.live) == 1
    t, rows, info = ht.lookup_or_insert(_table(), K(5, 77), filter_key_flag=True, filter_key=5,
                                        default_key_or_value=True, default_key=77)
    assert int(t.live) == 1 and _at(info.slots, 0) == _at(info.slots, 1)


def test_counter_admission_threshold():
    t, rows, info = ht.lookup_or_insert(_table(value=1.0), K(3, 3, 3, 3), filter_mode="counter",
                                        filter_freq=3, default_value=0.0)
    assert info.admitted.tolist() == [False, False, True, True] and int(info.not_admitted) == 2
    assert np.asarray(rows)[:, 0].tolist() == [0.0, 0.0, 1.0, 1.0]
    t, _, _ = ht.lookup_or_insert(t, K(4), filter_mode="counter", filter_freq=3)
    _, _, _, flags, _ = ht.export(t, filtered_export_flag=True)
    assert jaxops.refresh(flags).tolist() == [1]  # only key 3 was admitted


def test_export_modes_and_the_not_exported_count():
    t, _, _ = ht.lookup_or_insert(_table(), K(1, 2, 3))
    t, keys, *_ = ht.export(t, export_mode="new")
    assert int(t.not_exported) == 0 and jaxops.refresh(keys).shape[0] == 3
    t, _, _ = ht.lookup_or_insert(t, K(4))
    t, keys, *_ = ht.export(t, export_mode="new")
    assert ht.words.to_host_int64(jaxops.refresh(keys)).tolist() == [4]
    t, keys, *_ = ht.export(t, export_mode="all")
    assert jaxops.refresh(keys).shape[0] == 4 and int(t.not_exported) == 0


def test_export_is_in_ascending_slot_order():
    t, _, info = ht.lookup_or_insert(_table(size=64), K(*range(20)))
    _, keys, *_ = ht.export(t)
    order = np.argsort(np.asarray(info.slots))
    assert ht.words.to_host_int64(jaxops.refresh(keys)).tolist() == list(np.arange(20)[order])


def test_multi_table_export_through_launch_with_outshape():
    a, _, _ = ht.lookup_or_insert(_table(16, 2), K(1, 2, 3))
    b, _, _ = ht.lookup_or_insert(_table(8, 3, 1.5), K(-5, 2**40))
    with jax.enable_x64(True):
        shapes = np.zeros(9 * 8, np.int64)
        res = tracing.launch("EmbeddingHashTableExport", tracing.OP_INPUT([a, b]),
                             tracing.OP_ATTR(export_mode="all"),
                             *[tracing.OP_OUTSHAPE(shapes, i) for i in range(8)])
        outs = res.outputs
        assert [o.dtype for o in outs[::2]] == [np.int64, np.uint64, np.uint8, np.float32]
        assert [o.shape for o in outs] == [(3,), (2,), (3,), (2,), (3,), (2,), (3, 2), (2, 3)]
        assert tracing.outshape.decode(shapes)[6:] == [(3, 2), (2, 3)]
        _, keys, counters, flags, values = ht.export([a, b])
        functional = jaxops.refresh(keys + counters + flags + values)
        chex.assert_trees_all_equal([np.asarray(o) for o in outs], functional)
        assert sorted(outs[1].tolist()) == [-5, 2**40]


@pytest.mark.x64_off
def test_export_word_pairs_with_x64_off():
    t, _, _ = ht.lookup_or_insert(_table(), K(-2))
    _, keys, counters, _, _ = ht.export(t)
    assert keys.max_shape == (16, 2) and keys.dtype == jnp.uint32
    assert ht.words.to_host_int64(jaxops.refresh(keys)).tolist() == [-2]
    assert ht.words.to_host_int64(jaxops.refresh(counters), signed=False).tolist() == [1]


def test_export_then_import_into_a_fresh_table_reproduces_everything():
    rng = np.random.default_rng(0)
    t = ht.init_table(32, 3, sampled_values=rng.standard_normal((32, 3)).astype(np.float32))
    t, _, _ = ht.lookup_or_insert(t, rng.integers(-40, 40, 30), filter_mode="counter", filter_freq=2)
    t = ht.evict(t, K(1, 2, 3))
    t, keys, counters, flags, values = ht.export(t)
    host = jaxops.refresh((keys, counters, flags, values))
    fresh, info = ht.import_(ht.init_table(64, 3, initializer_mode="constant"),
                             ht.words.to_host_int64(host[0]), ht.words.to_host_int64(host[1], signed=False),
                             host[2], host[3])
    assert int(info.unplaced) == 0 and int(fresh.live) == int(t.live)
    _, keys2, counters2, flags2, values2 = ht.export(fresh)
    again = jaxops.refresh((keys2, counters2, flags2, values2))
    order = np.argsort(ht.words.to_host_int64(again[0]))
    first = np.argsort(ht.words.to_host_int64(host[0]))
    for x, y in zip(host, again):
        chex.assert_trees_all_equal(np.asarray(x)[first], np.asarray(y)[order])


def test_import_overwrites_and_keeps_counts_right():
    t, _, _ = ht.lookup_or_insert(_table(), K(1, 2))
    assert int(t.not_exported) == 2
    t, info = ht.import_(t, K(2, 3, 2), np.array([5, 6, 7], np.uint64), np.array([0, 1, 1], np.uint8),
                         np.arange(6, dtype=np.float32).reshape(3, 2))
    assert int(info.inserted) == 1 and int(t.live) == 3 and int(t.not_exported) == 1
    slot = int(_at(ht.locate(t, K(2)), 0))
    # the last entry wins
    assert int(_at(t.counter_lo, slot)) == 7 and float(_at(t.values, slot, 0)) == 4.0
    assert int(_at(t.flags, slot)) == ht.cann.VALID | ht.cann.EXPORT | ht.cann.FILTER


def test_evict_repeats_and_absent_keys_are_no_ops():
    t, _, _ = ht.lookup_or_insert(_table(), K(1, 2))
    t = ht.evict(t, K(1, 1, 50, -1))
    assert int(t.live) == 1 and int(t.not_exported) == 1
    t = ht.evict(t, K(1))
    assert int(t.live) == 1


def test_lookup_gradient_reaches_rows_with_duplicates():
    t, _, _ = ht.lookup_or_insert(_table(value=1.0), K(1, 2))
    keys = K(2, 2, 1, 99)
    ct = np.arange(8.0, dtype=np.float32).reshape(4, 2)
    grad = jax.grad(lambda v: jnp.sum(ct * ht.lookup(t.replace(values=v), keys)))(t.values)
    s1, s2 = np.asarray(ht.locate(t, K(1, 2))).tolist()
    want = np.zeros((16, 2), np.float32)
    want[s2] = ct[0] + ct[1]
    want[s1] = ct[2]
    chex.assert_trees_all_equal(np.asarray(grad), want)


def test_resize_matches_reference_and_checks_capacity():
    rng = np.random.default_rng(5)
    init = rng.standard_normal((16, 2)).astype(np.float32)
    t, ref = ht.init_table(16, 2, sampled_values=init), RefTable(init)
    keys = rng.integers(0, 100, 12)
    t, _, _ = ht.lookup_or_insert(t, keys)
    ref.lookup_or_insert(keys)
    t, ref = ht.evict(t, keys[:2]), ref
    ref.evict(keys[:2])
    assert_same_table(ht.resize(t, 40), ref.resize(np.zeros((40, 2), np.float32)))
    assert_same_table(ht.resize(t, 12), ref.resize(np.zeros((12, 2), np.float32)))
    with pytest.raises(OpArgumentError, match="resize: argument 'new_bucket_size'"):
        ht.resize(t, 5)
    small = jax.jit(lambda t: ht.resize(t, 5))(t)  # inside jit: counted, not lost silently
    assert int(small.dropped) == int(t.live) - 5
    # Tombstones are not carried over: a table shrinks to exactly its live keys.
    tight = ht.resize(t, int(t.live))
    assert np.sum(np.asarray(tight.flags) != 0) == int(t.live) < np.sum(np.asarray(t.flags) != 0)


@pytest.mark.parametrize("call,match", [
    (lambda: ht.init_table(0, 2, initializer_mode="constant"), "argument 'bucket_size'"),
    (lambda: ht.init_table(4, 2), "argument 'sampled_values'"),
    (lambda: ht.init_table(4, 2, sampled_values=np.zeros(7, np.float32)), "argument 'sampled_values'"),
    (lambda: ht.init_table(4, 0, initializer_mode="constant"), "argument 'embedding_dim'"),
    (lambda: ht.lookup_or_insert("table", K(1)), "argument 'table'"),
    (lambda: ht.lookup_or_insert(_table(), K(1), filter_mode="lru"), "argument 'filter_mode'"),
    (lambda: ht.lookup_or_insert(_table(), K(1), filter_freq=-1), "argument 'filter_freq'"),
    (lambda: ht.lookup_or_insert(_table(), K(1), default_key=2**64), "argument 'default_key'"),
    (lambda: ht.lookup_or_insert(_table(), K(1), filter_key=-2**63 - 1), "argument 'filter_key'"),
    (lambda: ht.import_(_table(), K(1, 2), np.zeros(1, np.uint64), np.zeros(2, np.uint8),
                        np.zeros((2, 2), np.float32)), "argument 'counters'"),
    (lambda: ht.import_(_table(), K(1), np.zeros(1, np.uint64), np.zeros(1, np.uint8),
                        np.zeros((1, 3), np.float32)), "argument 'values'"),
    (lambda: ht.evict(_table(), K(1), init_mode="random"), "argument 'sampled_values'"),
    (lambda: ht.export([]), "argument 'tables'"),
])
def test_bad_arguments_raise_naming_operator_and_argument(call, match):
    with pytest.raises(OpArgumentError, match=match):
        call()


def test_unknown_attr_through_launch():
    with pytest.raises(UnknownAttrError, match="export_mod"):
        tracing.launch("EmbeddingHashTableExport", tracing.OP_INPUT([_table()]),
                       tracing.OP_ATTR(export_mod="new"))
