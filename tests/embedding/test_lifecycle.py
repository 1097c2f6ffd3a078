"""A table's lifecycle in a jitted, donated training loop: reports, then maintain.

The tables are sized to fill in the middle of the run. Under ``grow`` and ``evict`` no id
is lost; under ``error`` the maintain call after the limit is passed raises, naming the
table. Every step is one jitted function with its state donated, as a user writes it.

Programs are shared: a configuration's collection and its jitted step are made once per
file (a new collection would trace the same step again), the batches are drawn once, and
the grow run on the 64-slot table serves both tests that read it.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxops.hashtable as ht
from jaxops.core.errors import OpArgumentError
from jaxops.embedding import Bags, EmbeddingCollection, TableConfig

DIM, STEPS, IDS = 4, 8, 24  # 8 steps of 24 ids each, most of them new: 64 slots fill at step 3
ONES = jax.nn.initializers.ones  # a JAX initializer: grown slots must get it, not a constant


@functools.cache
def _collection(policy: str, slots: int = 64, initializer=0.25) -> EmbeddingCollection:
    return EmbeddingCollection([TableConfig(
        "ids", slots, DIM, ("user",), ht.optim.adagrad(0.1, initial_accumulator_value=0.1),
        initializer, load_policy=policy, max_load_factor=0.75)])


@functools.cache
def _batches(seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"user": Bags.from_lengths(rng.integers(0, 200, IDS).astype(np.int64) + 1000 * i,
                                       np.full(8, 3, np.int32))} for i in range(STEPS)]


@functools.cache
def _step(coll: EmbeddingCollection):
    @functools.partial(jax.jit, donate_argnums=0)
    def step(state, batch):
        state, looked = coll.lookup_or_insert(state, batch)

        def loss(rows):
            return jnp.sum(coll.pool(looked, rows)["user"] ** 2)

        value, grads = jax.value_and_grad(loss)(looked.rows)
        return coll.apply_gradients(state, looked, grads), value

    return step


def _train(coll: EmbeddingCollection, maintain: bool = True):
    step, state, reports = _step(coll), coll.init(jax.random.key(0)), []
    for batch in _batches():
        state, _ = step(state, batch)
        if maintain:
            state, done = coll.maintain(state)
            reports.append(done["ids"])
    return state, reports, step


def _rows_by_key(table) -> dict:
    _, chunks = ht.export_chunks(table)
    return {int(k): v for c in chunks for k, v in zip(c.keys, c.values)}


@pytest.fixture(scope="module")
def grown():
    """The grow run on 64 slots (its new slots start at ONES), and the same run on 1,024
    slots, which never fill."""
    state, reports, step = _train(_collection("grow", initializer=ONES))
    return state, reports, step, _train(_collection("grow", slots=1024, initializer=ONES))


def test_grow_keeps_every_id_its_row_and_its_state(grown):
    state, reports, step, (big, big_reports, _) = grown
    assert sum(r.lost for r in reports) == 0 and sum(r.grown for r in reports) >= 2
    table = state["ids"].table
    assert table.bucket_size >= 256 and int(table.dropped) == 0
    # The same run on a table that never fills: the same ids, rows and accumulators.
    assert sum(r.grown for r in big_reports) == 0
    got, want = _rows_by_key(table), _rows_by_key(big["ids"].table)
    assert got.keys() == want.keys() and len(got) == int(table.live)
    np.testing.assert_allclose(np.stack([got[k] for k in want]), np.stack(list(want.values())),
                               rtol=1e-6)
    keys = np.array(sorted(want), np.int64)
    acc = lambda s: np.asarray(s["ids"].opt_state.sum_of_squares)[  # noqa: E731
        np.asarray(ht.locate(s["ids"].table, keys))]
    np.testing.assert_allclose(acc(state), acc(big), rtol=1e-6)
    # One compile per table size: growth is geometric.
    assert step._cache_size() == 1 + sum(r.grown for r in reports)


def test_grow_gives_new_slots_the_configured_initializer(grown):
    state, reports, _, _ = grown
    table = state["ids"].table
    free = np.asarray(table.flags) == 0
    assert sum(r.grown for r in reports) >= 1 and free.any()
    assert np.all(np.asarray(table.values)[free] == 1.0)


def test_evict_keeps_the_table_under_its_limit_and_loses_no_id():
    # 96 live ids allowed; each call keeps room for twice a step's new ids (48).
    state, reports, _ = _train(_collection("evict", slots=128))
    table = state["ids"].table
    assert sum(r.lost for r in reports) == 0 and int(table.dropped) == 0
    assert table.bucket_size == 128 and int(table.live) <= table.max_live - 2 * 20
    evicting = [r for r in reports if r.action == "evict"]
    assert len(evicting) >= 3 and all(0 < r.evicted < r.live for r in evicting)
    # The most recently used ids stay: every id of the last batch is live.
    last = np.asarray(_batches()[-1]["user"].ids.lo)
    assert bool(np.all(np.asarray(ht.find(table, last.astype(np.int64))[1])))


def test_an_evicted_id_comes_back_with_a_fresh_state():
    coll = _collection("evict")
    state = coll.init(jax.random.key(0))
    table, opt = state["ids"].table, state["ids"].opt_state
    optim = coll.tables[0].optimizer
    table, _, info = ht.lookup_or_insert(table, np.arange(40, dtype=np.int64))
    table, opt = optim.update(table, opt, info.slots, np.ones((40, DIM), np.float32))
    table, (opt,), report = ht.maintain(table, [(opt, optim.init)], headroom=20)
    assert report.action == "evict" and report.evicted == 40 + 20 - table.max_live
    gone = np.flatnonzero(~np.asarray(ht.find(table, np.arange(40, dtype=np.int64))[1]))
    slots = np.asarray(ht.locate(table, gone))  # evicted: no live slot
    assert gone.size == report.evicted and np.all(slots == -1)
    table, _, info = ht.lookup_or_insert(table, gone)  # they come back (their tombstones)
    acc = np.asarray(opt.sum_of_squares)[np.asarray(info.slots)]
    assert np.all(acc == 0.1), acc  # the initial accumulator, not the old one


def test_error_raises_at_the_maintain_call_naming_the_table():
    coll = _collection("error")
    step, state = _step(coll), coll.init(jax.random.key(0))
    with pytest.raises(OpArgumentError, match=r"maintain: argument 'ids'.*load policy 'error'"
                                              r".*set_load_policy\(ids, policy='grow'"):
        for batch in _batches():
            state, _ = step(state, batch)
            state, _ = coll.maintain(state)


def test_reports_accumulate_inside_jit_until_maintain():
    coll = _collection("grow", slots=1024, initializer=ONES)  # the big run's step
    step, state = _step(coll), coll.init(jax.random.key(0))
    for batch in _batches()[:3]:
        state, _ = step(state, batch)
    report = jax.device_get(state["ids"].report)
    assert int(report.steps) == 3 and int(report.inserted) == int(state["ids"].table.live)
    assert 0 < int(report.max_inserted) <= IDS and int(report.unplaced) == 0
    state, done = coll.maintain(state)
    assert int(state["ids"].report.steps) == 0 and done["ids"].action == "none"


def test_a_full_table_inside_jit_counts_every_lost_id():
    state, _, _ = _train(_collection("grow", slots=16), maintain=False)
    report = jax.device_get(state["ids"].report)
    table = state["ids"].table
    assert int(report.unplaced) > 0 and bool(report.over_limit)
    assert int(report.unplaced) == int(table.dropped)
    assert int(report.inserted) == int(table.live) == 16


def test_the_nnx_layer_maintains_between_jitted_steps():
    from flax import nnx

    import jaxops.nnx

    # ONES, as the grow fixture: the table's grow programs are those it traced
    embed = jaxops.nnx.Embedding(_collection("grow", initializer=ONES), rngs=nnx.Rngs(0))

    @nnx.jit(donate_argnums=0)
    def step(embed, batch):
        looked = embed.lookup_or_insert(batch)
        grads = jax.grad(lambda rows: jnp.sum(embed.pool(looked, rows)["user"] ** 2))(
            looked.rows)
        embed.apply_gradients(looked, grads)

    lost = grown = 0
    for batch in _batches():
        step(embed, batch)
        done = embed.maintain()["ids"]
        lost, grown = lost + done.lost, grown + done.grown
    assert lost == 0 and grown >= 2 and embed.state["ids"].table.bucket_size >= 256


def test_bags_of_ids_jax_may_have_narrowed_are_refused():
    coll = EmbeddingCollection([TableConfig("t", 64, 2, ("a",), ht.optim.sgd(0.1), 0.5)])
    state = coll.init(jax.random.key(0))
    ids = np.array([2**40 + 5, 5], np.int64)  # both narrow to 5 at the jit boundary

    def live(state, ids):
        column = jax.tree.map(lambda x: x[:, None], ids)  # an array, or Words64 of arrays
        return coll.lookup_or_insert(state, {"a": Bags.from_dense(column)})[0]["t"].table.live

    with jax.enable_x64(False), pytest.raises(  # only with x64 off does jit narrow them
            OpArgumentError, match=r"features\['a'\].*narrowed.*as_words"):
        jax.jit(live)(state, ids)
    assert int(jax.jit(live)(state, ht.words.as_words(ids))) == 2  # word pairs: both ids
    small = EmbeddingCollection([TableConfig("t", 64, 2, ("a",), ht.optim.sgd(0.1), 0.5,
                                             key_dtype=np.int32)])
    assert int(jax.jit(lambda s, x: small.lookup_or_insert(s, {"a": Bags.from_dense(x[:, None])})[0][
        "t"].table.live)(small.init(jax.random.key(0)), jnp.array([7, -7], jnp.int32))) == 2
