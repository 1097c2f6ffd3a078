"""The placement matrix: every table operation on every placement, against one reference.

As ``tests/helpers/op_matrix.py`` does for operators, one row (:class:`Row`) per table
operation says how to call it and what the plain-Python reference
(``tests/helpers/sharded_reference.py``: a ``RefTable`` per shard) gives for it. Each row
runs on every placement of :data:`PLACEMENTS`:

- ``one_device``: ``ONE_DEVICE`` (a ``HashTable``);
- ``mesh_of_one``: a ``MeshAxis`` over one device (``shard_map``, ``all_to_all``);
- ``8_shards``: a ``MeshAxis`` over 8 host devices, in the 8-device child
  (``tests/helpers/eight_devices.py``).

Every row starts from the same table (:func:`start`: inserts with counter admission,
imports, evictions and reinserts, checked against the reference on the way) and compares
what the call returns and the whole table after it, slot by slot (keys, counters, flags,
last access, epoch, rows, the counts and the clock), with the reference's. Rows whose
result does not depend on the slot layout (``layout_free``) also compare the live entries
of the 8 shards with one table of the same size: 8 shards hold what one table holds.
Where the reference has no such operation (a row optimizer, a checkpoint, a resize's
optimizer states) the row says what it compares with instead: numpy, or the table before.

The rows share their compiled programs: one table shape (:data:`SLOTS` slots, rows of
:data:`DIM`), batches of :data:`BATCH` keys. Add a row by adding a function below to
:data:`ROWS` with the ``@row`` decorator; it runs on every placement.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
import tempfile
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import jaxops
import jaxops.hashtable as ht
from jaxops.core.errors import OpArgumentError
from tests.helpers.sharded_reference import (ShardedAdamW, ShardedRef, live_entries,
                                             placed_snapshot)

PLACEMENTS = ("one_device", "mesh_of_one", "8_shards")
EIGHT = "8_shards"
SLOTS, DIM, BATCH = 256, 4, 64  # 8 shards: 32 slots each (at most 28 live keys)
INIT = 0.5  # every row of a free slot, and of an evicted one: layouts agree on them
COUNTER = dict(filter_mode="counter", filter_freq=2)

_rng = np.random.default_rng(36)
B0, B1 = (_rng.integers(-40, 120, BATCH) for _ in range(2))  # duplicates, negatives, -1
IMPORTED = (np.array([1000, 1001, 1002, B0[0], B0[1], 1003, -7, B1[2]], np.int64),
            np.array([3, 4, 5, 2**40, 7, 1, 9, 2**63], np.uint64),
            np.array([1, 0, 1, 1, 0, 1, 0, 1], np.uint8),
            (np.arange(8 * DIM, dtype=np.float32).reshape(8, DIM) / 8 + 2))
EVICTED_KEYS = np.concatenate([np.unique(B0)[:16], 10**15 + np.arange(BATCH - 16)])
B2 = _rng.integers(-40, 160, BATCH)  # revives evicted keys, takes their slots
NEW = np.concatenate([B2[:32], 2000 + np.arange(32)])
PROBE = np.concatenate([B2[:24], EVICTED_KEYS[:16], 500 + np.arange(24)])  # and absent ones
G, W = (_rng.standard_normal((BATCH, DIM)).astype(np.float32) for _ in range(2))
ABSENT = 10**17  # a key no table holds
#: The rows' optimizers: one instance per configuration, so rows share its programs.
ADAGRAD, ADAGRAD_HALF = ht.optim.adagrad(0.1), ht.optim.adagrad(0.1, initial_accumulator_value=0.5)
ADAM = ht.optim.adam(0.1)


def placement_of(name: str) -> Any:
    if name == "one_device":
        return ht.ONE_DEVICE
    devices = jax.devices()[:8 if name == EIGHT else 1]
    return ht.MeshAxis(jax.sharding.Mesh(np.array(devices), ("shard",)), "shard")


def shards_of(name: str) -> int:
    return 8 if name == EIGHT else 1


@dataclasses.dataclass(frozen=True)
class Start:
    """The table every row starts from, on one placement, and its references: ``ref`` of
    its layout, ``one`` a single table of as many slots fed the same calls."""

    placement: str
    table: Any
    ref: ShardedRef
    one: ShardedRef


def _fresh(placement: str, slots: int = SLOTS) -> tuple[Any, ShardedRef, ShardedRef]:
    table = ht.init_table(slots, DIM, initializer_mode="constant", constant_value=INIT,
                          placement=placement_of(placement))
    rows = np.full((slots, DIM), INIT, np.float32)
    return table, ShardedRef(shards_of(placement), rows), ShardedRef(1, rows)


@functools.cache
def start(placement: str) -> Start:
    """Inserts (counter admission), an import, evictions and inserts that revive evicted
    keys or take their slots; each step checked against the reference."""
    table, ref, one = _fresh(placement)
    steps = [(lambda t: ht.lookup_or_insert(t, B0, **COUNTER)[0],
              lambda r: r.lookup_or_insert(B0, **COUNTER)),
             (lambda t: ht.lookup_or_insert(t, B1, **COUNTER)[0],
              lambda r: r.lookup_or_insert(B1, **COUNTER)),
             (lambda t: ht.import_(t, *IMPORTED)[0], lambda r: r.import_(*IMPORTED)),
             (lambda t: ht.evict(t, EVICTED_KEYS, const_val=INIT),
              lambda r: r.evict(EVICTED_KEYS, const_val=INIT)),
             (lambda t: ht.lookup_or_insert(t, B2, **COUNTER)[0],
              lambda r: r.lookup_or_insert(B2, **COUNTER))]
    for i, (call, expect) in enumerate(steps):
        table = call(table)
        expect(ref)
        expect(one)
        assert_same_table(table, ref, f"start, step {i}")
    return Start(placement, table, ref, one)


@dataclasses.dataclass(frozen=True)
class Row:
    """One table operation.

    - ``call(start) -> (table or None, outputs, made)``: the operation on ``start.table``;
      ``outputs`` what it returned (a dict), ``made`` whatever ``expect`` needs of the call;
    - ``expect(ref, start, made) -> (ref, outputs)``: the same on a copy of the reference
      (which it may change or replace);
    - ``close``: outputs compared to float rounding (``rtol``), the rest exactly; with
      ``rtol``, the table's rows too (optimizer math: XLA fuses it differently in
      different programs);
    - ``layout_free``: the live entries do not depend on the slot layout;
    - ``known_defect``: ``{placement: what is wrong}``, a defect of jaxops the row shows
      there (a strict xfail: it fails the run once fixed, to be removed).
    """

    id: str
    call: Callable[[Start], tuple[Any, dict, Any]]
    expect: Callable[[ShardedRef, Start, Any], tuple[ShardedRef, dict]]
    close: tuple[str, ...] = ()
    rtol: float = 0.0
    layout_free: bool = False
    known_defect: dict = dataclasses.field(default_factory=dict)

    def __str__(self) -> str:
        return self.id


ROWS: list[Row] = []


def row(**options) -> Callable:
    """Adds ``fn`` (``fn() -> (call, expect)``) to :data:`ROWS` as a row named like it."""
    def add(fn):
        call, expect = fn()
        ROWS.append(Row(fn.__name__, call, expect, **options))
        return fn
    return add


def run_row(r: Row, placement: str) -> None:
    """Runs row ``r`` on ``placement`` and compares it with the reference."""
    s = start(placement)
    table, got, made = r.call(s)
    ref, want = r.expect(copy.deepcopy(s.ref), s, made)
    assert_outputs(got, want, r.close, r.rtol, r.id)
    if table is None:
        return
    assert_same_table(table, ref, r.id, r.rtol)
    if r.layout_free and shards_of(placement) > 1:
        one, _ = r.expect(copy.deepcopy(s.one), s, made)
        same = live_entries(placed_snapshot(table)) == live_entries(one.snapshot())
        assert same or r.rtol, f"{r.id}: the live entries differ from one table's"


def host(x: Any) -> Any:
    return jax.tree.map(lambda a: np.asarray(a), jax.device_get(x))


def assert_outputs(got: dict, want: dict, close=(), rtol=0.0, what="") -> None:
    assert set(got) == set(want), (what, sorted(got), sorted(want))
    for name, w in want.items():
        g, w = np.asarray(host(got[name])), np.asarray(w)
        msg = f"{what}: output {name!r}"
        assert g.shape == w.shape, f"{msg}: shape {g.shape}, expected {w.shape}"
        if name in close:
            np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol, err_msg=msg)
        else:
            np.testing.assert_array_equal(g, w, err_msg=msg)


def assert_same_table(table: Any, ref: ShardedRef, what: str, rtol: float = 0.0) -> None:
    """Every slot (global order) and every count of ``table`` equals the reference's."""
    got, want = placed_snapshot(table), ref.snapshot()
    for name, w in want.items():
        g = got[name]
        if name == "values" and rtol:
            np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol, err_msg=f"{what}: rows")
            continue
        if not np.array_equal(g, w):
            where = np.flatnonzero(np.any(np.reshape(g != w, (len(g), -1)), axis=1))[:5] \
                if np.ndim(w) else []
            raise AssertionError(f"{what}: {name} differs from the reference's"
                                 f"{f' at slots {where.tolist()}' if len(where) else ''}: "
                                 f"{np.asarray(g)[where] if len(where) else g} vs "
                                 f"{np.asarray(w)[where] if len(where) else w}")


def _info(info: Any) -> dict:
    return {"slots": info.slots, "admitted": info.admitted, "served": info.route.served,
            **{k: getattr(info, k) for k in ("inserted", "unplaced", "not_admitted",
                                                 "filtered")}}


def _inserts(keys: np.ndarray, **attrs):
    def call(s):
        t, rows, info = ht.lookup_or_insert(s.table, keys, **attrs)
        return t, {"rows": rows, **_info(info)}, None

    def expect(ref, s, made):
        rows, info = ref.lookup_or_insert(keys, **attrs)
        return ref, {"rows": rows, "served": np.ones(len(keys), bool), **info}
    return call, expect


@row(layout_free=True)
def lookup_or_insert():  # new keys, held ones, evicted ones and ones not yet admitted
    return _inserts(NEW, **COUNTER)


@row(layout_free=True)  # was a defect on a mesh: default_key landed in filter_key's shard
def lookup_or_insert_replacing_a_key():  # the special key goes to its replacement's shard
    return _inserts(NEW, filter_key_flag=True, filter_key=int(B2[0]), default_key_or_value=True,
                    default_key=2**40 + 7, step=9)


@row()
def find():
    def call(s):
        rows, found = ht.find(s.table, PROBE, default_value=0.25)
        return None, {"rows": rows, "found": found}, None

    def expect(ref, s, made):
        rows, found = ref.find(PROBE, 0.25)
        return ref, {"rows": rows, "found": found}
    return call, expect


def _grad_rows(read: Callable, table: Any, weights: np.ndarray) -> np.ndarray:
    """d/d(table rows) of ``sum(read(table) * weights)``, jitted, as ``[slots, dim]``."""
    loss = lambda v: jnp.sum(read(table.replace(values=v)) * weights)  # noqa: E731
    return np.asarray(jax.jit(jax.grad(loss))(table.values)).reshape(-1, DIM)


@row(close=("grad",), rtol=1e-6)
def lookup():  # differentiable: each key's gradient reaches its slot (duplicates add up)
    def call(s):
        grad = _grad_rows(lambda t: ht.lookup(t, PROBE) ** 2, s.table, W)
        return None, {"rows": ht.lookup(s.table, PROBE), "grad": grad}, None

    def expect(ref, s, made):
        rows, found = ref.find(PROBE)
        grad = np.zeros((SLOTS, DIM), np.float32)
        np.add.at(grad, ref.locate(PROBE)[found], (2 * rows * W)[found])
        return ref, {"rows": rows, "grad": grad}
    return call, expect


@row()
def locate():  # with its route: every key served (no routing capacity)
    def call(s):
        slots, route = ht.with_route(ht.locate)(s.table, PROBE)
        return None, {"slots": slots, "served": route.served, "lost": route.lost}, None

    def expect(ref, s, made):
        return ref, {"slots": ref.locate(PROBE), "served": np.ones(BATCH, bool), "lost": 0}
    return call, expect


@row(close=("grad",), rtol=1e-6)
def gather():  # at global slots, -1 included; its gradient sums each slot's cotangents
    def call(s):
        slots = s.ref.locate(PROBE)
        grad = _grad_rows(lambda t: ht.gather(t, slots), s.table, W)
        return None, {"rows": ht.gather(s.table, slots, 0.25), "grad": grad}, None

    def expect(ref, s, made):
        slots = ref.locate(PROBE)
        grad = np.zeros((SLOTS, DIM), np.float32)
        np.add.at(grad, slots[slots >= 0], W[slots >= 0])
        return ref, {"rows": ref.gather(slots, 0.25), "grad": grad}
    return call, expect


@row(layout_free=True)
def evict():  # held keys, absent ones, repeats
    keys = np.concatenate([B1[:20], 10**15 + np.arange(BATCH - 20)])

    def expect(ref, s, made):
        ref.evict(keys, const_val=INIT)
        return ref, {}
    return lambda s: (ht.evict(s.table, keys, const_val=INIT), {}, None), expect


@row()
def evict_lowest():  # oldest first, then lowest counter, then global slot; never `keep`
    def call(s):
        keep = s.ref.locate(B2[:16])
        return ht.evict_lowest(s.table, 7, keep=keep, const_val=INIT), {}, keep

    def expect(ref, s, keep):
        ref.evict_lowest(7, "lru", keep, INIT)
        return ref, {}
    return call, expect


@row()
def evict_lowest_lfu_fraction():  # lowest counter first; a quarter of the live keys
    def call(s):
        return ht.evict_lowest(s.table, fraction=0.25, by="lfu", const_val=INIT), {}, None

    def expect(ref, s, made):
        ref.evict_lowest(int(0.25 * ref.live), "lfu", (), INIT)
        return ref, {}
    return call, expect


@row(layout_free=True)
def evict_if():  # a predicate per slot: not seen for a step, then a counter below 2
    def call(s):
        t = ht.evict_if(s.table, ht.not_seen_for(1), const_val=INIT)
        return ht.evict_if(t, ht.counter_below(2), const_val=INIT), {}, None

    def expect(ref, s, made):
        ref.evict_if(lambda key, counter, last, age: age >= 1, INIT)
        ref.evict_if(lambda key, counter, last, age: counter < 2, INIT)
        return ref, {}
    return call, expect


@row(layout_free=True)
def import_():  # new keys, held ones, evicted ones (as many as the start imported)
    keys = np.array([1004, B2[3], EVICTED_KEYS[0], EVICTED_KEYS[1], 1005, B0[5], -3, 1006],
                    np.int64)
    args = (keys, IMPORTED[1][::-1].copy(), IMPORTED[2], -IMPORTED[3])

    def call(s):
        t, info = ht.import_(s.table, *args)
        return t, {"inserted": info.inserted, "unplaced": info.unplaced}, None
    return call, lambda ref, s, made: (ref, ref.import_(*args))


@row(layout_free=True)
def export():  # entries never exported whose key was admitted, in global slot order
    def call(s):
        t, keys, counters, flags, values = ht.export(s.table, export_mode="new",
                                                     filtered_export_flag=True)
        keys, counters, flags, values = jaxops.refresh((keys, counters, flags, values))
        return t, {"keys": ht.words.to_host_int64(keys), "filter_flags": flags,
                   "counters": ht.words.to_host_int64(counters, signed=False),
                   "values": values}, None
    return call, lambda ref, s, made: (ref, ref.export("new", True))


@row(layout_free=True)
def export_chunks():  # chunk by chunk onto the host, each entry with its global slot
    fields = ("slots", "keys", "counters", "filter_flags", "values")

    def call(s):
        t, chunks = ht.export_chunks(s.table, 16)
        chunks = list(chunks)
        return t, {f: np.concatenate([getattr(c, f) for c in chunks]) for f in fields}, None

    def expect(ref, s, made):
        slots = ref.exported_slots()
        return ref, {"slots": slots, **ref.export()}
    return call, expect


def _flat(leaf: Any, table: Any) -> np.ndarray:
    """A per-slot leaf of a state beside ``table`` as ``[global slots, ...]``."""
    leaf = np.asarray(jax.device_get(leaf))
    return leaf.reshape(-1, *leaf.shape[2:]) if isinstance(table, ht.ShardedHashTable) else leaf


def _skipped(state: Any) -> int:
    return int(np.sum(ht.words.to_host_int64(state.skipped, signed=False), dtype=np.uint64))


def _held(s: Start) -> tuple[np.ndarray, int]:
    """The distinct keys of PROBE that the start holds, padded with ABSENT to BATCH keys
    (the shape every row's batch has: the same programs), and how many they are."""
    held = np.unique(PROBE[s.ref.locate(PROBE) >= 0])
    return np.concatenate([held, np.full(BATCH - len(held), ABSENT)]), len(held)


def _rebuilt(table: Any, placement: str, slots: int) -> ShardedRef:
    """The reference of ``table`` (as it is) rebuilt at ``slots`` slots."""
    return ShardedRef.of(placed_snapshot(table), shards_of(placement)).resize(slots, INIT)


@row()
def resize():
    """Twice the slots, with two optimizer states: each held key's adagrad and CANN AdamW
    rows move with it, the other slots get the states' initial rows, the beta powers stay,
    and the next step gives the rows the old table's next step gives."""
    opt = ADAGRAD_HALF

    def call(s):
        t, state = opt.update(s.table, opt.init(s.table), s.ref.locate(PROBE), G)
        t, adam = ht.apply_adam_w(t, ht.adam_w_init(t), PROBE, G, lr=0.1, weight_decay=0.01)
        big, (state2, adam2) = ht.resize(t, 2 * SLOTS, states=[(state, opt.init),
                                                               (adam, ht.adam_w_init)])
        held, n = _held(s)
        old, new = (np.asarray(ht.locate(x, held))[:n] for x in (t, big))

        def next_rows(x, state):
            return np.asarray(ht.find(opt.update(x, state, ht.locate(x, held), G)[0], held)[0])[:n]

        acc = _flat(state2.sum_of_squares, big)
        return big, {"adagrad_rows": acc[new], "adam_w_m": _flat(adam2.m, big)[new],
                     "free_rows": np.delete(acc, new, axis=0), "beta1_power": adam2.beta1_power,
                     "next_rows": next_rows(big, state2)}, (t, state, adam, old,
                                                            next_rows(t, state))

    def expect(ref, s, made):
        t, state, adam, old, next_rows = made
        return _rebuilt(t, s.placement, 2 * SLOTS), {
            "adagrad_rows": _flat(state.sum_of_squares, t)[old],
            "adam_w_m": _flat(adam.m, t)[old], "beta1_power": adam.beta1_power,
            "free_rows": np.full((2 * SLOTS - len(old), DIM), 0.5, np.float32),
            "next_rows": next_rows}
    return call, expect


@row()
def compact():  # tombstones gone, every entry reinserted in slot order
    return (lambda s: (ht.compact(s.table), {}, None),
            lambda ref, s, made: (ref.resize(SLOTS, INIT), {}))


@row(close=("m", "v"), rtol=1e-5)
def apply_adam_w():  # CANN's in-table AdamW by keys, then by slots (-1: skipped)
    def call(s):
        t, st = ht.apply_adam_w(s.table, ht.adam_w_init(s.table), PROBE, G, lr=0.1,
                                weight_decay=0.01)
        t, st = ht.apply_adam_w(t, st, None, W, lr=0.1, weight_decay=0.0,
                                slots=s.ref.locate(PROBE))
        return t, {"m": _flat(st.m, t), "v": _flat(st.v, t), "skipped": _skipped(st)}, None

    def expect(ref, s, made):
        adam = ShardedAdamW(ref)
        adam.apply(PROBE, G, lr=0.1, weight_decay=0.01)
        adam.apply(np.where(ref.locate(PROBE) >= 0, PROBE, ABSENT), W, lr=0.1, weight_decay=0.0)
        m, v = adam.moments()
        return ref, {"m": m, "v": v, "skipped": adam.skipped}
    return call, expect


def _row_step(rows: np.ndarray, state: dict, slots, grads, rule: str, lr=0.1) -> int:
    """numpy: one lazy row-optimizer step (optax's adagrad or adam on each touched row, the
    batch's gradients summed per slot first) on ``rows`` and ``state``; the skipped count."""
    f32 = np.float32
    summed: dict[int, np.ndarray] = {}
    for s, g in zip(slots, grads):
        if s >= 0:
            summed[s] = summed[s] + g if s in summed else g.astype(f32)
    for s, g in summed.items():
        if rule == "adagrad":
            state["acc"][s] = g * g + state["acc"][s]
            u = g / np.sqrt(state["acc"][s] + f32(1e-7))
        else:
            state["mu"][s] = f32(0.1) * g + f32(0.9) * state["mu"][s]
            state["nu"][s] = f32(0.001) * (g * g) + f32(0.999) * state["nu"][s]
            state["count"][s] += 1
            n = state["count"][s]
            u = (state["mu"][s] / f32(1 - 0.9 ** n)) / (
                np.sqrt(state["nu"][s] / f32(1 - 0.999 ** n)) + f32(1e-8))
        rows[s] = rows[s] + u * -f32(lr)
    return int(np.sum(np.asarray(slots) < 0))


@row(close=("adagrad", "mu", "nu"), rtol=1e-5)
def row_optimizers():  # adagrad, then adam twice (per-row step counts), slots repeated
    ada, adam = ADAGRAD, ADAM

    def call(s):
        slots, again = s.ref.locate(PROBE), s.ref.locate(B2)
        t, a = ada.update(s.table, ada.init(s.table), slots, G)
        t, m = adam.update(t, adam.init(t), again, W)
        t, m = adam.update(t, m, slots, G)
        return t, {"adagrad": _flat(a.sum_of_squares, t), "mu": _flat(m.mu, t),
                   "nu": _flat(m.nu, t), "count": _flat(m.count, t),
                   "skipped": _skipped(a) + _skipped(m)}, None

    def expect(ref, s, made):
        rows = ref.snapshot()["values"]
        state = {"acc": np.full((SLOTS, DIM), 0.1, np.float32), "count": np.zeros(SLOTS, int),
                 **{k: np.zeros((SLOTS, DIM), np.float32) for k in ("mu", "nu")}}
        slots, again = ref.locate(PROBE), ref.locate(B2)
        skipped = _row_step(rows, state, slots, G, "adagrad")
        skipped += _row_step(rows, state, again, W, "adam")
        skipped += _row_step(rows, state, slots, G, "adam")
        for i, shard in enumerate(ref.shards):
            shard.values[:] = rows[i * ref.per:(i + 1) * ref.per]
        return ref, {"adagrad": state["acc"], "mu": state["mu"], "nu": state["nu"],
                     "count": state["count"], "skipped": skipped}
    return call, expect



@row()
def maintain():  # the "grow" policy between steps: twice the slots, the state with its keys
    opt = ADAGRAD_HALF

    def call(s):  # the step before the policy is set: resize's programs
        t, state = opt.update(s.table, opt.init(s.table), s.ref.locate(PROBE), G)
        held, n = _held(s)
        old = np.asarray(ht.locate(t, held))[:n]
        t = ht.set_load_policy(t, policy="grow")
        big, (state2,), report = ht.maintain(t, [(state, opt.init)], headroom=HEADROOM)
        new = np.asarray(ht.locate(big, held))[:n]
        return big, {"action": report.action, "grown": report.grown,
                     "bucket_size": big.bucket_size,
                     "state_rows": _flat(state2.sum_of_squares, big)[new]}, (t, state, old)

    def expect(ref, s, made):
        t, state, old = made
        return _rebuilt(t, s.placement, 2 * SLOTS), {
            "action": "grow", "grown": 1, "bucket_size": 2 * SLOTS,
            "state_rows": _flat(state.sum_of_squares, t)[old]}
    return call, expect


FILLS = SLOTS // BATCH + 1  # batches of new keys: one more than the table holds
HEADROOM = 160  # one doubling on every placement: past the limit of 256 slots, not of 512


def _leaves(tree: Any) -> dict:
    return {jax.tree_util.keystr(p): np.asarray(leaf)
            for p, leaf in jax.tree_util.tree_flatten_with_path(jax.device_get(tree))[0]}


@row()
def save_and_load():  # a table and its optimizer state through an Orbax checkpoint
    opt = ADAGRAD

    def call(s):
        t, state = opt.update(s.table, opt.init(s.table), s.ref.locate(PROBE), G)
        with tempfile.TemporaryDirectory() as d:
            ht.save({"t": t, "s": state}, os.path.join(d, "c"))
            back = ht.load(os.path.join(d, "c"), {"t": s.table, "s": opt.init(s.table)})
        return back["t"], _leaves(back["s"]), (t, state)

    def expect(ref, s, made):
        t, state = made
        return ShardedRef.of(placed_snapshot(t), shards_of(s.placement)), _leaves(state)
    return call, expect


@row()
def lookup_or_insert_into_a_full_table():  # keys that find no slot are counted, in jit too
    # a fresh table of the start's size (its programs), fed more new keys than it has slots
    def call(s):
        t = ht.set_load_policy(_fresh(s.placement)[0], max_load_factor=1.0)
        unplaced = []
        for i in range(FILLS):
            t, _, info = ht.lookup_or_insert(t, np.arange(BATCH) + 1000 * i, **COUNTER)
            unplaced.append(int(info.unplaced))
        dropped = jax.jit(lambda t: t.dropped)(t)
        return t, {"unplaced": unplaced, "some": sum(unplaced) > 0, "dropped_in_jit": int(dropped),
                   "counter64": isinstance(dropped, ht.words.Counter64)}, None

    def expect(ref, s, made):
        ref = ShardedRef(shards_of(s.placement), np.full((SLOTS, DIM), INIT, np.float32))
        unplaced = [ref.lookup_or_insert(np.arange(BATCH) + 1000 * i, **COUNTER)[1]["unplaced"]
                    for i in range(FILLS)]
        return ref, {"unplaced": unplaced, "some": True, "dropped_in_jit": sum(unplaced),
                     "counter64": True}
    return call, expect


@row()
def cann_bytes():  # one device: CANN's bucket bytes and back; a sharded table is refused
    fields = ("keys", "counters", "flags", "values", "live", "not_exported")

    def call(s):
        try:
            back = ht.cann.from_cann_bytes(ht.cann.to_cann_bytes(s.table), DIM)
        except OpArgumentError as e:
            return None, {"refused": e.op == "to_cann_bytes" and "shard" in str(e)}, None
        snap = placed_snapshot(back)
        return None, {k: snap[k] for k in fields}, None

    def expect(ref, s, made):
        if s.placement != "one_device":
            return ref, {"refused": True}
        snap = ref.snapshot()
        return ref, {k: snap[k] for k in fields}
    return call, expect

