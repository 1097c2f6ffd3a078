"""A call costs O(batch): compiled donated steps hold nothing of the table's size but the
table's own (aliased) buffers, and donating a table with its optimizer state works."""

import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxops.hashtable as ht
from jaxops.core.errors import OpArgumentError

SIZE, DIM, N = 100_003, 2, 64  # a size no batch-sized array can have


def _table():
    t = ht.init_table(SIZE, DIM, initializer_mode="constant", constant_value=0.5)
    t, _, _ = ht.lookup_or_insert(t, np.arange(N, dtype=np.int64))
    return t


def _keys():
    return ht.words.as_words(np.arange(N, dtype=np.int64) * 3, "test", "keys")


def _grads():
    return jnp.ones((N, DIM), jnp.float32)


def _state():
    return ht.adam_w_init(_table())


STEPS = {
    "lookup_or_insert": (lambda t, k: ht.lookup_or_insert(t, k)[:2], lambda: (_table(), _keys())),
    "find": (lambda t, k: ht.find(t, k), lambda: (_table(), _keys())),
    "locate": (lambda t, k: ht.locate(t, k), lambda: (_table(), _keys())),
    "evict": (lambda t, k: ht.evict(t, k), lambda: (_table(), _keys())),
    "import_": (lambda t, k: ht.import_(t, k, k, jnp.ones(N, jnp.uint8), _grads()),
                lambda: (_table(), _keys())),
    "apply_adam_w": (lambda t, s, k, g: ht.apply_adam_w(t, s, k, g, lr=0.1, weight_decay=0.01),
                     lambda: (_table(), _state(), _keys(), _grads())),
    "optim.adam": (lambda t, s, sl, g: ht.optim.adam(0.1).update(t, s, sl, g),  # by slot
                   lambda: (_table(), ht.optim.adam(0.1).init(_table()),
                            jnp.arange(N, dtype=jnp.int32) * 7, _grads())),
}


@pytest.mark.parametrize("name", sorted(STEPS))
def test_donated_step_has_no_table_sized_temporary(name):
    fn, args = STEPS[name]
    args = args()
    donate = {"apply_adam_w": (0, 1), "optim.adam": (0, 1), "find": (),
              "locate": ()}.get(name, (0,))
    compiled = jax.jit(fn, donate_argnums=donate).lower(*args).compile()
    text = compiled.as_text()
    # Index and mask scratch over the slots would be s32 / pred arrays of SIZE entries
    # (unless the state holds one: Adam's per-row step count; then memory_analysis decides).
    if not any(x.dtype == jnp.int32 and x.shape == (SIZE,) for x in jax.tree.leaves(args)):
        assert not re.findall(rf"(?:s32|pred|s8|u16)\[{SIZE}\]", text)
    mem = compiled.memory_analysis()
    # Temporaries: the batch's arrays only, far less than one byte per slot.
    assert mem.temp_size_in_bytes < SIZE, mem
    if name not in ("find", "locate"):
        table_bytes = sum(x.nbytes for x in jax.tree.leaves(args[0]) if x.size >= SIZE)
        assert mem.alias_size_in_bytes >= table_bytes, mem  # updated in place


def test_table_and_optimizer_state_can_be_donated():
    table = _table()
    state = ht.adam_w_init(table, amsgrad=True)
    leaves = jax.tree.leaves((table, state))
    ids = [x.unsafe_buffer_pointer() for x in leaves if x.size]
    assert len(set(ids)) == len(ids)  # no buffer shared between two fields

    @jax.jit
    def step(table, state, keys):
        table, rows, info = ht.lookup_or_insert(table, keys)
        return (*ht.apply_adam_w(table, state, keys, rows, lr=0.1, weight_decay=0.0,
                                 amsgrad=True), info)

    step = jax.jit(step, donate_argnums=(0, 1))
    for _ in range(2):
        table, state, info = step(table, state, _keys())
    assert int(info.unplaced) == 0 and int(table.live) == N + N - N // 3 - 1


def test_adam_w_by_slots_equals_by_keys():
    """slots= from the lookup updates exactly what the keys would (key -1 included: it is a
    key like any other), and skips slot -1 and slots without a live key, counting them."""
    rng = np.random.default_rng(0)
    t = ht.init_table(64, DIM, sampled_values=rng.standard_normal((64, DIM)).astype(np.float32))
    keys = np.array([5, -1, 9, 5, -1, 30], np.int64)
    t, _, info = ht.lookup_or_insert(t, keys)
    t = ht.evict(t, np.array([30], np.int64))
    grads = jnp.asarray(rng.standard_normal((6, DIM)).astype(np.float32))
    hyper = dict(lr=0.1, weight_decay=0.01)
    by_keys = ht.apply_adam_w(t, ht.adam_w_init(t), keys, grads, **hyper)
    slots = info.slots.at[2].set(-1)  # a slot -1 is skipped too
    by_slots = ht.apply_adam_w(t, ht.adam_w_init(t), None, grads.at[2].set(0.0), **hyper,
                               slots=slots)
    want_table = ht.apply_adam_w(t, ht.adam_w_init(t), keys[[0, 1, 3, 4, 5]],
                                 grads[jnp.array([0, 1, 3, 4, 5])], **hyper)[0]
    chex.assert_trees_all_close(by_slots[0].values, want_table.values)
    assert int(by_keys[1].skipped) == 1 and int(by_slots[1].skipped) == 2  # 30 evicted, slot -1
    row_of_minus_one = int(info.slots[1])
    assert not np.allclose(by_keys[0].values[row_of_minus_one], t.values[row_of_minus_one])


def test_counters_are_64_bit():
    """dropped and skipped carry into the high word instead of wrapping at 2**32 (x64 off)."""
    t = ht.set_load_policy(ht.init_table(2, 1, initializer_mode="constant"), max_load_factor=1.0)
    t = t.replace(dropped=ht.words.Counter64(jnp.uint32(2**32 - 1), jnp.uint32(0)))
    t, _, info = ht.lookup_or_insert(t, np.arange(5, dtype=np.int64))
    assert int(info.unplaced) == 3 and int(t.dropped) == 2**32 + 2
    state = ht.adam_w_init(t)
    state = state._replace(skipped=ht.words.Counter64(jnp.uint32(2**32 - 1), jnp.uint32(7)))
    _, state = ht.apply_adam_w(t, state, np.array([99], np.int64), jnp.ones((1, 1)), lr=0.1,
                               weight_decay=0.0)
    assert int(state.skipped) == 8 * 2**32


def _entries(table):
    """Live entries as {key: (counter, flags, row)} on the host."""
    from tests.helpers.hashtable_reference import table_snapshot

    snap = table_snapshot(table)
    live = (snap["flags"] & ht.cann.VALID != 0) & (snap["flags"] & ht.cann.EVICTED == 0)
    return {int(k): (int(c), int(f), tuple(v)) for k, c, f, v in zip(
        snap["keys"][live], snap["counters"][live], snap["flags"][live], snap["values"][live])}


def test_load_limit_error_policy_raises_eagerly_and_reports_in_jit():
    t = ht.init_table(10, 1, initializer_mode="constant")
    t, _, _ = ht.lookup_or_insert(t, np.arange(9, dtype=np.int64))  # 9 = 0.9 * 10: allowed
    with pytest.raises(OpArgumentError,
                       match=r"EmbeddingHashTableLookupOrInsert: argument 'table'.*at most 9"):
        ht.lookup_or_insert(t, np.array([100], np.int64))
    with pytest.raises(OpArgumentError, match=r"EmbeddingHashTableImport: argument 'table'"):
        ht.import_(t, np.array([100], np.int64), np.array([1], np.uint64), np.ones(1, np.uint8),
                   np.ones((1, 1), np.float32))
    assert int(t.live) == 9
    _, _, info = jax.jit(ht.lookup_or_insert)(t, ht.words.as_words(np.array([3, 100])))
    assert bool(info.over_limit) and int(info.inserted) == 1
    _, _, info = jax.jit(ht.lookup_or_insert)(t, ht.words.as_words(np.array([3])))
    assert not bool(info.over_limit)


def test_grow_policy_doubles_eagerly_and_keeps_every_entry():
    t = ht.set_load_policy(ht.init_table(16, 2, initializer_mode="constant"), policy="grow")
    t, _, _ = ht.lookup_or_insert(t, np.arange(10, dtype=np.int64))
    t, *_ = ht.export(t)
    before = _entries(t)
    t, rows, info = ht.lookup_or_insert(t, np.arange(5, 40, dtype=np.int64))
    assert t.bucket_size == 64 and t.load_policy == "grow" and int(t.live) == 40
    assert int(info.unplaced) == 0 and not bool(info.over_limit)
    after = _entries(t)
    for k, (c, f, row) in before.items():  # counters (+1 for 5..9), flags, rows kept
        assert after[k] == (c + (k >= 5), f, row)
    with pytest.raises(OpArgumentError, match="argument 'policy'"):
        ht.set_load_policy(t, policy="nope")


def test_compact_reclaims_tombstones_keeping_live_entries():
    t = ht.set_load_policy(ht.init_table(8, 1, initializer_mode="constant"), max_load_factor=1.0)
    t, _, _ = ht.lookup_or_insert(t, np.arange(8, dtype=np.int64))
    t = ht.evict(t, np.arange(6, dtype=np.int64))
    t, *_ = ht.export(t, export_mode="new")
    t, _, info = ht.lookup_or_insert(t, np.arange(6, 7, dtype=np.int64))  # 6 counted again
    kept = _entries(t)
    t = ht.compact(t)
    chex.assert_trees_all_equal(_entries(t), kept)
    assert int(jnp.sum(t.flags != 0)) == 2 and int(t.not_exported) == 0
    t, _, info = ht.lookup_or_insert(t, np.arange(100, 106, dtype=np.int64))
    assert int(info.unplaced) == 0 and int(t.live) == 8
