"""``export(size=)`` (capacity, overflow report, only exported entries marked) and
``export_chunks`` against the one-shot export and the plain-Python reference."""

import chex
import jax
import numpy as np
import pytest

import jaxops
import jaxops.hashtable as ht
from tests.helpers.hashtable_reference import RefTable, table_snapshot


def _table(seed=0, size=64, n=40):
    rng = np.random.default_rng(seed)
    t = ht.init_table(size, 3, sampled_values=rng.standard_normal((size, 3)).astype(np.float32))
    keys = rng.choice(2**40, n, replace=False).astype(np.int64) - 2**39
    t, _, _ = ht.lookup_or_insert(t, np.concatenate([keys, keys[::3]]),
                                  filter_mode="counter", filter_freq=2)
    t, *_ = ht.export(t, size=10)  # some exported before
    return ht.evict(t, keys[:3])


def _host(outs):
    keys, counters, flags, values = (jaxops.refresh(o, allow_truncated=True) for o in outs)
    return (ht.words.to_host_int64(keys), ht.words.to_host_int64(counters, signed=False), np.asarray(flags),
            np.asarray(values))


@pytest.mark.parametrize("mode,filtered", [("all", False), ("new", False), ("all", True)])
@pytest.mark.parametrize("size", [0, 1, 7, 30, 64])
def test_export_size_exports_a_prefix_and_marks_only_it(mode, filtered, size):
    t = _table()
    _, *full = ht.export(t, export_mode=mode, filtered_export_flag=filtered)
    full = _host(full)
    count = len(full[0])
    marked, *outs = ht.export(t, export_mode=mode, filtered_export_flag=filtered, size=size)
    kept = min(size, count)
    chex.assert_shape(outs[3].data, (size, 3))
    for got, want in zip(_host(outs), full):
        chex.assert_trees_all_equal(got, want[:kept])
    assert bool(outs[0].overflowed()) == (count > size)
    assert int(outs[3].lost(axis=0)) == count - kept
    # Only what came out is marked: the same export of the rest finds the others.
    ref = RefTable.from_table(t).export(mode, filtered)
    for got, name in zip(full, ("keys", "counters", "filter_flags", "values")):
        chex.assert_trees_all_equal(got, ref[name])
    exported = set(full[0][:kept].tolist())
    flags = np.asarray(marked.flags)
    keys = ht.words.to_host_int64(ht.words.join_words(marked.keys))
    before = np.asarray(t.flags)
    newly = (flags & ht.cann.EXPORT) != (before & ht.cann.EXPORT)
    assert set(keys[newly].tolist()) <= exported
    assert int(t.not_exported) - int(marked.not_exported) == int(newly.sum())
    if mode == "new" and not filtered:
        _, *rest = ht.export(marked, export_mode="new")
        assert sorted(_host(rest)[0].tolist() + list(exported)) == sorted(full[0].tolist())


def test_export_size_inside_jit_reports_overflow():
    t = _table()
    f = jax.jit(lambda t: ht.export(t, size=5)[1:])
    keys = f(t)[0]
    assert bool(keys.overflowed()) and int(keys.lost(axis=0)) == int(t.live) - 5


def test_export_size_rejects_bad_capacities():
    with pytest.raises(jaxops.errors.OpArgumentError, match="size"):
        ht.export(_table(), size=-1)


@pytest.mark.parametrize("chunk", [1, 5, 64, 1000])
@pytest.mark.parametrize("mode,filtered", [("all", False), ("new", True)])
def test_export_chunks_matches_export(chunk, mode, filtered):
    t = _table(seed=chunk)
    want_table, *want = ht.export(t, export_mode=mode, filtered_export_flag=filtered)
    got_table, chunks = ht.export_chunks(t, chunk, export_mode=mode,
                                         filtered_export_flag=filtered)
    chunks = list(chunks)
    assert all(len(c.keys) for c in chunks)
    got = [np.concatenate([getattr(c, f) for c in chunks]) if chunks else None
           for f in ("keys", "counters", "filter_flags", "values")]
    for g, w in zip(got, _host(want)):
        chex.assert_trees_all_equal(g, w)
    slots = np.concatenate([c.slots for c in chunks])
    chex.assert_trees_all_equal(ht.words.to_host_int64(ht.words.join_words(t.keys))[slots], got[0])
    chex.assert_trees_all_equal(table_snapshot(got_table), table_snapshot(want_table))


def test_export_chunks_rejects_bad_arguments():
    with pytest.raises(jaxops.errors.OpArgumentError, match="chunk_slots"):
        ht.export_chunks(_table(), 0)
    with pytest.raises(jaxops.errors.OpArgumentError, match="export_mode"):
        ht.export_chunks(_table(), 4, export_mode="old")
