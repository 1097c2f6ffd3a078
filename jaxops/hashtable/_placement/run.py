"""``run_batch``: the one call every batched table operation runs through.

A batched operation (``lookup_or_insert``, ``import_``, ``evict``, the reads, the row
optimizers' updates) is a function of one shard and a batch; ``run_batch`` runs it on the
table's placement, and does, in this order, what every such call needs:

1. **the load policy** (a call that inserts, eagerly): the table the call runs on, grown or
   evicted first when it would pass its limit, or an error
   (:func:`~jaxops.hashtable._placement.load_policy.apply_load_policy`);
2. **the routing capacity**: the call's ``route_capacity``, else the table's own (a table on
   a mesh keeps one, which ``maintain`` sets from what the steps needed), else the most a
   device can send to one shard, which nothing overflows;
3. **the rerun engine** (:func:`~jaxops.capacity.policy.settle`): the placement's frame
   (:meth:`~jaxops.hashtable._placement.placement.Placement.call`) at that capacity, run
   again at the next power of two while keys did not fit their routing buffer
   (``overflow="expand"``), or refused (``"error"``) or kept with a warning
   (``"truncate"``). Inside ``jit`` nothing reruns: the call's
   :class:`~jaxops.hashtable._placement.route.RouteInfo` reports it. A placement that
   routes nothing never overflows (and is never synced).

>>> import numpy as np, jaxops.hashtable as ht
>>> from jaxops.hashtable._kernels.read_kernel import find_on_shard
>>> t = ht.init_table(8, 2, initializer_mode="constant", constant_value=1.0)
>>> t, _, _ = ht.lookup_or_insert(t, np.array([3], np.int64))
>>> words = ht.words.as_words(np.array([3, 4], np.int64))
>>> ran = run_batch("doc", t, find_on_shard, (0.0, True), words)
>>> ran.per_key[0][:, 0].tolist(), ran.route.served.tolist()
([1.0, 0.0], [True, True])
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax

from jaxops.capacity.policy import KEEP, next_capacity, settle, warn_once
from jaxops.core.errors import OpArgumentError, RouteOverflowError
from jaxops.hashtable._placement.load_policy import Inserting, apply_load_policy
from jaxops.hashtable._placement.placement import CallLocal, placement_of
from jaxops.hashtable._placement.route import RouteInfo

__all__ = ["ROUTE_POLICIES", "Ran", "run_batch"]

#: What an eager call does when keys did not fit a routing buffer (``overflow=``).
ROUTE_POLICIES = ("error", "truncate", "expand")


class Ran(NamedTuple):
    """What :func:`run_batch` gives back.

    Attributes:
        table: the new table (the same placement; keys not routed added to its count).
        beside: the new state that lay beside the table (``beside=``; None without one).
        per_key: the shard function's answers, one per key of the batch, in its order.
        totals: the shard function's totals (the same on every shard).
        route: the call's :class:`~jaxops.hashtable._placement.route.RouteInfo`.
    """

    table: Any
    beside: Any
    per_key: Any
    totals: Any
    route: RouteInfo


def run_batch(op: str, table: Any, local: CallLocal, statics: Any, batch: Any,
              replicated: Any = None, *, beside: Any = None, inserting: Inserting | None = None,
              route_capacity: int | None = None, overflow: str = "expand",
              donate: bool = False) -> Ran:
    """Runs ``local(router, statics, state, batch, active, replicated) -> (state, per_key,
    totals, sent)`` on ``table``'s placement (see the module docstring).

    Args:
        op: the operation's name, for errors.
        table: the table (any placement).
        local: the shard function (hashable: each frame is compiled once per function).
        statics: its static configuration (hashable).
        batch: the keys (or slots) and their payload, a tree of arrays with one entry per
            lane along axis 0, split over the shards.
        replicated: what every shard gets whole (a step, hyper-parameters).
        beside: a state laid out like the table (an optimizer state): ``local`` gets
            ``(storage, beside)`` as its state and returns them both.
        inserting: the keys the call may insert: the table's load policy applies.
        route_capacity, overflow: on a mesh, lanes per destination buffer and what an eager
            call does when keys do not fit them (:data:`ROUTE_POLICIES`).
        donate: eagerly, hand the table's (and ``beside``'s) buffers to the call.
    """
    placement = placement_of(op, table)
    if overflow not in ROUTE_POLICIES:
        raise OpArgumentError(op, "overflow", f"one of {ROUTE_POLICIES}", repr(overflow))
    donate = donate and not isinstance(placement.storage(table).live, jax.core.Tracer)
    if donate and placement.routes and route_capacity is not None and overflow == "expand":
        raise OpArgumentError(op, "donate", "False when route_capacity is given with "
                              "overflow='expand' (a rerun needs the table the first try "
                              "consumed)", "True", "Pass route_capacity=None (never "
                              "overflows) or overflow='error'/'truncate'.")
    if inserting is not None:
        table = apply_load_policy(op, table, inserting, donate)
    n = int(jax.tree.leaves(batch)[0].shape[0])
    if route_capacity is None:
        route_capacity = getattr(table, "route_capacity", None)
    most = placement.batch_capacity(op, n, None)
    given = placement.batch_capacity(op, n, route_capacity)

    def attempt(capacity: int) -> Ran:
        storage = placement.storage(table)
        state = storage if beside is None else (storage, beside)
        new, per_key, totals, route = placement.call(local, statics, state, batch, replicated,
                                                     capacity=capacity, donate=donate)
        new, new_beside = (new, None) if beside is None else new
        return Ran(placement.with_storage(table, new, route.lost), new_beside, per_key, totals,
                   route)

    if not placement.routes:
        return attempt(given)

    def shortfall(ran: Ran) -> RouteInfo | None:
        return ran.route if int(ran.route.lost) else None

    def remedy(capacity: int, route: RouteInfo):
        needed, lost = int(route.needed), int(route.lost)
        if overflow == "error":
            raise RouteOverflowError(op, capacity, needed, lost)
        if overflow == "truncate":
            warn_once(f"{op}: {lost} keys did not fit route_capacity={capacity} (needed "
                      f"{needed}); they were not served (info.route.served).")
            return KEEP
        return next_capacity(needed, most)

    return settle(attempt, given, shortfall=shortfall, remedy=remedy, tries=1)
