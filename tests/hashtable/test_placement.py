"""Placements: every table operation runs through the table's placement, one code path.

Here what the placement matrix (``tests/hashtable/test_placement_matrix.py``: every
operation on one device, a mesh of one and 8 shards, against the reference) does not hold:
placements as values, refused placements, user load policies, the rerun engine, states of
another placement, a collection on a mesh, predicates as data, uint64 keys with x64, the
clock and donation on a mesh. The 8-device checks beyond the matrix are in
``tests/helpers/sharded_checks.py``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxops.hashtable as ht
from jaxops.capacity.policy import KEEP, settle
from jaxops.core.errors import OpArgumentError

DIM = 2


def _mesh():
    return ht.MeshAxis(jax.sharding.Mesh(np.array(jax.devices()[:1]), ("d",)), "d")


@pytest.fixture(params=["one_device", "mesh_axis"])
def placement(request):
    return None if request.param == "one_device" else _mesh()


def test_placement_of_a_table_is_a_value(placement):
    t = ht.init_table(16, DIM, initializer_mode="constant", placement=placement)
    assert type(t) is (ht.HashTable if placement is None else ht.ShardedHashTable)
    assert (t.placement if placement else ht.ONE_DEVICE) == (placement or ht.OneDevice())
    assert hash(_mesh()) == hash(_mesh()) and _mesh() == _mesh()


def test_bad_placements_and_tables_are_refused_by_name():
    with pytest.raises(OpArgumentError, match=r"InitEmbeddingHashTable: argument 'placement'"):
        ht.init_table(8, DIM, initializer_mode="constant", placement="mesh")
    with pytest.raises(OpArgumentError, match=r"MeshAxis: argument 'axis'.*one of the mesh's"):
        ht.MeshAxis(jax.sharding.Mesh(np.array(jax.devices()[:1]), ("d",)), "x")
    with pytest.raises(OpArgumentError, match=r"MeshAxis: argument 'mesh'"):
        ht.MeshAxis("mesh", "d")
    with pytest.raises(OpArgumentError, match=r"find: argument 'table'.*got dict"):
        ht.find({}, np.array([1], np.int64))


def _quadruple(op, table, demand, donate):
    """A user's policy: every shard four times as large."""
    assert isinstance(demand, ht.LoadDemand) and demand.over.any()
    return ht.resize(table, 4 * demand.shard_size * demand.needed.size)


def test_a_users_load_policy_works_on_every_placement(placement, monkeypatch):
    monkeypatch.setitem(ht.LOAD_POLICIES, "quadruple", _quadruple)
    t = ht.set_load_policy(ht.init_table(8, DIM, initializer_mode="constant",
                                         placement=placement), policy="quadruple")
    t, _, info = ht.lookup_or_insert(t, np.arange(20, dtype=np.int64))
    assert t.bucket_size == 32 and int(t.live) == 20 and int(info.unplaced) == 0
    assert bool(np.all(np.asarray(ht.find(t, np.arange(20, dtype=np.int64))[1])))


def test_a_policy_that_makes_no_room_is_refused(placement, monkeypatch):
    monkeypatch.setitem(ht.LOAD_POLICIES, "nothing", lambda op, table, demand, donate: table)
    t = ht.set_load_policy(ht.init_table(8, DIM, initializer_mode="constant",
                                         placement=placement), policy="nothing")
    with pytest.raises(OpArgumentError, match=r"at most 7 live keys"):
        ht.lookup_or_insert(t, np.arange(20, dtype=np.int64))
    assert int(t.live) == 0


def test_the_rerun_engine_remedies_keeps_or_gives_up():
    short = lambda r: r if r < 5 else None  # noqa: E731
    assert settle(lambda s: s, 1, shortfall=short, remedy=lambda s, r: s * 4) == 16
    assert settle(lambda s: s, 1, shortfall=short, remedy=lambda s, r: KEEP) == 1
    with pytest.raises(ValueError, match="gave up at 2"):
        settle(lambda s: s, 1, shortfall=short, remedy=lambda s, r: s + 1, tries=1,
               give_up=lambda r: (_ for _ in ()).throw(ValueError(f"gave up at {r}")))


def test_a_row_optimizer_state_of_another_placement_is_refused():
    opt = ht.optim.adagrad(0.1)
    one = ht.init_table(16, DIM, initializer_mode="constant")
    sharded = ht.init_table(16, DIM, initializer_mode="constant", placement=_mesh())
    with pytest.raises(OpArgumentError, match=r"adagrad: argument 'state'.*another placement"):
        opt.update(sharded, opt.init(one), np.array([0]), np.ones((1, DIM), np.float32))


def test_a_collection_holds_a_table_on_a_mesh():
    from jaxops.embedding import Bags, EmbeddingCollection, TableConfig

    bags = {"a": Bags.from_lengths(np.array([4, 5, 4]), np.array([2, 1]))}
    pooled = []
    for placement in (None, _mesh()):
        coll = EmbeddingCollection([TableConfig("t", 16, DIM, ("a",), ht.optim.sgd(0.1), 1.0,
                                                placement=placement)])
        state, looked = coll.lookup_or_insert(coll.init(jax.random.key(0)), bags)
        assert type(state["t"].table) is (ht.HashTable if placement is None
                                          else ht.ShardedHashTable)
        pooled.append(np.asarray(coll.pool(looked)["a"]))
    np.testing.assert_array_equal(pooled[0], pooled[1])
    np.testing.assert_array_equal(pooled[0], [[2.0, 2.0], [1.0, 1.0]])


def _compiles_during(fn) -> int:
    """How many XLA compiles ``fn()`` triggers (JAX's compile-duration events)."""
    seen = []

    def listen(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            seen.append(event)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        fn()
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    return len(seen)


def test_evict_if_with_fresh_thresholds_compiles_once(placement):
    """A predicate is data (its threshold traced): a long loop of evict_if calls, each with
    a new threshold, compiles one program, not one per call (which once exhausted the
    process's memory maps after ~3,600 calls)."""
    t = ht.init_table(64, DIM, initializer_mode="constant", placement=placement)
    t, _, _ = ht.lookup_or_insert(t, np.arange(20, dtype=np.int64))
    for i in range(3):  # clock 4: keys 0-4 age 2, 5-9 age 1, 10-14 age 0, 15-19 age 3
        t, _, _ = ht.lookup_or_insert(t, np.arange(5 * i, 5 * i + 5, dtype=np.int64))
    ht.evict_if(t, ht.not_seen_for(1))  # the first call compiles

    def loop():
        for k in range(300):
            out = ht.evict_if(t, ht.not_seen_for(1000 + k))
            out = ht.evict_if(out, ht.counter_below(k % 3))
        jax.block_until_ready(out)

    assert _compiles_during(loop) <= 1
    assert int(ht.evict_if(t, ht.not_seen_for(2)).live) == int(t.live) - 10  # ages 2 and 3


def test_thresholds_traced_in_a_jitted_donated_step(placement):
    """A training step takes its eviction horizon as an argument: one program for every
    horizon, the same evictions as the eager call with a Python int."""
    def step(table, keys, horizon, below):
        table, _, _ = ht.lookup_or_insert(table, keys)
        table = ht.evict_if(table, ht.not_seen_for(horizon))
        return ht.evict_if(table, ht.counter_below(below))

    jitted = jax.jit(step, donate_argnums=0)
    t, eager = (ht.init_table(64, DIM, initializer_mode="constant", key_dtype=np.int32,
                              placement=placement) for _ in range(2))
    batches = [np.arange(5 * (k % 4), 5 * (k % 4) + 5, dtype=np.int32) for k in range(40)]
    t = jitted(t, batches[0], jnp.uint32(50), jnp.uint32(0))
    eager = step(eager, batches[0], 50, 0)

    def loop():
        nonlocal t, eager
        for k, keys in enumerate(batches[1:], 1):
            horizon, below = 2 + k % 3, k % 2
            t = jitted(t, keys, jnp.uint32(horizon), jnp.uint32(below))
            eager = step(eager, keys, horizon, below)
        jax.block_until_ready(t)

    assert _compiles_during(loop) <= 2  # the eager side's calls with fresh ints included
    assert int(t.live) == int(eager.live) > 0
    every = np.arange(20, dtype=np.int32)
    np.testing.assert_array_equal(np.asarray(ht.find(t, every)[1]),
                                  np.asarray(ht.find(eager, every)[1]))
    with pytest.raises(OpArgumentError, match="not_seen_for: argument 'steps'.*uint32"):
        jax.jit(step)(t, batches[0], jnp.int32(3), jnp.uint32(0))
    with pytest.raises(OpArgumentError, match="counter_below: argument 'threshold'"):
        ht.counter_below(jnp.zeros(2, jnp.uint32))


def test_uint64_keys_export_with_x64_on(placement):
    import jaxops

    with jax.enable_x64(True):
        t = ht.init_table(16, DIM, initializer_mode="constant", key_dtype=np.uint64,
                          placement=placement)
        t, _, _ = ht.lookup_or_insert(t, np.array([2**64 - 1, 5], np.uint64))
        t, keys, *_ = ht.export(t)
        assert keys.data.dtype == np.uint64
        assert sorted(ht.host_keys(t, jaxops.refresh(keys)).tolist()) == [5, 2**64 - 1]


def test_step_sets_every_shard_clock_and_donate_consumes_the_table():
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("d",))
    t = ht.init_sharded_table(16, 2, mesh, "d", initializer_mode="constant")
    t, _, info = ht.lookup_or_insert(t, np.array([3, 4], np.int64), step=7)
    slots = np.asarray(info.slots)
    assert np.asarray(t.shards.clock).tolist() == [7]
    assert np.asarray(t.shards.last_access).reshape(-1)[slots].tolist() == [7, 7]
    new, _, info = ht.lookup_or_insert(t, np.array([3], np.int64), donate=True)
    assert t.shards.values.is_deleted() and int(info.inserted) == 0 and int(new.live) == 2
    with pytest.raises(OpArgumentError, match="donate"):  # a rerun would need the table
        ht.lookup_or_insert(new, np.array([3], np.int64), donate=True, route_capacity=1)
    with pytest.raises(OpArgumentError, match="step"):
        ht.lookup_or_insert(t, np.array([3], np.int64), step=2**32)
