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
    ("save", lambda t: ht.save(t, "unused.jxht")),
    ("to_cann_bytes", lambda t: ht.to_cann_bytes(t)),
    ("handle_counters", lambda t: ht.handle_counters(t)),
    ("optim.adam", lambda t: optim.adam(0.1).init(t)),
    ("optim.adam", lambda t: optim.adam(0.1).update(t, None, np.zeros(1, np.int32),
                                                    np.ones((1, 2)))),
])
@pytest.mark.parametrize("not_a_table", [None, "table", np.zeros((16, 2), np.float32)],
                         ids=["None", "str", "array"])
def test_a_non_table_is_refused_by_name(name, call, not_a_table):
    with pytest.raises(OpArgumentError, match=rf"{name}\b.*argument 'tables?'.*HashTable"):
        call(not_a_table)


def test_gather_takes_the_values_not_the_table():
    t = _table()
    with pytest.raises(OpArgumentError, match=r"gather: argument 'values'.*table\.values.*"
                                              r"got HashTable"):
        ht.gather(t, [0, 1])
    np.testing.assert_array_equal(ht.gather(t.values, [0, -1]), [[0.5, 0.5], [0.0, 0.0]])


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


@pytest.mark.parametrize("x64", [False, True], ids=["x64_off", "x64_on"])
def test_uint64_keys_are_bit_patterns_and_come_back(x64, tmp_path):
    """uint64 k is the int64 key with the same bits; keys come back as int64 and
    ``to_host_int64(..., signed=False)`` (or ``.view(np.uint64)``) gives the uint64 back."""
    with jax.enable_x64(x64):
        forms = [HIGH, [int(k) for k in HIGH]] + ([jnp.asarray(HIGH)] if x64 else [])
        t0 = _table(32)
        t, rows, info = ht.lookup_or_insert(t0, HIGH.view(np.int64))
        for keys in forms:
            same, _, info2 = ht.lookup_or_insert(t0, keys)
            _same_tables(same, t)
            np.testing.assert_array_equal(ht.locate(t, keys), info.slots)
        assert int(t.live) == 4 and bool(ht.find(t, [-1])[1][0]) is True  # -1 is 2**64 - 1
        _, keys, *_ = ht.export(t)
        exported = ht.to_host_int64(jaxops.refresh(keys), signed=False)
        assert sorted(exported.tolist()) == sorted(int(k) for k in HIGH)
        assert sorted(ht.to_host_int64(jaxops.refresh(keys)).view(np.uint64).tolist()) == \
            sorted(exported.tolist())
        _, chunks = ht.export_chunks(t)
        assert sorted(k for c in chunks for k in c.keys.view(np.uint64).tolist()) == \
            sorted(exported.tolist())
        ht.save(t, tmp_path / "t.jxht")
        _same_tables(ht.load(tmp_path / "t.jxht"), t)


def test_uint64_default_and_filter_keys():
    t, rows, info = ht.lookup_or_insert(_table(), HIGH[:2], filter_key_flag=True,
                                        filter_key=2**64 - 1, default_key_or_value=True,
                                        default_key=2**63)
    # 2**64 - 1 is replaced by 2**63: one key, two occurrences
    assert int(t.live) == 1 and int(info.slots[0]) == int(info.slots[1])
    np.testing.assert_array_equal(ht.locate(t, [-2**63]), info.slots[:1])
