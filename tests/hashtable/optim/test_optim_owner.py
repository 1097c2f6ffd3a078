"""A slot's row-optimizer state belongs to its key: a key that takes another key's slot
(tombstone reuse by lookup_or_insert or import_, after evict, evict_lowest or evict_if;
compact moving a key), or an evicted key that comes back, starts from the optimizer's
initial state, never from the state of the key (or the earlier life of the key) that held
the slot. Small tables (8 slots, dim 2): one compile per optimizer.
"""

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxops.hashtable as ht

SIZE, DIM = 8, 2
G = np.array([[1.0, -2.0]], np.float32)
ROW = 0.5  # every fresh row, and the row evict leaves


def _same_home_keys(count: int = 2) -> list[int]:
    """Keys sharing one home slot in a SIZE-slot table: the later ones walk past (or take
    the tombstone of) the first."""
    keys = np.arange(1, 400, dtype=np.int64)
    words = ht.words.as_words(keys, "test", "keys")
    home = np.asarray(ht.cann.home_slot(words.lo, words.hi, SIZE))
    same = keys[home == home[0]][:count]
    assert same.size == count
    return [int(k) for k in same]


A, B = _same_home_keys()

FAMILIES = {
    "adagrad": lambda: ht.optim.adagrad(0.2, initial_accumulator_value=0.05),
    "rowwise_adagrad": lambda: ht.optim.rowwise_adagrad(0.2, initial_accumulator_value=0.1),
    "adam": lambda: ht.optim.adam(0.05),
    "adamw": lambda: ht.optim.adamw(0.05, weight_decay=0.1),
    "ftrl": lambda: ht.optim.ftrl(0.5, l1=0.05),
    "from_optax": lambda: ht.optim.from_optax(optax.sgd(0.1, momentum=0.9)),
}


ADAGRAD = FAMILIES["adagrad"]()  # one instance: its update compiles once for all tests


def _fresh():
    return ht.init_table(SIZE, DIM, initializer_mode="constant", constant_value=ROW)


def _insert(t, key):
    t, _, info = ht.lookup_or_insert(t, np.array([key], np.int64))
    return t, info.slots


def _rows_at(state, slot: int) -> list[np.ndarray]:
    """Every per-slot leaf of ``state`` (the owner's key words included, not the slot's
    epoch: a reused slot has seen more insertions than a fresh table's) at ``slot``."""
    state = state._replace(skipped=None, owner=state.owner._replace(epoch=None))
    return [np.asarray(x)[slot] for x in jax.tree.leaves(state)
            if np.ndim(x) >= 1 and np.shape(x)[0] == SIZE]


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_a_new_key_in_an_evicted_slot_starts_from_the_initial_state(name):
    opt = ADAGRAD if name == "adagrad" else FAMILIES[name]()
    t, slots = _insert(_fresh(), A)
    state = opt.init(t)
    for _ in range(2):  # A's state is far from the initial one
        t, state = opt.update(t, state, slots, G)
    t, reused = _insert(ht.evict(t, np.array([A], np.int64), const_val=ROW), B)
    assert int(reused[0]) == int(slots[0])  # B took A's tombstone
    t, state = opt.update(t, state, reused, -G)
    want, want_slots = _insert(_fresh(), B)  # B in a table that never held A
    want, want_state = opt.update(want, opt.init(want), want_slots, -G)
    s = int(slots[0])
    assert int(want_slots[0]) == s
    chex.assert_trees_all_equal(np.asarray(t.values)[s], np.asarray(want.values)[s])
    chex.assert_trees_all_equal(_rows_at(state, s), _rows_at(want_state, s))


def _fresh_accumulator() -> np.ndarray:
    return np.float32(0.05) + G[0] * G[0]  # adagrad after one step from its initial value


def _a_trained(scale: float = 3.0):
    """A table holding key A, and an adagrad state after one step on A."""
    t, slots = _insert(_fresh(), A)
    t, state = ADAGRAD.update(t, ADAGRAD.init(t), slots, scale * G)
    return t, slots, state


def _accumulator_after_a_step(t, state, slots) -> np.ndarray:
    _, state = ADAGRAD.update(t, state, slots, G)
    return np.asarray(state.sum_of_squares)[int(slots[0])]


@pytest.mark.parametrize("evictor,inserter", [("evict_lowest", "import_"),
                                               ("evict_if", "lookup_or_insert")])
def test_every_way_a_key_takes_a_tombstone_starts_fresh(evictor, inserter):
    t, slots, state = _a_trained()
    t = ht.evict_lowest(t, 1, const_val=ROW) if evictor == "evict_lowest" else \
        ht.evict_if(t, ht.counter_below(2), const_val=ROW)
    if inserter == "import_":
        t, info = ht.import_(t, np.array([B], np.int64), np.array([5], np.uint64),
                             np.array([0], np.uint8), np.full((1, DIM), ROW, np.float32))
        reused = info.slots
    else:
        t, reused = _insert(t, B)
    assert int(reused[0]) == int(slots[0])
    chex.assert_trees_all_equal(_accumulator_after_a_step(t, state, reused), _fresh_accumulator())


def test_a_key_compact_moves_does_not_take_the_state_left_in_its_new_slot():
    t, slot_a, state = _a_trained()
    t, slot_b = _insert(t, B)  # walks past A
    t = ht.compact(ht.evict(t, np.array([A], np.int64)), constant_value=ROW)
    moved = ht.locate(t, np.array([B], np.int64))
    assert int(moved[0]) == int(slot_a[0]) != int(slot_b[0])  # B now sits in A's old slot
    chex.assert_trees_all_equal(_accumulator_after_a_step(t, state, moved), _fresh_accumulator())


@pytest.mark.parametrize("evictor", ["evict", "evict_lowest", "evict_if"])
def test_a_key_reviving_its_own_tombstone_starts_fresh(evictor):
    """An evicted key's state is gone: coming back (into its own tombstone) it starts from
    the initial state, as a new key does (the slot's epoch changed)."""
    t, slots, state = _a_trained(1.0)
    t = {"evict": lambda: ht.evict(t, np.array([A], np.int64)),
         "evict_lowest": lambda: ht.evict_lowest(t, 1),
         "evict_if": lambda: ht.evict_if(t, ht.counter_below(2))}[evictor]()
    t, revived = _insert(t, A)
    assert int(revived[0]) == int(slots[0])
    chex.assert_trees_all_equal(_accumulator_after_a_step(t, state, revived), _fresh_accumulator())


@pytest.mark.parametrize("by,x64", [("keys", False), ("slots", True)])
def test_apply_adam_w_zeroes_the_moments_of_a_slot_another_key_took(x64, by):
    """CANN's AdamW keeps table-wide beta powers: the new key's moments start at zero, as a
    never-touched row's do at the same global step."""
    lr = dict(lr=0.1, weight_decay=0.01)

    def apply(t, state, key, slots, g):
        if by == "slots":
            return ht.apply_adam_w(t, state, None, g, slots=slots, **lr)
        return ht.apply_adam_w(t, state, np.array([key], np.int64), g, **lr)

    with jax.enable_x64(x64):
        t, slots = _insert(_fresh(), A)
        t, state = apply(t, ht.adam_w_init(t), A, slots, G)
        t, reused = _insert(ht.evict(t, np.array([A], np.int64), const_val=ROW), B)
        assert int(reused[0]) == int(slots[0])
        t, state = apply(t, state, B, reused, -G)
        want, want_slots = _insert(_fresh(), B)
        want, want_state = ht.apply_adam_w(want, ht.adam_w_init(want), np.array([A + B], np.int64),
                                           G, **lr)  # an absent key: the beta powers advance
        want, want_state = apply(want, want_state, B, want_slots, -G)
    s = int(slots[0])
    chex.assert_trees_all_equal(np.asarray(t.values)[s], np.asarray(want.values)[s])
    chex.assert_trees_all_equal(_rows_at(state, s), _rows_at(want_state, s))


def test_state_buffers_are_not_the_tables():
    """The owner record is a copy of the key words: table and state can be donated together."""
    t, _ = _insert(_fresh(), A)
    for state in [make().init(t) for make in FAMILIES.values()] + [ht.adam_w_init(t)]:
        pointers = [x.unsafe_buffer_pointer() for x in jax.tree.leaves((t, state))]
        assert len(set(pointers)) == len(pointers), type(state).__name__


class _NoOwner(NamedTuple):
    rows: jax.Array
    skipped: jax.Array


def test_a_state_with_per_slot_rows_must_record_owners():
    bad = ht.optim.make_row_optimizer(
        "bad", lambda t: _NoOwner(jnp.zeros(t.values.shape), jnp.zeros((), jnp.int32)),
        lambda w, g, s, step: (w - g, s))
    with pytest.raises(ValueError, match="hashtable.optim.bad: argument 'init_state'"):
        bad.init(_fresh())


def test_a_sharded_table_keeps_the_rule_on_every_shard():
    """One shard on this process's device: the sharded update runs the same kernels."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("d",))
    t = ht.init_sharded_table(SIZE, DIM, mesh, "d", initializer_mode="constant",
                              constant_value=ROW)
    t, _, info = ht.lookup_or_insert(t, np.array([A], np.int64))
    state, adam_state = ADAGRAD.init(t), ht.adam_w_init(t)
    t, state = ADAGRAD.update(t, state, info.slots, 3 * G)
    t, adam_state = ht.apply_adam_w(t, adam_state, None, G, slots=info.slots, lr=0.1,
                                    weight_decay=0.0)
    t = ht.evict(t, np.array([A], np.int64), const_val=ROW)
    t, _, reused = ht.lookup_or_insert(t, np.array([B], np.int64))
    assert int(reused.slots[0]) == int(info.slots[0])
    t, state = ADAGRAD.update(t, state, reused.slots, G)
    t, adam_state = ht.apply_adam_w(t, adam_state, None, G, slots=reused.slots, lr=0.1,
                                    weight_decay=0.0)
    s = int(info.slots[0])
    chex.assert_trees_all_equal(np.asarray(state.sum_of_squares)[0, s], _fresh_accumulator())
    # Fresh moments after one step, in the kernel's float32 terms: -(b - 1) g and -(b - 1) g².
    one_minus = lambda b: -(np.float32(b) + np.float32(-1))  # noqa: E731
    chex.assert_trees_all_close(np.asarray(adam_state.m)[0, s], one_minus(0.9) * G[0], rtol=1e-6)
    chex.assert_trees_all_close(np.asarray(adam_state.v)[0, s], one_minus(0.999) * G[0] * G[0],
                                rtol=1e-6)


def revived_and_new_rows(placement, a: int, b: int, c: int) -> tuple[np.ndarray, np.ndarray]:
    """A jitted training loop that donates the table and its Adagrad state: keys ``a`` and
    ``b`` train, ``a`` is evicted by a traced ``evict_if`` threshold, then ``a`` comes back
    beside the new key ``c`` with the same gradient (evicted rows hold the initial value, as
    new ones do). Returns the rows of ``a`` and ``c``
    after that step (equal when ``a`` started fresh, as ``c`` did). Shared with the
    8-device check in ``tests/helpers/sharded_checks.py``."""
    opt = ht.optim.adagrad(0.2, initial_accumulator_value=0.05)

    @jax.jit
    def step(t, s, keys, threshold):
        t, rows, info = ht.lookup_or_insert(t, keys)
        t, s = opt.update(t, s, info.slots, jnp.ones_like(rows))
        return ht.evict_if(t, ht.counter_below(threshold), const_val=ROW), s

    step = jax.jit(step, donate_argnums=(0, 1))
    t = ht.init_table(64, DIM, initializer_mode="constant", constant_value=ROW,
                      placement=placement)
    s = opt.init(t)
    ids = lambda *k: ht.words.as_words(np.array(k, np.int64), "test", "keys")  # noqa: E731
    t, s = step(t, s, ids(a, b), jnp.uint32(0))
    t, s = step(t, s, ids(b, b), jnp.uint32(2))  # a's counter is 1: evicted; b's is 3
    assert not bool(ht.find(t, ids(a))[1][0])
    t, s = step(t, s, ids(a, c), jnp.uint32(0))
    rows = np.asarray(ht.lookup(t, ids(a, c)))
    return rows[0], rows[1]


@pytest.mark.parametrize("placement", ["one device", "mesh of one"])
def test_a_revived_key_starts_fresh_in_a_jitted_donated_loop(placement):
    """Issue 30 #7: a key evicted and coming back trains as a new key does (before, it
    kept its accumulator unless another key took its tombstone first)."""
    where = None if placement == "one device" else ht.MeshAxis(
        jax.sharding.Mesh(np.array(jax.devices()[:1]), ("s",)), "s")
    revived, new = revived_and_new_rows(where, A, B, 1000)
    np.testing.assert_array_equal(revived, new)
    assert not np.array_equal(revived, np.full(DIM, ROW, np.float32))  # it did train
