"""The CANN bucket layout, the handle counters, and a checkpoint of a table that overflowed."""

import os
import struct

import chex
import numpy as np
import pytest

import jaxops.hashtable as ht
from jaxops.errors import OpArgumentError
from tests.helpers.hashtable_reference import table_snapshot


def _table():
    rng = np.random.default_rng(0)
    t = ht.init_table(8, 3, sampled_values=rng.standard_normal((8, 3)).astype(np.float32))
    t, _, _ = ht.lookup_or_insert(t, np.array([-2, 2**40 + 1, 5, 5], np.int64),
                                  filter_mode="counter", filter_freq=2)
    t = ht.evict(t, np.array([2**40 + 1], np.int64), const_val=0.5)
    return t


def test_bucket_bytes_by_hand():
    t = _table()
    buf = ht.cann.to_cann_bytes(t)
    assert buf.shape == (8, 24 + 16) and ht.cann.row_bytes(3) == 40 and ht.cann.row_bytes(2) == 32
    for s in range(8):
        row = buf[s]
        key, counter, state = struct.unpack_from("<qQi", row.tobytes())
        flags = int(t.flags[s])
        assert state == (1 if flags & ht.cann.VALID else 0)
        assert row[23] == flags & ~ht.cann.EVICTED and row[20] == flags & ht.cann.EVICTED  # CANN's Evict: byte 20
        assert not row[21:23].any() and not row[36:].any()
        values = np.frombuffer(row[24:36].tobytes(), "<f4")
        chex.assert_trees_all_equal(values, np.asarray(t.values[s]))
        if not flags:
            assert key == -1 and counter == 0
    slot = int(ht.locate(t, np.array([5], np.int64))[0])
    key, counter = struct.unpack_from("<qQ", buf[slot].tobytes())
    assert key == 5 and counter == 2 and buf[slot, 23] == ht.cann.VALID | ht.cann.FILTER
    assert ht.cann.handle_counters(t).tolist() == [0, 0, 2, 0, 2]


def test_from_cann_bytes_is_the_exact_inverse():
    t = _table()
    # CANN's bucket has no clock or last access (beyond CANN): they come back as 0.
    want = {**table_snapshot(t), "clock": 0,
            "last_access": np.zeros(t.bucket_size, np.uint32),
            "epoch": np.zeros(t.bucket_size, np.uint32)}  # nor an epoch
    back = ht.cann.from_cann_bytes(ht.cann.to_cann_bytes(t), 3)
    chex.assert_trees_all_equal(table_snapshot(back), want)
    flat = ht.cann.from_cann_bytes(ht.cann.to_cann_bytes(t).reshape(-1), 3)
    chex.assert_trees_all_equal(table_snapshot(flat), want)


def test_from_cann_bytes_reads_cann_evicted_byte_20():
    t = _table()
    buf = ht.cann.to_cann_bytes(t)
    slot = int(ht.locate(t, np.array([-2], np.int64))[0])
    buf[slot, 20] |= ht.cann.EVICTED  # where CANN's evict kernel puts the bit
    back = ht.cann.from_cann_bytes(buf, 3)
    assert int(back.flags[slot]) & ht.cann.EVICTED and int(back.live) == 1


@pytest.mark.parametrize("corrupt,match", [
    (lambda b: b.__setitem__((0, 16), 2), "state word"),
    (lambda b: b.__setitem__((slice(None), 23), np.where(b[:, 16] == 1, 0, b[:, 23])), "VALID"),
    (lambda b: b.__setitem__((np.argmin(b[:, 16]), 3), 0), "empty slots"),
    (lambda b: b.__setitem__((np.argmax(b[:, 16]), 23), b[np.argmax(b[:, 16]), 23] | 0x40), "flag bits"),
])
def test_from_cann_bytes_rejects_inconsistent_buckets(corrupt, match):
    buf = ht.cann.to_cann_bytes(_table())
    corrupt(buf)
    with pytest.raises(OpArgumentError, match=match):
        ht.cann.from_cann_bytes(buf, 3)


def test_from_cann_bytes_rejects_wrong_width():
    with pytest.raises(OpArgumentError, match="rows of 40 bytes"):
        ht.cann.from_cann_bytes(np.zeros((4, 32), np.uint8), 3)


def test_save_load_round_trip_keeps_the_dropped_count(tmp_path):
    t = ht.set_load_policy(_table(), max_load_factor=1.0)  # lets it fill up
    t, _, _ = ht.lookup_or_insert(t, np.arange(20, dtype=np.int64))  # overflows: dropped > 0
    ht.save(t, tmp_path / "t")
    back = ht.load(tmp_path / "t")
    chex.assert_trees_all_equal(table_snapshot(back), table_snapshot(t))
    assert int(back.dropped) > 0
    assert os.listdir(tmp_path) == ["t"]  # no temporary left behind
