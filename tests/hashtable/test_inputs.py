"""What the hash-table functions accept and refuse: non-tables, states of another table,
Python lists of keys, and 64-bit keys as uint64 bit patterns (x64 off and on)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxops
import jaxops.hashtable as ht
from jaxops.errors import OpArgumentError, OpDTypeError
from jaxops.hashtable import optim

K = lambda *keys: np.array(keys, np.int64)  # noqa: E731


def _table(size=16, dim=2):
    return ht.init_table(size, dim, initializer_mode="constant", constant_value=0.5)


@pytest.mark.parametrize("name,call", [
    ("lookup", lambda t: ht.lookup(t, K(1))),
    ("find", lambda t: ht.find(t, K(1))),
    ("locate", lambda t: ht.locate(t, K(1))),
    ("LookupOrInsert", lambda t: ht.lookup_or_insert(t, K(1))),
    ("Evict", lambda t: ht.evict(t, K(1))),
    ("Import", lambda t: ht.import_(t, K(1), np.ones(1, np.uint64), np.ones(1, np.uint8),
                                    np.ones((1, 2), np.float32))),
    ("Export", lambda t: ht.export(t)),
    ("export_chunks", lambda t: ht.export_chunks(t)),
    ("ApplyAdamW", lambda t: ht.adam_w_init(t)),
    ("ApplyAdamW", lambda t: ht.apply_adam_w(t, ht.adam_w_init(_table()), K(1), np.ones((1, 2)),
                                             lr=0.1, weight_decay=0.0)),
    ("resize", lambda t: ht.resize(t, 32)),
    ("compact", lambda t: ht.compact(t)),
    ("set_load_policy", lambda t: ht.set_load_policy(t)),
    ("to_cann_bytes", lambda t: ht.cann.to_cann_bytes(t)),
    ("handle_counters", lambda t: ht.cann.handle_counters(t)),
    ("optim.adam", lambda t: optim.adam(0.1).init(t)),
    ("optim.adam", lambda t: optim.adam(0.1).update(t, None, np.zeros(1, np.int32),
                                                    np.ones((1, 2)))),
])
@pytest.mark.parametrize("not_a_table", [None, "table", np.zeros((16, 2), np.float32)],
                         ids=["None", "str", "array"])
def test_a_non_table_is_refused_by_name(name, call, not_a_table):
    with pytest.raises(OpArgumentError, match=rf"{name}\b.*argument 'tables?'.*HashTable"):
        call(not_a_table)


_RAGGED = [[1], [2, 3]]
_not_a_path = lambda bad: bad.encode() if isinstance(bad, str) else bad  # noqa: E731


@pytest.mark.parametrize("name,arg,call", [
    ("find", "keys", lambda t, bad: ht.find(t, bad)),
    ("lookup", "keys", lambda t, bad: ht.lookup(t, bad)),
    ("locate", "keys", lambda t, bad: ht.locate(t, bad)),
    ("gather", "slots", lambda t, bad: ht.gather(t, bad)),
    ("ApplyAdamW", "grads", lambda t, bad: ht.apply_adam_w(t, ht.adam_w_init(t), K(1), bad,
                                                           lr=0.1, weight_decay=0.0)),
    ("Import", "filter_flags", lambda t, bad: ht.import_(t, K(1), np.ones(1, np.uint64), bad,
                                                         np.ones((1, 2), np.float32))),
    ("Import", "values", lambda t, bad: ht.import_(t, K(1), np.ones(1, np.uint64),
                                                   np.ones(1, np.uint8), bad)),
    ("evict_lowest", "n", lambda t, bad: ht.evict_lowest(t, bad)),
    ("evict_lowest", "fraction", lambda t, bad: ht.evict_lowest(  # None: n is missing
        t, fraction=float("nan") if bad is None else bad)),
    ("evict_lowest", "keep", lambda t, bad: ht.evict_lowest(  # None: nothing kept
        t, 1, keep=[1.5] if bad is None else bad)),
    ("counter_below", "threshold", lambda t, bad: ht.counter_below(bad)),
    ("not_seen_for", "steps", lambda t, bad: ht.not_seen_for(bad)),
    ("save", "path", lambda t, bad: ht.save(t, _not_a_path(bad))),
    ("load", "path", lambda t, bad: ht.load(_not_a_path(bad))),
    ("from_cann_bytes", "buffer", lambda t, bad: ht.cann.from_cann_bytes(bad, 2)),
    ("from_cann_bytes", "embedding_dim", lambda t, bad: ht.cann.from_cann_bytes(
        ht.cann.to_cann_bytes(t), bad)),
    ("row_bytes", "embedding_dim", lambda t, bad: ht.cann.row_bytes(bad)),
    ("host_keys", "table", lambda t, bad: ht.host_keys(bad, K(1))),
    ("host_keys", "keys", lambda t, bad: ht.host_keys(t, bad)),
    ("optim.sgd", "slots", lambda t, bad: optim.sgd(0.1).update(t, optim.sgd(0.1).init(t), bad,
                                                                np.ones((1, 2)))),
    ("optim.sgd", "grads", lambda t, bad: optim.sgd(0.1).update(t, optim.sgd(0.1).init(t),
                                                                np.zeros(1, np.int32), bad)),
])
@pytest.mark.parametrize("bad", [None, "abc", _RAGGED, object()],
                         ids=["None", "str", "ragged", "object"])
def test_each_function_names_itself_and_the_argument(name, arg, call, bad):
    """A wrong argument raises the library's error naming the function the user called
    (not a helper such as locate) and the argument, never a raw numpy/JAX error."""
    with pytest.raises((OpArgumentError, OpDTypeError), match=rf"{name}\b.*argument '{arg}'"):
        call(_table(), bad)


def test_a_sharded_table_checks_slots_as_one_table_does():
    """gather and a row optimizer's update on a ShardedHashTable refuse what the one-table
    functions refuse: slots that are not integers, and (gather) slots outside the table."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("d",))
    t = ht.init_sharded_table(16, 2, mesh, "d", initializer_mode="constant")
    for bad in ([[1], [2, 3]], "abc", np.ones(1)):
        with pytest.raises(OpDTypeError, match=r"gather: argument 'slots'"):
            ht.gather(t, bad)
        with pytest.raises(OpDTypeError, match=r"optim\.sgd: argument 'slots'"):
            optim.sgd(0.1).update(t, optim.sgd(0.1).init(t), bad, np.ones((1, 2)))
    for slot in (16, 999, -5):
        with pytest.raises(OpArgumentError, match=rf"gather: argument 'slots'.*got {slot}"):
            ht.gather(t, np.array([0, slot]))


def test_gather_takes_the_table_not_its_values():
    t = _table()
    with pytest.raises(OpArgumentError, match=r"gather: argument 'table'.*HashTable.*"
                                              r"got ArrayImpl"):
        ht.gather(t.values, [0, 1])
    np.testing.assert_array_equal(ht.gather(t, [0, -1]), [[0.5, 0.5], [0.0, 0.0]])


@pytest.mark.parametrize("kwargs", [{}, {"initializer_mode": "constant"},
                                    {"key": jax.random.key(0)},
                                    {"sampled_values": np.zeros(64, np.float32)}])
def test_init_table_blames_embedding_dim(kwargs):
    with pytest.raises(OpArgumentError, match="argument 'embedding_dim'.*got 0"):
        ht.init_table(64, 0, **kwargs)


def test_adamw_state_of_another_table_is_refused():
    t, _, _ = ht.lookup_or_insert(_table(16), K(1))
    for state, got in [(ht.adam_w_init(_table(8)), "m of shape (8, 2)"),
                       (ht.adam_w_init(_table(16, 3)), "m of shape (16, 3)"),
                       (None, "NoneType")]:
        with pytest.raises(OpArgumentError,
                           match=rf"ApplyAdamW: argument 'state'.*got {re.escape(got)}"):
            ht.apply_adam_w(t, state, K(1), np.ones((1, 2)), lr=0.1, weight_decay=0.0)
    grown = ht.resize(t, 32)
    with pytest.raises(OpArgumentError, match="before a resize"):
        ht.apply_adam_w(grown, ht.adam_w_init(t), K(1), np.ones((1, 2)), lr=0.1,
                        weight_decay=0.0)


@pytest.mark.parametrize("make", [optim.adam, optim.adagrad, optim.rowwise_adagrad, optim.ftrl])
def test_row_optimizer_state_of_another_table_is_refused(make):
    opt = make(0.1)
    t, _, info = ht.lookup_or_insert(_table(16), K(1, 2))
    with pytest.raises(OpArgumentError, match=r"argument 'state'.*another table"):
        opt.update(t, opt.init(_table(8)), info.slots, np.ones((2, 2)))
    new, _ = jax.jit(opt.update)(t, opt.init(t), info.slots, jnp.ones((2, 2)))  # its own: fine
    assert new.values.shape == (16, 2)


def _same_tables(a, b):
    for name in ("key_lo", "key_hi", "counter_lo", "counter_hi", "flags", "values"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


def test_python_lists_are_keys_wherever_keys_are_taken():
    keys = [[3, -1], [2**40, 3]]
    as_array = np.array(keys, np.int64)
    t0 = _table()
    ta, rows_a, _ = ht.lookup_or_insert(t0, as_array)
    tl, rows_l, _ = ht.lookup_or_insert(t0, keys)
    _same_tables(ta, tl)
    np.testing.assert_array_equal(rows_a, rows_l)
    for fn in (ht.lookup, ht.locate, lambda t, k: ht.find(t, k)[1]):
        np.testing.assert_array_equal(fn(ta, keys), fn(ta, as_array))
    _same_tables(ht.evict(ta, [3]), ht.evict(ta, K(3)))
    ti, _ = ht.import_(t0, [7, 8], [1, 2], [1, 0], [[1.0, 2.0], [3.0, 4.0]])
    tj, _ = ht.import_(t0, K(7, 8), np.array([1, 2], np.uint64), np.array([1, 0], np.uint8),
                       np.array([[1.0, 2.0], [3.0, 4.0]], np.float32))
    _same_tables(ti, tj)
    state = ht.adam_w_init(ta)
    step = dict(lr=0.1, weight_decay=0.01)
    _same_tables(ht.apply_adam_w(ta, state, [3, 2**40], [[1.0, 1.0], [2.0, 2.0]], **step)[0],
                 ht.apply_adam_w(ta, state, K(3, 2**40), np.array([[1.0, 1.0], [2.0, 2.0]]),
                                 **step)[0])
    assert ht.lookup_or_insert(t0, [])[1].shape == (0, 2)


@pytest.mark.parametrize("bad,error,given", [
    ([2**64], OpArgumentError, "18446744073709551616"),
    ([-2**63 - 1, 5], OpArgumentError, "-9223372036854775809"),
    ([1.5], OpDTypeError, "1.5"),
    ([True, False], OpDTypeError, "True"),
    (np.array([1.0, 2.0]), OpDTypeError, "float64"),
])
def test_keys_outside_64_bits_or_not_integers_are_refused(bad, error, given):
    with pytest.raises(error, match=rf"LookupOrInsert: argument 'keys'.*got.*{given}"):
        ht.lookup_or_insert(_table(), bad)


HIGH = np.array([2**63, 2**64 - 1, 2**63 + 12345, 7], np.uint64)  # bit patterns >= 2**63


def _uint64_table(size=16):
    return ht.init_table(size, 2, initializer_mode="constant", key_dtype=np.uint64)


def test_a_uint64_table_gives_uint64_keys_back(tmp_path):
    """init_table(key_dtype=np.uint64): every form of the keys lands on the same slots, and
    export / export_chunks / save+load / compact / CANN bytes / jit keep uint64."""
    t0 = _uint64_table()
    t, _, info = ht.lookup_or_insert(t0, HIGH)
    for keys in (HIGH, [int(k) for k in HIGH], ht.words.as_words(HIGH, "t", "k")):
        np.testing.assert_array_equal(ht.locate(t, keys), info.slots)
    _, keys, *_ = ht.export(t)
    exported = ht.host_keys(t, jaxops.refresh(keys))
    assert exported.dtype == np.uint64 and sorted(exported.tolist()) == sorted(HIGH.tolist())
    _, chunks = ht.export_chunks(t)
    (chunk,) = list(chunks)
    assert chunk.keys.dtype == np.uint64 and sorted(chunk.keys.tolist()) == sorted(HIGH.tolist())
    ht.save(t, tmp_path / "t.jxht")
    back = ht.load(tmp_path / "t.jxht")
    assert back.key_dtype == "uint64"
    _same_tables(back, t)
    assert ht.compact(t).key_dtype == "uint64"
    assert ht.cann.from_cann_bytes(ht.cann.to_cann_bytes(t), 2, key_dtype=np.uint64).key_dtype == "uint64"
    assert jax.jit(lambda table: table)(t).key_dtype == "uint64"  # static: kept through jit
    assert "key_dtype='uint64'" in repr(t)


def test_a_uint64_table_exports_jax_uint64_with_x64():
    """With x64 on export's keys are JAX uint64; JAX arrays are bit patterns (negative int64
    JAX keys find the uint64 keys with the same bits: nothing can be checked inside jit)."""
    with jax.enable_x64(True):
        t, _, info = ht.lookup_or_insert(_uint64_table(), jnp.asarray(HIGH))
        _, keys, *_ = ht.export(t)
        assert keys.data.dtype == jnp.uint64
        assert sorted(jaxops.refresh(keys).tolist()) == sorted(HIGH.tolist())
        np.testing.assert_array_equal(ht.locate(t, jnp.asarray(HIGH.view(np.int64))),
                                      info.slots)


@pytest.mark.parametrize("table_dtype,keys,given", [
    (np.int64, HIGH, r"9223372036854775808 \(and 2 more\)"),
    (np.int64, [5, 2**64 - 1], "18446744073709551615"),
    (np.uint64, np.array([3, -2], np.int64), "-2"),
    (np.uint64, [-1], "-1"),
])
def test_host_keys_that_do_not_fit_the_tables_key_dtype_are_refused(table_dtype, keys, given):
    """Host keys are values: a uint64 key >= 2**63 does not fit an int64 table (the error
    names the fix), a negative key does not fit a uint64 table."""
    t = ht.init_table(16, 2, initializer_mode="constant", key_dtype=table_dtype)
    name = np.dtype(table_dtype).name
    for call, op in [(ht.lookup_or_insert, "LookupOrInsert"), (ht.locate, "locate"),
                     (ht.evict, "Evict")]:
        fix = r"Create the table with init_table\(\.\.\., key_dtype=np\.uint64\)" \
            if name == "int64" else "A uint64 table takes keys >= 0"
        with pytest.raises(OpArgumentError, match=rf"{op}: argument 'keys': expected {name} "
                                                  rf"keys.*got {given}\. {fix}"):
            call(t, keys)


def test_a_sharded_uint64_table_keeps_its_key_dtype(tmp_path):
    """init_sharded_table(key_dtype=) reaches every shard; export and checkpoints (both load
    paths) keep it, and host keys are checked against it (one-device mesh)."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("d",))
    t = ht.init_sharded_table(16, 2, mesh, "d", initializer_mode="constant",
                              key_dtype=np.uint64)
    t, _, _ = ht.lookup_or_insert(t, HIGH)
    t, keys, *_ = ht.export(t)
    assert sorted(ht.host_keys(t, jaxops.refresh(keys)).tolist()) == sorted(HIGH.tolist())
    ht.save(t, tmp_path / "c")
    assert ht.load(tmp_path / "c", mesh=mesh, axis="d").key_dtype == "uint64"
    assert ht.load(tmp_path / "c", mesh=mesh, axis="d", shard_size=32).key_dtype == "uint64"
    with pytest.raises(OpArgumentError, match=r"find: argument 'keys'.*uint64.*got -3"):
        ht.find(t, [-3])


def test_words_are_bit_patterns_for_an_int64_table():
    """Words64 (what a jitted step takes) are bits: uint64 patterns reach an int64 table."""
    t, _, info = ht.lookup_or_insert(_table(), ht.words.as_words(HIGH, "t", "k"))
    np.testing.assert_array_equal(ht.locate(t, HIGH.view(np.int64)), info.slots)
    assert ht.find(t, [-1])[1][0]  # -1 has the bits of 2**64 - 1


def test_key_dtype_is_checked():
    with pytest.raises(OpArgumentError, match=r"InitEmbeddingHashTable: argument 'key_dtype'.*"
                                              r"np.int64, np.uint64, np.int32 or np.uint32.*"
                                              r"int16"):
        ht.init_table(8, 1, initializer_mode="constant", key_dtype=np.int16)


def test_uint64_default_and_filter_keys():
    t0 = ht.init_table(16, 2, initializer_mode="constant", key_dtype=np.uint64)
    t, rows, info = ht.lookup_or_insert(t0, HIGH[:2], filter_key_flag=True,
                                        filter_key=2**64 - 1, default_key_or_value=True,
                                        default_key=2**63)
    # 2**64 - 1 is replaced by 2**63: one key, two occurrences
    assert int(t.live) == 1 and int(info.slots[0]) == int(info.slots[1])
    np.testing.assert_array_equal(ht.locate(t, [2**63]), info.slots[:1])
