"""The 8-device checks that the placement matrix does not hold, run in the 8-device child.

``tests/helpers/eight_devices.py`` runs each of :data:`CHECKS` (after the matrix's rows on 8
shards) in a process with 8 forced host devices, and ``tests/hashtable/test_sharded.py``
reports each as its own test. These are what holds beyond "each operation on 8 shards
equals the reference": routing overflow and its reports, the load policies per shard,
checkpoints re-owned onto other shard counts, export and import across shard counts, a
table inside the user's ``shard_map``, a 2**18-slot table, the embedding collection and the
training recipe on 8 devices as on one, and a run of 2 processes (``sharded_multiprocess.py``,
started at the beginning: :func:`start_two_processes`) whose checkpoints restore here.

The checks share compiled programs (compiling dominates their time): every batch has
``BATCH`` keys, the tables come from :func:`fresh_pair`, and a new check should reuse the
shapes and attributes (``COUNTER``) of the existing ones where its property allows.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jaxops.hashtable as ht  # noqa: E402
from jaxops.core.errors import CapacityOverflowError, OpArgumentError  # noqa: E402
from jaxops.embedding import Bags, EmbeddingCollection, TableConfig  # noqa: E402
from jaxops.hashtable.cann import EVICTED, VALID  # noqa: E402
from jaxops.hashtable.words import to_host_int64  # noqa: E402

DIM = 4
CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def mesh_of(n: int) -> Mesh:
    return Mesh(np.array(jax.devices()[:n]), ("shard",))


def _host_slots(table):
    """``(local table, host reader, flags, keys)`` of either table type, slots flattened."""
    t = table.shards if isinstance(table, ht.ShardedHashTable) else table
    get = lambda x: np.asarray(jax.device_get(x)).reshape(-1)  # noqa: E731
    return t, get, get(t.flags), ht.words.to_host_int64(ht.words.Words64(get(t.key_lo), get(t.key_hi)))


def entries(table, live_only: bool = False) -> dict:
    """``{key: (counter, flags, row bytes)}`` of every used slot (tombstones included
    unless ``live_only``), from a HashTable or a ShardedHashTable."""
    t, get, flags, keys = _host_slots(table)
    counters = ht.words.to_host_int64(ht.words.Words64(get(t.counter_lo), get(t.counter_hi)), signed=False)
    rows = np.asarray(jax.device_get(t.values)).reshape(-1, t.embedding_dim)
    used = (flags & VALID) != 0
    if live_only:
        used &= (flags & EVICTED) == 0
    return {int(k): (int(c), int(f), r.tobytes()) for k, c, f, r in
            zip(keys[used], counters[used], flags[used], rows[used])}


def scores(table) -> tuple[dict, list]:
    """``{key: last_access}`` of the live entries, and the clock(s), of either table type."""
    t, get, flags, keys = _host_slots(table)
    live = ((flags & VALID) != 0) & ((flags & EVICTED) == 0)
    return ({int(k): int(a) for k, a in zip(keys[live], get(t.last_access)[live])},
            sorted(set(get(t.clock).tolist())))


def same(a, b, what: str, exact_rows: bool = True) -> None:
    """The same keys with the same counters and flags, and the same rows: bit for bit, or
    (``exact_rows=False``, after optimizer steps) to float rounding: XLA fuses an update
    differently in different programs; one table eager vs jitted differs the same way."""
    def row(entry):
        return np.frombuffer(entry[2], np.float32)

    def differs(k):
        if a[k][:2] != b[k][:2]:
            return True
        return a[k] != b[k] if exact_rows else not np.allclose(row(a[k]), row(b[k]), rtol=1e-5,
                                                               atol=1e-6)

    only_a, only_b = set(a) - set(b), set(b) - set(a)
    diff = [k for k in set(a) & set(b) if differs(k)][:3]
    if only_a or only_b or diff:
        raise AssertionError(f"{what}: {len(a)} vs {len(b)} entries; only left {sorted(only_a)[:5]}"
                             f", only right {sorted(only_b)[:5]}, differing {diff}: "
                             f"{[(a[k][:2], row(a[k]), b[k][:2], row(b[k])) for k in diff]}")


def assert_equal(a, b, what: str) -> None:
    a, b = np.asarray(jax.device_get(a)), np.asarray(jax.device_get(b))
    if a.shape != b.shape or not np.array_equal(a, b):
        raise AssertionError(f"{what}: differ\n{a}\nvs\n{b}")


def _shard_total(counter) -> int:
    """The sum of a per-shard 64-bit count (a Counter64 with the leading shard axis)."""
    return int(to_host_int64(counter, signed=False).sum(dtype=np.uint64))


def fresh_pair(shards: int, per_shard: int = 64):
    single = ht.init_table(shards * per_shard * 4, DIM, initializer_mode="constant",
                           constant_value=0.5)
    sharded = ht.init_sharded_table(shards * per_shard, DIM, mesh_of(shards), "shard",
                                    initializer_mode="constant", constant_value=0.5)
    return single, sharded


BATCH = 64  # every check uses batches of this size: the compiled programs are shared
COUNTER = dict(filter_mode="counter", filter_freq=2)


def skewed_keys(first: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A batch of 40 keys owned by shard 3 (of 8) and 24 owned by others, shuffled, from
    ``first`` on; and every candidate key's owner."""
    cand = np.arange(50000, dtype=np.int64)
    owner = np.asarray(ht.owner_shard(*ht.words.as_words(cand, "t", "k"), 8))
    keys = np.concatenate([cand[(owner == 3) & (cand >= first)][:40],
                           cand[(owner != 3) & (cand >= first)][:24]])
    np.random.default_rng(4).shuffle(keys)
    return keys, owner


@check
def routing_overflow_is_reported():
    # Every call here runs at route_capacity 2 (one program) or at the default capacity
    # with COUNTER (one program).
    _, t = fresh_pair(8)
    keys, owner = skewed_keys()
    dest = owner[keys].reshape(8, BATCH // 8)  # device d sends keys[8d:8d+8]
    cap = 2
    rank = np.array([[np.sum(row[:j] == row[j]) for j in range(row.size)] for row in dest])
    served = (rank < cap).reshape(-1)
    needed = max(np.bincount(row, minlength=8).max() for row in dest)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        new, rows, info = ht.lookup_or_insert(t, keys, route_capacity=cap, overflow="truncate",
                                              **COUNTER)
    assert any("not served" in str(w.message) for w in caught), [str(w.message) for w in caught]
    assert_equal(info.route.served, served, "served")
    assert int(info.route.lost) == int((~served).sum()) and int(info.route.needed) == needed
    # Unserved keys were not inserted (nor counted); served ones were, once.
    assert int(new.live) == int(served.sum()) == int(info.inserted)
    assert_equal(info.slots >= 0, served, "slots of served keys")
    assert {k: e[0] for k, e in entries(new).items()} == dict.fromkeys(keys[served].tolist(), 1)
    assert int(new.unrouted) == int((~served).sum()) and int(t.unrouted) == 0
    try:  # a read inside jit has no table to count unserved keys in: it must ask for them
        jax.jit(lambda t: ht.find(t, keys, route_capacity=cap))(t)
        raise AssertionError("find inside jit with route_capacity, not with_route(find), ran")
    except OpArgumentError as e:
        assert e.arg == "route_capacity" and "with_route(ht.find)" in str(e), e
    (_, found), route = jax.jit(lambda t: ht.with_route(ht.find)(t, keys, route_capacity=cap))(t)
    assert_equal(route.served, served, "served (a read)")
    assert_equal(found, np.zeros(len(keys), bool), "nothing found in an empty table")
    try:
        ht.lookup_or_insert(t, keys, route_capacity=cap, overflow="error", **COUNTER)
        raise AssertionError("no CapacityOverflowError")
    except CapacityOverflowError as e:  # counted in keys, the unit the buffers hold
        lost = int((~served).sum())
        assert e.true_size == needed and e.capacity == cap and e.lost == lost, e
        assert f"{lost} keys were not routed" in str(e) and "elements" not in str(e), e
    full, rows, info = ht.lookup_or_insert(t, keys, route_capacity=cap, **COUNTER)  # expand
    assert int(info.route.lost) == 0 and int(full.live) == BATCH
    assert int(info.route.capacity) >= needed
    # Seen twice now: served keys are admitted (the table's row), unserved get the default.
    _, rows, info = ht.lookup_or_insert(full, keys, route_capacity=cap, overflow="truncate",
                                        **COUNTER)
    rows = np.asarray(rows)
    assert np.all(rows[~served] == 0.0) and np.all(rows[served] == 0.5)
    assert_equal(info.admitted, served, "admitted")


@check
def load_policy_acts_per_shard_before_the_insert():
    # Shards of 32 slots hold 28 live keys (max_load_factor 0.9); the skewed batch sends
    # 40 to shard 3. The policy acts before the insert, on that shard's count.
    keys, _ = skewed_keys()
    small = ht.init_sharded_table(8 * 32, DIM, mesh_of(8), "shard", initializer_mode="constant")
    try:
        ht.lookup_or_insert(small, keys, **COUNTER)
        raise AssertionError("policy 'error': no error")
    except OpArgumentError as e:
        assert "shard 3" in str(e) and "40" in str(e), e
    assert int(small.live) == 0
    # "grow": every shard doubles (to the 64-slot shards of the other checks), then the
    # insert runs once: the clock steps once, and entries and scores equal one table's.
    # (Rows of free slots are 0.0 in both: a grow's new slots get resize's default.)
    single = ht.init_table(8 * 64 * 4, DIM, initializer_mode="constant")
    grown = ht.set_load_policy(small, policy="grow")
    for _ in range(2):
        single, rows1, _ = ht.lookup_or_insert(single, keys, **COUNTER)
        grown, rows8, _ = ht.lookup_or_insert(grown, keys, **COUNTER)
        assert_equal(rows1, rows8, "rows after grow")
    assert grown.shard_size == 64 and grown.shards.load_policy == "grow"
    same(entries(single), entries(grown), "grown vs one table")
    assert scores(single) == scores(grown) and scores(grown)[1] == [2], scores(grown)[1]
    # "evict": shard 3 holds 40 live keys (57 allowed). A batch of 30 new keys of shard 3,
    # 10 of its old ones and 24 new keys of other shards: 13 of the 30 old keys it does not
    # touch become tombstones first (all equally old and frequent: the lowest slots go).
    table = ht.set_load_policy(grown, policy="evict")
    keys, owner = skewed_keys()
    newer, _ = skewed_keys(first=int(keys.max()) + 1)
    old3 = keys[owner[keys] == 3]
    batch = np.concatenate([newer[owner[newer] == 3][:30], old3[:10],
                            newer[owner[newer] != 3][:24]])
    before = entries(table)
    table, _, info = ht.lookup_or_insert(table, batch, **COUNTER)
    assert int(np.asarray(table.shards.live)[3]) == table.shards.max_live == 57
    after = entries(table, live_only=True)
    gone = set(before) - set(after)
    assert len(gone) == 13 and gone <= set(old3[10:].tolist()), sorted(gone)
    assert bool(np.all(np.asarray(info.slots) >= 0)) and int(table.live) == len(after)
    assert scores(table)[1] == [3]


def keyed(table, state) -> dict:
    """``{key: (counter, flags, row, optimizer rows...)}`` (bytes) of the live keys of either
    table type and its row optimizer state (the per-slot leaves, owner included)."""
    t, get, flags, keys = _host_slots(table)
    size = flags.size
    rows = [get(x).reshape(size, -1) for x in [t.counter_lo, t.counter_hi, t.values] +
            [x for x in jax.tree.leaves(state) if np.size(x) and np.size(x) % size == 0
             and np.shape(x)[:2 if isinstance(table, ht.ShardedHashTable) else 1] ==
             np.shape(t.flags)]]
    live = ((flags & VALID) != 0) & ((flags & EVICTED) == 0)
    return {int(k): (int(f), *(r[s].tobytes() for r in rows))
            for s, k, f in zip(np.flatnonzero(live), keys[live], flags[live])}


@check
def checkpoint_on_8_restores_on_2_and_one_device_and_back():
    """A table and its Adam state saved on 8 shards restore onto 2 shards and one device
    (keys re-owned, each key's optimizer rows with it), onto 8, and from 2 back onto 8."""
    rng = np.random.default_rng(2)
    _, t8 = fresh_pair(8)
    opt = ht.optim.adam(0.1)
    s8 = opt.init(t8)
    batches = [rng.integers(0, 10**12, BATCH).astype(np.int64) for _ in range(2)]
    for keys in batches + [batches[1]]:
        t8, _, info = ht.lookup_or_insert(t8, keys, **COUNTER)
        t8, s8 = opt.update(t8, s8, info.slots, jnp.ones((BATCH, DIM)))
    t8 = ht.set_load_policy(ht.evict(t8, batches[0][:8]), policy="evict", max_load_factor=0.8)
    t8, *_ = ht.export(t8, export_mode="new", size=4)  # some entries marked exported
    want = keyed(t8, s8)
    with tempfile.TemporaryDirectory() as d:
        ht.save({"t": t8, "s": s8}, os.path.join(d, "a"))
        for m in (2, 8, None):  # None: one device
            t = ht.init_table(t8.bucket_size, DIM, initializer_mode="constant", constant_value=0.5,
                              placement=m and ht.MeshAxis(mesh_of(m), "shard"))
            back = ht.load(os.path.join(d, "a"), {"t": t, "s": opt.init(t)})
            assert back["t"].bucket_size == t8.bucket_size
            storage = back["t"].shards if m else back["t"]
            assert (storage.load_policy, storage.max_load_factor) == ("evict", 0.8)
            assert keyed(back["t"], back["s"]) == want, f"8 -> {m} shards"
            assert int(back["t"].not_exported) == int(t8.not_exported)
            assert int(ht.words.sum_counters(back["s"].skipped)) == _shard_total(s8.skipped)
            if m == 2:
                ht.save(back, os.path.join(d, "b"))
        again = ht.load(os.path.join(d, "b"), {"t": t8, "s": s8})
        assert keyed(again["t"], again["s"]) == want, "8 -> 2 -> 8 shards"
        # An abstract target: as many shards of another size take the saved size; another
        # shard count needs concrete arrays (their rows are what free slots keep).
        small = lambda m: ht.init_table(  # noqa: E731
            8 * m, DIM, initializer_mode="constant", placement=ht.MeshAxis(mesh_of(m), "shard"))
        grown = ht.load(os.path.join(d, "a"), jax.eval_shape(
            lambda: {"t": small(8), "s": opt.init(small(8))}))
        assert grown["t"].bucket_size == t8.bucket_size and keyed(grown["t"], grown["s"]) == want
        try:
            ht.load(os.path.join(d, "a"), jax.eval_shape(
                lambda: {"t": small(2), "s": opt.init(small(2))}))
        except OpArgumentError as e:
            assert "concrete arrays" in str(e), e
        else:
            raise AssertionError("an abstract target of another shard count was restored")
        # Shards in reverse order (each a valid table, its keys owned by another shard).
        moved = t8.replace(shards=jax.tree.map(lambda x: x[::-1], t8.shards))
        ht.save(moved, os.path.join(d, "c"))
        try:
            ht.load(os.path.join(d, "c"), mesh=mesh_of(8), axis="shard")
        except ht.CheckpointError as e:
            assert "belongs to shard" in str(e), e
        else:
            raise AssertionError("keys in the wrong shard were restored")
        found = ht.find(again["t"], np.array(list(want)[:BATCH], np.int64))[1]
        assert bool(np.all(np.asarray(found)))


@check
def export_import_across_shard_counts():
    rng = np.random.default_rng(3)
    _, t8 = fresh_pair(8)
    t8, _, _ = ht.lookup_or_insert(t8, rng.integers(0, 10**6, BATCH).astype(np.int64), **COUNTER)
    t8, keys, counters, flags, values = ht.export(t8)
    import jaxops
    keys, counters, flags, values = jaxops.refresh((keys, counters, flags, values))
    assert int(t8.not_exported) == 0 and keys.shape[0] == int(t8.live)
    t2 = ht.init_sharded_table(256, DIM, mesh_of(2), "shard", initializer_mode="constant")
    t2, info = ht.import_(t2, ht.words.to_host_int64(keys), ht.words.to_host_int64(counters, signed=False),
                          flags, values)
    assert int(info.unplaced) == 0
    same(entries(t8, live_only=True), entries(t2, live_only=True), "export 8 -> import 2")
    small = ht.resize(t2, 512)
    same(entries(t2, live_only=True), entries(small, live_only=True), "resize")


@check
def single_table_inside_shard_map_with_check_vma():
    # One table per device, inside the user's shard_map; each equals the same table eagerly.
    mesh = mesh_of(8)
    table, _ = fresh_pair(8)

    def local(keys):  # int32 ids in a 64-bit table: as words, widened where they are known
        t, rows, info = ht.lookup_or_insert(table, ht.words.Words64(
            keys.astype(jnp.uint32), jnp.zeros_like(keys, jnp.uint32)), **COUNTER)
        return rows, info.inserted[None]

    keys = jnp.arange(8 * BATCH, dtype=jnp.int32) % 37
    rows, inserted = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=jax.P("shard"),
                                           out_specs=jax.P("shard"), check_vma=True))(keys)
    one, rows1, info1 = ht.lookup_or_insert(table, np.asarray(keys[:BATCH]).astype(np.int64),
                                            **COUNTER)
    assert_equal(rows[:BATCH], rows1, "rows inside shard_map")
    assert_equal(inserted, np.full(8, int(info1.inserted)), "inserted per device")
    assert int(info1.inserted) == 37 and int(info1.not_admitted) > 0


@check
def export_chunks_and_resize_at_2_18_slots():
    # 32768 slots a shard: export's compaction loops there (it once failed inside shard_map).
    import jaxops

    keys = (np.arange(BATCH, dtype=np.int64) - 5) * 7919
    t = ht.init_sharded_table(1 << 18, DIM, mesh_of(8), "shard", initializer_mode="constant")
    t, _, _ = ht.lookup_or_insert(t, keys, **COUNTER)
    want = entries(t, live_only=True)
    marked, k, c, f, v = ht.export(t, export_mode="all")
    got = ht.host_keys(t, jaxops.refresh(k))
    assert sorted(got.tolist()) == sorted(keys.tolist()) and int(marked.not_exported) == 0
    _, chunks = ht.export_chunks(t, 1 << 14)
    chunks = list(chunks)
    assert sorted(x for ch in chunks for x in ch.keys.tolist()) == sorted(keys.tolist())
    big = ht.resize(t, 1 << 19)
    assert big.shard_size == 1 << 16
    same(want, entries(big, live_only=True), "resize 2^18 -> 2^19")


def _grow_fourfold(op, table, demand, donate):
    """A user's load policy: every shard four times as large."""
    return ht.resize(table, 4 * demand.shard_size * demand.needed.size)


def _do_nothing(op, table, demand, donate):
    return table


@check
def a_users_load_policy_acts_on_every_shard():
    ht.LOAD_POLICIES["grow_fourfold"] = _grow_fourfold
    ht.LOAD_POLICIES["do_nothing"] = _do_nothing
    try:
        keys, _ = skewed_keys()  # 40 of the 64 keys go to shard 3, which holds 28
        small = ht.init_sharded_table(8 * 32, DIM, mesh_of(8), "shard",
                                      initializer_mode="constant")
        grown, _, info = ht.lookup_or_insert(ht.set_load_policy(small, policy="grow_fourfold"),
                                             keys, **COUNTER)
        assert grown.shard_size == 128 and grown.shards.load_policy == "grow_fourfold"
        assert int(info.unplaced) == 0 and int(grown.live) == BATCH
        single = ht.init_table(8 * 64 * 4, DIM, initializer_mode="constant")
        single, _, _ = ht.lookup_or_insert(single, keys, **COUNTER)
        same(entries(single), entries(grown), "user policy vs one table")
        try:  # a policy that makes no room: the insert refuses, naming the shard
            ht.lookup_or_insert(ht.set_load_policy(small, policy="do_nothing"), keys, **COUNTER)
            raise AssertionError("a policy that made no room let the insert pass the limit")
        except OpArgumentError as e:
            assert "shard 3" in str(e), e
    finally:
        del ht.LOAD_POLICIES["grow_fourfold"], ht.LOAD_POLICIES["do_nothing"]


def _collection(placement):
    return EmbeddingCollection([
        TableConfig("ids", 8 * 64, DIM, ("user", "item"), ht.optim.adagrad(0.1), 0.25,
                    placement=placement),
        TableConfig("tags", 8 * 32, DIM, ("tags",), ht.optim.sgd(0.5), 0.5, pooling="sum",
                    placement=placement)])


@check
def a_collection_on_a_mesh_trains_as_on_one_device():
    # Constant initializers: a jitted train step gives the same losses and tables bit for
    # bit on 8 shards as on one device, and the read-only eval path the same pooled rows.
    rng = np.random.default_rng(5)

    def train_step(coll):
        @jax.jit
        def step(state, batch):
            state, looked = coll.lookup_or_insert(state, batch)

            def loss(rows):
                return sum(jnp.sum(p * jnp.arange(1.0, DIM + 1)) ** 2
                           for p in coll.pool(looked, rows).values())

            value, grads = jax.value_and_grad(loss)(looked.rows)
            return coll.apply_gradients(state, looked, grads), value
        return step

    def batch():
        def bags():  # 16 bags of 0-3 ids each, out of 48 ids (one shape: one program)
            return Bags.from_lengths(rng.integers(0, 40, 48).astype(np.int64),
                                     rng.integers(0, 4, 16).astype(np.int32))
        return {"user": bags(), "item": bags(), "tags": bags()}

    colls = {p: _collection(p) for p in (None, ht.MeshAxis(mesh_of(8), "shard"))}
    states = {p: c.init(jax.random.key(0)) for p, c in colls.items()}
    steps = {p: train_step(c) for p, c in colls.items()}
    for i in range(3):
        b = batch()
        losses = {}
        for p in colls:
            states[p], losses[p] = steps[p](states[p], b)
        assert_equal(*losses.values(), f"loss of step {i}")
    for name in ("ids", "tags"):
        one, sharded = (states[p][name].table for p in colls)
        same(entries(one, live_only=True), entries(sharded, live_only=True), f"table {name}")
    evals = [jax.jit(lambda s, c=c: c.pool(c.lookup(s, b)))(states[p])
             for p, c in colls.items()]
    for name in evals[0]:  # the same rows; XLA may sum a bag in another order (an ulp)
        np.testing.assert_allclose(evals[0][name], evals[1][name], rtol=2e-7, atol=0,
                                   err_msg=f"eval of {name}")


@check
def a_revived_key_starts_fresh_on_8_shards():
    """Issue 30 #7 on a mesh: an evicted key coming back in a jitted donated loop trains as
    a new key does (the same loop as the one-device test)."""
    from tests.hashtable.optim.test_optim_owner import revived_and_new_rows

    a, b, c = 5, 6, 1000  # any keys: each shard evicts and revives its own
    revived, new = revived_and_new_rows(ht.MeshAxis(mesh_of(8), "shard"), a, b, c)
    np.testing.assert_array_equal(revived, new)


TWO_PROCESSES: dict = {}  # the 2-process run: its processes, logs and directory
#: The checks that read the 2-process run's checkpoints.
ON_TWO_PROCESSES = ("two_processes_match_one_table", "resumed_on_2_shards_in_a_fresh_process")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_two_processes(out: str, env: dict) -> None:
    """Starts the 2-process run (``sharded_multiprocess.py``, 4 forced host devices each,
    ``env`` otherwise) into ``out``; its checks wait for it."""
    port = str(_free_port())
    flags = " ".join(f for f in env.get("XLA_FLAGS", "").split()
                     if "device_count" not in f) + " --xla_force_host_platform_device_count=4"
    logs = [open(os.path.join(out, f"process-{i}.log"), "w+") for i in range(2)]
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sharded_multiprocess.py")
    TWO_PROCESSES.update(dir=out, logs=logs, procs=[
        subprocess.Popen([sys.executable, script, str(i), port, out], stdout=log,
                         stderr=subprocess.STDOUT, env=dict(env, XLA_FLAGS=flags.strip()))
        for i, log in enumerate(logs)])


@check
def two_processes_train_save_and_resume():
    """The 2-process run itself (``jax.distributed``, 8 shards over 2 processes): a jitted,
    donated train step, asynchronous saves, resumes on 8 and 4 shards equal to the
    uninterrupted run, the load policy across processes, a forced save over a checkpoint."""
    if "procs" not in TWO_PROCESSES:
        raise AssertionError("the 2-process run was not started")
    procs = TWO_PROCESSES["procs"]
    try:
        codes = [p.wait(timeout=600) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    outs = []
    for log in TWO_PROCESSES["logs"]:
        log.seek(0)
        outs.append(log.read()[-3000:])
        log.close()
    TWO_PROCESSES["ok"] = codes == [0, 0]
    assert codes == [0, 0], f"exit codes {codes}:\n" + "\n----\n".join(outs)


def _two_processes_dir() -> str:
    """The 2-process run's directory, once both processes ended well."""
    if not TWO_PROCESSES.get("ok"):
        raise AssertionError("the two processes did not finish: see the check "
                             "two_processes_train_save_and_resume")
    return TWO_PROCESSES["dir"]


@check
def the_training_recipe_on_8_devices_equals_one_device():
    # examples/training_recipe.py: a jitted, donated step with maintain between steps; the
    # table grows with its optimizer state on 8 shards as on one device, losses bit for bit.
    from tests.helpers.util import ROOT

    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import training_recipe

    runs = [training_recipe.main(steps=12, batch=128, slots=1024, policy="grow", devices=d)
            for d in (1, 8)]
    assert runs[1]["devices"] == 8 and runs[0]["grown"] >= 1, runs
    for name in ("first_loss", "last_loss", "live", "slots", "lost"):
        assert runs[0][name] == runs[1][name], (name, runs)
    assert runs[1]["route_capacity"] is not None


def _two_processes_end() -> dict:
    """The 2-process run's last checkpoint, restored here onto 8 shards once (both checks
    below read it: restoring it onto another shard count is checked above and in the run)."""
    import orbax.checkpoint as ocp

    import tests.helpers.sharded_multiprocess as mp

    if "end" not in TWO_PROCESSES:
        with ocp.CheckpointManager(os.path.join(_two_processes_dir(), "run")) as mngr:
            TWO_PROCESSES["end"] = mngr.restore(mp.STEPS, args=ht.checkpoint.Restore(
                jax.eval_shape(lambda: mp.fresh(ht, mesh_of(8)))))
    return TWO_PROCESSES["end"]


@check
def two_processes_match_one_table():
    """The 2-process run (``sharded_multiprocess.py``) has saved its state, 8 shards over 2
    processes. Its last checkpoint restores here and equals one unsharded table fed the
    same batches."""
    import tests.helpers.sharded_multiprocess as mp

    loaded = _two_processes_end()["table"]
    assert loaded.num_shards == 8 and loaded.bucket_size == mp.SLOTS
    single, _ = fresh_pair(8)
    single, _, _ = mp.train(single, ht.adam_w_init(single), ht)
    same(entries(single, live_only=True), entries(loaded, live_only=True),
         "2 processes vs one table", exact_rows=False)
    assert int(loaded.live) == int(single.live) > 0


@check
def resumed_on_2_shards_in_a_fresh_process():
    """The 2-process run's mid-training checkpoint (8 shards) resumes here on 2 shards; the
    (key, counter, flags, row, AdamW moments) of every live key then equal the 2 processes'
    uninterrupted run, bit for bit."""
    import orbax.checkpoint as ocp

    import tests.helpers.sharded_multiprocess as mp

    with ocp.CheckpointManager(os.path.join(_two_processes_dir(), "run")) as mngr:
        back = mngr.restore(mp.MID, args=ht.checkpoint.Restore(mp.fresh(ht, mesh_of(2))))
    table, opt, _ = mp.train(back["table"], back["opt"], ht, range(mp.MID, mp.STEPS))
    done = _two_processes_end()
    got, want = mp.keyed({"table": table, "opt": opt}, ht), mp.keyed(done, ht)
    assert len(got) == int(done["table"].live) > 0
    if got != want:
        diff = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
        raise AssertionError(f"resumed on 2 shards: {len(diff)} of {len(want)} keys differ "
                             f"from the uninterrupted run, e.g. {diff[:3]}")
