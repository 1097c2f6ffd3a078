"""Load-factor policy: what an insert does when a table passes its ``max_load_factor``, and
:func:`maintain`, which applies it between jitted steps.

Linear probing slows down sharply as a table fills (measured at 2^22 slots: 1.7-3.4 M
inserts/s below 56 % load, 0.34 M/s at 88-94 %, 30 K/s at 97-98 %), so every table carries
a limit, ``max_load_factor`` (default 0.9, static), and a policy for an insert that would
pass it — never silent. The limit holds per shard (``max_live = max_load_factor *
shard_size``; one device is one shard). Eagerly the policy acts **before** the insert, on
the table as it is (so a donated table is never half-updated): a call whose keys could pass
the limit first counts its new keys per shard (one routed O(batch) probe), and when some
shard would pass it the policy runs, through the shared rerun engine
(:func:`~jaxops.capacity.policy.settle`), which counts again after it acted:

- ``"error"``: the call raises and the table is unchanged.
- ``"grow"``: every shard is rehashed into one twice the size (until the keys fit the
  limit; tombstones are dropped) and the call runs there.
- ``"evict"`` / ``"evict_lfu"``: each shard over its limit turns its ``needed - max_live``
  live keys of lowest score that the call does not touch into tombstones
  (:func:`~jaxops.hashtable._ops.scored.evict_lowest_per_shard`, least recently used first /
  least frequently used first), and the call's new keys reuse their slots.

Inside ``jit`` (shapes are static, nothing can be raised) every policy lets the keys in
while slots last and reports ``info.over_limit``, as the operators' overflow policies do.
A policy is a function in :data:`LOAD_POLICIES`; a user's own works on every placement.

>>> import numpy as np, jaxops.hashtable as ht
>>> t = ht.set_load_policy(ht.init_table(8, 1, initializer_mode="constant"), policy="grow")
>>> t, _, _ = ht.lookup_or_insert(t, np.arange(10, dtype=np.int64))
>>> t.bucket_size, int(t.live)
(16, 10)
>>> t = ht.set_load_policy(ht.init_table(8, 1, initializer_mode="constant"), max_load_factor=0.5,
...                        policy="evict")
>>> for batch in ([1, 2], [3, 4], [1, 5]):   # key 2 is the least recently used at [1, 5]
...     t, _, _ = ht.lookup_or_insert(t, np.array(batch, np.int64))
>>> ht.find(t, np.arange(1, 6, dtype=np.int64))[1].tolist()
[True, False, True, True, True]
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from jaxops.core.errors import OpArgumentError
from jaxops.hashtable._ops.resizing import resize
from jaxops.hashtable._ops.scored import evict_lowest_per_shard
from jaxops.hashtable._placement.load_policy import LOAD_POLICIES, LoadDemand, refuse_over_limit
from jaxops.hashtable._placement.placement import Placement, placement_of
from jaxops.hashtable._table.checks import check_int

__all__ = ["Maintenance", "consume", "maintain", "set_load_policy"]


def _grow(op: str, table: Any, demand: LoadDemand, donate: bool, states=()) -> Any:
    storage = placement_of(op, table).storage(table)
    size = 2 * demand.shard_size
    while int(storage.max_load_factor * size) < int(demand.needed.max()):
        size *= 2
    grown = resize(table, size * demand.needed.size, states=states)
    if donate:
        consume(table, grown)
    return grown


def _evict_by(by: str) -> Callable:
    def evict_policy(op: str, table: Any, demand: LoadDemand, donate: bool, states=()) -> Any:
        placement = placement_of(op, table)
        live = placement.per_shard(placement.storage(table).live)
        kept = np.unique(demand.present[demand.present >= 0]) // demand.shard_size
        spare = np.bincount(kept, minlength=live.size)
        counts = np.where(demand.over, demand.needed - demand.max_live, 0)
        if np.any(counts > live - spare):  # the call itself needs more than the limit
            needed = np.where(counts > live - spare, demand.needed, 0)
            refuse_over_limit(op, table, demand._replace(needed=needed), donate)
        return evict_lowest_per_shard(table, counts, demand.present, by, donate=donate,
                                      states=states)

    evict_policy.__name__ = f"evict_{by}"
    return evict_policy


# The policies that act on the table register beside "error" (defined with the call that
# applies them, one layer down).
LOAD_POLICIES.update({"grow": _grow, "evict": _evict_by("lru"), "evict_lfu": _evict_by("lfu")})


def set_load_policy(table: Any, *, max_load_factor: float = 0.9, policy: str = "error") -> Any:
    """``table`` (any placement) with another load limit and policy (see the module
    docstring; on a mesh the limit holds per shard).

    Args:
        table: the table.
        max_load_factor: in ``(0, 1]``; 1.0 lets a table fill up (inserts that find no slot
            are then counted in ``info.unplaced`` and ``table.dropped``).
        policy: a name in :data:`LOAD_POLICIES` (``"error"``, ``"grow"``, ``"evict"``,
            ``"evict_lfu"``, or one registered there).
    """
    op = "set_load_policy"
    placement = placement_of(op, table)
    if isinstance(max_load_factor, (bool, np.bool_)) or not isinstance(
            max_load_factor, (int, float, np.integer, np.floating)) \
            or not 0.0 < float(max_load_factor) <= 1.0:
        raise OpArgumentError(op, "max_load_factor", "a float in (0, 1]", repr(max_load_factor))
    if policy not in LOAD_POLICIES:
        raise OpArgumentError(op, "policy", f"one of {sorted(LOAD_POLICIES)}", repr(policy))
    storage = placement.storage(table).replace(max_load_factor=float(max_load_factor),
                                               load_policy=policy)
    return placement.with_storage(table, storage)


def consume(table: Any, result: Any = ()) -> None:
    """Deletes the arrays of ``table`` that are not in ``result`` (a donated input that was
    not donated to XLA, e.g. the old table of a grow, is consumed all the same)."""
    keep = {id(x) for x in jax.tree_util.tree_leaves(result)}
    for leaf in jax.tree_util.tree_leaves(table):
        if id(leaf) not in keep and isinstance(leaf, jax.Array) and not leaf.is_deleted():
            leaf.delete()


class Maintenance(NamedTuple):
    """What one :func:`maintain` call found and did (host ints).

    Attributes:
        action: ``"none"``, or the policy that acted (``"grow"``, ``"evict"``, ...).
        live: live keys when called (all shards).
        bucket_size: slots after the call.
        grown: 1 when the table grew (its shapes changed: a jitted step recompiles once).
        evicted: keys the policy evicted (their optimizer state reset).
        lost: keys the caller says were lost since the last call (``info.unplaced``).
        route_capacity: the table's routing capacity after the call (a table on a mesh;
            None: each device's batch slice, or one device).
        unrouted: keys the caller says did not fit a routing buffer since the last call
            (``info.route.lost``): not served that step; the routing capacity grows.
    """

    action: str
    live: int
    bucket_size: int
    grown: int
    evicted: int
    lost: int
    route_capacity: int | None = None
    unrouted: int = 0


def maintain(table: Any, states: Sequence[tuple[Any, Callable]] = (), *, headroom: int = 0,
             lost: int = 0, route_needed: int = 0, name: str = "table"
             ) -> tuple[Any, list, Maintenance]:
    """Applies the table's load policy between jitted steps: the lifecycle call.

    Inside ``jit`` an insert cannot grow or evict (shapes are static); it inserts while
    slots last and reports (``info.over_limit``, ``info.unplaced``). Call this between steps
    (eagerly; it reads each shard's live count, one small transfer) so that the next step
    has room: when some shard holds more than ``max_live - headroom`` live keys,

    - ``"grow"`` rebuilds the table at twice the size (until the keys and the headroom fit
      the limit), and every optimizer state with it: each key keeps its row and its state,
      new slots get the table's initializer. Growth is geometric, so a jitted step
      recompiles once per doubling (``report.grown``).
    - ``"evict"`` / ``"evict_lfu"`` evict the lowest-scored keys down to the limit minus the
      headroom; their optimizer state rows are reset (a key that comes back starts fresh).
    - ``"error"`` raises, naming the table and the fix, once the limit was passed or keys
      were lost (``lost``); a table still under its limit is left alone.
    - a policy registered in :data:`LOAD_POLICIES` is called with a :class:`LoadDemand`
      (and ``states=`` when it takes them).

    On a mesh it also sizes the routing buffers the table's calls use by default
    (``table.route_capacity``): twice the largest buffer the steps needed
    (``route_needed``, from ``info.route.needed``), to a power of two, growing only (each
    change recompiles a jitted step once). Each device sends each distinct key once, so the
    buffers hold distinct keys: a fraction of the batch on skewed ids.

    Args:
        table: the table (any placement).
        states: the optimizer states beside it, as ``(state, init)`` with ``init`` the
            function that makes that state for a table (``opt.init``, ``adam_w_init``).
        headroom: live keys the next steps may add to the table (e.g. twice the most new
            keys a step inserted); the policy keeps that much room below the limit (on a
            mesh, each shard its share: new keys spread over the shards by hash, so the
            share is ``headroom / shards`` plus three standard deviations).
        lost: keys the steps since the last call could not place (the sum of their
            ``info.unplaced``), reported and, with ``"error"``, refused.
        route_needed: the largest routing buffer the steps since the last call needed (the
            most of their ``info.route.needed``); 0 leaves the routing capacity alone.
        name: the table's name in messages.

    Returns:
        ``(table, [state, ...], report)`` with a :class:`Maintenance` report.

    >>> import numpy as np, jaxops.hashtable as ht
    >>> t = ht.set_load_policy(ht.init_table(16, 2, initializer_mode="constant"), policy="grow")
    >>> opt = ht.optim.adagrad(0.1)
    >>> t, _, info = ht.lookup_or_insert(t, np.arange(12, dtype=np.int64))
    >>> t, (state,), report = ht.maintain(t, [(opt.init(t), opt.init)], headroom=8)
    >>> report.action, t.bucket_size, int(t.live)
    ('grow', 32, 12)
    """
    op = "maintain"
    placement = placement_of(op, table)
    storage = placement.storage(table)
    headroom = check_int(op, "headroom", headroom, 0, 2**31 - 1)
    lost = check_int(op, "lost", lost, 0, 2**63 - 1)
    route_needed = check_int(op, "route_needed", route_needed, 0, 2**31 - 1)
    table = _sized_routes(placement, table, route_needed)
    live = placement.per_shard(storage.live)
    demand = LoadDemand(live + _per_shard(headroom, live.size), np.full(1, -1, np.int32),
                        storage.max_live, storage.bucket_size)
    report = Maintenance("none", int(live.sum()), table.bucket_size, 0, 0, lost,
                         getattr(table, "route_capacity", None))
    policy = storage.load_policy
    if policy == "error":
        if lost or (live > storage.max_live).any():
            over = np.flatnonzero(live > storage.max_live)
            where = f" (shard {int(over[0])} holds {int(live[over[0]])})" if over.size else ""
            raise OpArgumentError(
                op, name, f"at most {storage.max_live} live keys per shard and no key lost "
                f"(load policy 'error')", f"{int(live.sum())} live{where}, {lost} keys lost",
                f"Give {name} more slots, or set_load_policy({name}, policy='grow' or "
                "'evict') (TableConfig(load_policy=...) for a collection's table), and call "
                "maintain between steps.")
        return table, [state for state, _ in states], report
    if not demand.over.any():
        return table, [state for state, _ in states], report
    fn = LOAD_POLICIES[policy]
    takes_states = "states" in inspect.signature(fn).parameters
    result = fn(op, table, demand, False, states=list(states)) if takes_states \
        else fn(op, table, demand, False)
    new, new_states = result if takes_states and states else \
        (result, [state for state, _ in states])
    grown = int(new.bucket_size != table.bucket_size)
    if grown and states and not takes_states:
        raise OpArgumentError(op, "states", f"states a load policy can move ({policy!r} "
                              "does not take states=)", f"{len(states)} optimizer states",
                              "Give the policy a states= parameter (see LOAD_POLICIES).")
    after = int(np.sum(placement.per_shard(placement.storage(new).live)))
    return new, list(new_states), report._replace(route_capacity=getattr(
        new, "route_capacity", None),
        action=policy, bucket_size=new.bucket_size, grown=grown,
        evicted=max(0, int(live.sum()) - after) if not grown else 0)


def _sized_routes(placement: Placement, table: Any, route_needed: int) -> Any:
    """``table`` with routing buffers of twice ``route_needed`` lanes (a power of two) when
    its own hold less than that (never smaller: each change is a recompile)."""
    if not placement.routes or not route_needed:
        return table
    want = 1 << (2 * route_needed - 1).bit_length()
    have = table.route_capacity
    return table if have is not None and have >= want else table.replace(route_capacity=want)


def _per_shard(headroom: int, shards: int) -> int:
    """The room one of ``shards`` shards keeps for ``headroom`` new keys spread by hash:
    the mean share plus three binomial standard deviations."""
    if shards == 1:
        return headroom
    share = headroom / shards
    return int(np.ceil(share + 3.0 * np.sqrt(share * (1 - 1 / shards)))) if headroom else 0
