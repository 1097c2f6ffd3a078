"""Property tests: random sequences of table operations against the sequential reference
(tests/helpers/hashtable_reference.py) — lookups (with explicit steps and donation), evictions by
key, by score and by predicate, resize, compact, save + load, export + import — comparing
every slot's key, counter, flags, last access and row, the counts and the clock after each
operation, with x64 off and on, without and with the "evict" load policy.

Tables are tiny (8 or 16 slots, 13 possible keys) so that probe chains meet, tombstones
are reused and the table fills; examples are few (each new table size compiles the
kernels once)."""

import contextlib

import chex
import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jaxops
import jaxops.hashtable as ht
from jaxops.errors import OpArgumentError
from tests.helpers.hashtable_reference import EVICTED, RefTable, assert_same_table

DIM, BATCH = 2, 4
KEYS = [*range(10), -1, 2**40 + 3, -(2**62)]
THRESHOLDS = (1, 3)
PREDICATES = {**{("counter_below", t): ht.counter_below(t) for t in THRESHOLDS},
              **{("not_seen_for", t): ht.not_seen_for(t) for t in THRESHOLDS}}
REF_PREDICATES = {
    **{("counter_below", t): (lambda t: lambda k, c, la, age: c < t)(t) for t in THRESHOLDS},
    **{("not_seen_for", t): (lambda t: lambda k, c, la, age: age >= t)(t) for t in THRESHOLDS}}

OPS = st.one_of(
    st.tuples(st.just("lookup"), st.lists(st.sampled_from(KEYS), min_size=BATCH,
                                          max_size=BATCH),
              st.one_of(st.none(), st.integers(0, 2**32 - 1)), st.booleans()),
    st.tuples(st.just("evict"), st.lists(st.sampled_from(KEYS), min_size=2, max_size=2)),
    st.tuples(st.just("evict_lowest"), st.integers(0, 5), st.sampled_from(["lru", "lfu"])),
    st.tuples(st.just("evict_if"), st.sampled_from(sorted(PREDICATES))),
    st.tuples(st.just("resize"), st.sampled_from([8, 16])),
    st.just(("compact",)),
    st.just(("save_load",)),
    st.just(("export_import",)),
)


def _initial_rows(size: int) -> np.ndarray:
    return (np.arange(size * DIM, dtype=np.float32).reshape(size, DIM) + 1.0) / 8


def _ref_make_room(ref: RefTable, keys, max_live: int, by: str) -> None:
    """The "evict" load policy in the reference: before the insert, when the new keys would
    pass ``max_live``, evict the lowest-scored live keys the call does not touch."""
    present = {ref.live_slot(int(k)) for k in keys} - {-1}
    new = {int(k) for k in keys if ref.live_slot(int(k)) < 0}
    n = ref.live + len(new) - max_live
    if min(ref.live + len(new), ref.size) <= max_live:
        return
    if n > ref.live - len(present):
        raise ValueError("cannot make room")
    ref.evict_lowest(n, by=by, keep=present)


def _apply(table, ref, op, policy, tmp_path):
    kind = op[0]
    if kind == "lookup":
        keys = np.array(op[1], np.int64)
        step, donate = op[2], op[3]
        if policy == "evict":
            try:
                _ref_make_room(ref, keys, table.max_live, "lru")
            except ValueError:
                with pytest.raises(OpArgumentError, match="live keys"):
                    ht.lookup_or_insert(table, keys, step=step)
                return table, ref
        table, rows, info = ht.lookup_or_insert(table, keys, step=step, donate=donate)
        want_rows, want = ref.lookup_or_insert(keys, step=step)
        chex.assert_trees_all_equal(np.asarray(info.slots), want["slots"])
        chex.assert_trees_all_equal((int(info.inserted), int(info.unplaced)),
                                    (want["inserted"], want["unplaced"]))
        chex.assert_trees_all_equal(np.asarray(rows), want_rows)
    elif kind == "evict":
        keys = np.array(op[1], np.int64)
        table = ht.evict(table, keys, const_val=-1.0)
        ref.evict(keys, const_val=-1.0)
    elif kind == "evict_lowest":
        table = ht.evict_lowest(table, op[1], by=op[2], const_val=-2.0)
        ref.evict_lowest(op[1], by=op[2], const_val=-2.0)
    elif kind == "evict_if":
        table = ht.evict_if(table, PREDICATES[op[1]], const_val=-3.0)
        ref.evict_if(REF_PREDICATES[op[1]], const_val=-3.0)
    elif kind in ("resize", "compact"):
        size = op[1] if kind == "resize" else table.bucket_size
        if ref.live > size:
            with pytest.raises(OpArgumentError, match="live keys"):
                ht.resize(table, size)
            return table, ref
        table = ht.resize(table, size) if kind == "resize" else ht.compact(table)
        ref = ref.resize(np.zeros((size, DIM), np.float32))
    elif kind == "save_load":
        ht.save(table, tmp_path / "t", force=True)
        table = ht.load(tmp_path / "t")
    else:  # export everything, import it into a fresh table of the same size
        table, *outs = ht.export(table)
        keys, counters, flags, values = jaxops.refresh(outs)
        keys, counters = ht.words.to_host_int64(keys), ht.words.to_host_int64(counters, signed=False)
        fresh = ht.init_table(table.bucket_size, DIM, initializer_mode="constant")
        fresh = ht.set_load_policy(fresh, max_load_factor=1.0)  # a resize may have passed it
        want = ref.export()
        limit, policy_name = table.max_load_factor, table.load_policy
        table, info = ht.import_(fresh, keys, counters, flags, values)
        table = ht.set_load_policy(table, max_load_factor=limit, policy=policy_name)
        ref = RefTable(np.zeros((table.bucket_size, DIM), np.float32))
        ref.import_(want["keys"], want["counters"], want["filter_flags"], want["values"])
        assert int(info.unplaced) == 0
    return table, ref


def _run(ops, policy, tmp_path):
    table = ht.init_table(8, DIM, sampled_values=_initial_rows(8))
    table = ht.set_load_policy(table, max_load_factor=0.75 if policy == "evict" else 1.0,
                               policy="evict" if policy == "evict" else "error")
    ref = RefTable(_initial_rows(8))
    for op in ops:
        table, ref = _apply(table, ref, op, policy, tmp_path)
        assert_same_table(table, ref)
    return ref


_SETTINGS = settings(max_examples=6, deadline=None, derandomize=True,
                     suppress_health_check=[HealthCheck.function_scoped_fixture,
                                            HealthCheck.too_slow])


@pytest.mark.parametrize("x64,policy", [(False, "none"), (False, "evict"), (True, "none")])
def test_random_operation_sequences_match_reference(tmp_path, policy, x64):
    @_SETTINGS
    @given(st.lists(OPS, min_size=4, max_size=10))
    def check(ops):
        with jax.enable_x64(True) if x64 else contextlib.nullcontext():
            _run(ops, policy, tmp_path)

    check()


def test_a_long_fixed_sequence_reaches_reuse_and_eviction_states(tmp_path):
    """The states the properties are about do occur: a new key in another key's tombstone,
    evictions by score, a wrapped step."""
    ops = [("lookup", [1, 2, 3, 4], None, False), ("lookup", [5, 6, 7, 8], 2**32 - 1, True),
           ("evict_lowest", 3, "lfu"), ("lookup", [9, -1, 1, 2], 0, False),
           ("evict_if", ("not_seen_for", 1)), ("lookup", [3, 4, 5, 6], None, True),
           ("save_load",), ("export_import",), ("evict", [3, 9]), ("lookup", [7, 0, 2, 8], 5, False),
           ("compact",), ("resize", 16), ("evict_lowest", 2, "lru"),
           ("lookup", [2**40 + 3, -(2**62), 0, 1], None, False)]
    table = ht.init_table(8, DIM, sampled_values=_initial_rows(8))
    table = ht.set_load_policy(table, max_load_factor=1.0)
    ref = RefTable(_initial_rows(8))
    reused = False
    for op in ops:
        tombstones = {s: k for s, k in enumerate(ref.keys) if ref.flags[s] & EVICTED}
        table, ref = _apply(table, ref, op, "none", tmp_path)
        assert_same_table(table, ref)
        reused |= any(ref.keys[s] != k and not ref.flags[s] & EVICTED
                      for s, k in tombstones.items())
    assert reused
