"""Load-factor policy: what a call that inserts does when a table would pass its
``max_load_factor`` — the part :func:`~jaxops.hashtable._placement.run.run_batch` applies
before it runs the call.

Every table carries a limit, ``max_load_factor`` (default 0.9, static), per shard
(``max_live = max_load_factor * shard_size``), and a policy, a function in
:data:`LOAD_POLICIES` by name (the table's static ``load_policy``). Eagerly the policy acts
**before** the insert, on the table as it is (so a donated table is never half-updated): a
call whose keys could pass the limit first counts its new keys per shard (one routed
O(batch) probe), and when some shard would pass it the policy runs, through the shared rerun
engine (:func:`~jaxops.capacity.policy.settle`), which counts again after it acted; a policy
that made no room raises. Inside ``jit`` (shapes are static, nothing can be raised) the
keys go in while slots last and the call's info reports ``over_limit``. Only ``"error"`` is
defined here; the policies that grow or evict are operations on a table and register
themselves from :mod:`~jaxops.hashtable._ops.maintaining`, where the whole story is told.

>>> import numpy as np
>>> LoadDemand(np.array([5, 9]), np.array([-1]), max_live=7, shard_size=8).over.tolist()
[False, True]
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.capacity.policy import settle
from jaxops.core.errors import OpArgumentError
from jaxops.hashtable._placement.placement import Placement, placement_of
from jaxops.hashtable._placement.route import owner_shard
from jaxops.hashtable._table.table import EVICTED, HashTable
from jaxops.hashtable._table.words64 import Words64
from jaxops.hashtable._walks.batch import effective_keys
from jaxops.hashtable._walks.probe import find_slots, first_occurrences

__all__ = ["LOAD_POLICIES", "Inserting", "LoadDemand", "apply_load_policy", "count_new_keys",
           "refuse_over_limit"]


class LoadDemand(NamedTuple):
    """What an insert would leave, shown to a load policy (host numpy).

    Attributes:
        needed: int ``[num_shards]``: live keys each shard would hold after the call.
        present: int32: the (global) slots of the call's keys that are live now (-1 padded):
            a policy must keep them.
        max_live: the most live keys a shard may hold (``max_load_factor * shard_size``).
        shard_size: slots per shard (the table's ``bucket_size`` on one device).
    """

    needed: np.ndarray
    present: np.ndarray
    max_live: int
    shard_size: int

    @property
    def over(self) -> np.ndarray:
        """bool ``[num_shards]``: the shards the call would take past their limit."""
        return np.minimum(self.needed, self.shard_size) > self.max_live


def refuse_over_limit(op: str, table: Any, demand: LoadDemand, donate: bool, states=()) -> Any:
    """The ``"error"`` policy: refuses the call, naming the shard and the fixes."""
    over = np.flatnonzero(demand.over)
    s = int(over[0]) if over.size else 0
    where = f" in shard {s}" if demand.needed.size > 1 else ""
    factor = placement_of(op, table).storage(table).max_load_factor
    raise OpArgumentError(
        op, "table", f"at most {demand.max_live} live keys{' per shard' if where else ''} "
        f"(max_load_factor {factor:g} of {demand.shard_size} slots)",
        f"{int(demand.needed[s])}{where} after this call",
        "Grow the table with resize(), reclaim tombstones with compact(), or "
        "set_load_policy(table, policy='grow' or 'evict').")


#: ``policy(op, table, demand, donate) -> table``: called eagerly before an insert that would
#: take some shard past its limit (:class:`LoadDemand` says which, and which slots the call
#: keeps), or by :func:`~jaxops.hashtable._ops.maintaining.maintain` between steps. It returns the
#: table to insert into (same placement), or raises; with ``donate`` it may consume ``table``. The
#: insert counts again afterwards and raises if the policy did not make room. A policy that also
#: takes ``states=[(state, init), ...]`` (optimizer states beside the table, see ``maintain``)
#: returns ``(table, states)`` for them; the built-in ones do.
LOAD_POLICIES: dict[str, Callable] = {"error": refuse_over_limit}


class Inserting(NamedTuple):
    """The keys a call may insert (flat :class:`Words64`) and, for ``lookup_or_insert``,
    its ``(filter_key_flag, filter_key, default_key_or_value, default_key)``, whose skipped
    keys are not inserted (None: every key may be)."""

    words: Words64
    skip: tuple | None = None


def apply_load_policy(op: str, table: Any, inserting: Inserting, donate: bool = False) -> Any:
    """The table a call that inserts ``inserting.words`` runs on: ``table`` itself, or what
    its load policy made of it (see the module docstring); raises when a shard would still
    pass its limit. Inside ``jit`` ``table`` as it is (the call's info reports the excess).
    """
    placement = placement_of(op, table)
    storage = placement.storage(table)
    words, skip = inserting
    if isinstance(storage.live, jax.core.Tracer):
        return table
    live = placement.per_shard(storage.live)
    if int(live.max()) + int(words.lo.shape[0]) <= storage.max_live or np.all(
            live + _keys_per_shard(placement, _inserted_keys(words, skip)) <= storage.max_live):
        return table  # no shard could pass its limit, even if every key were new

    def count(table):
        storage = placement.storage(table)
        _, present, new, _ = placement.call(_count_on_shard, skip, storage, words)
        return table, LoadDemand(placement.per_shard(storage.live) + placement.per_shard(new),
                                 placement.to_host(present), storage.max_live,
                                 storage.bucket_size)

    def remedy(table, demand):
        policy = placement.storage(table).load_policy
        return LOAD_POLICIES[policy](op, table, demand, donate)

    def give_up(demand):
        refuse_over_limit(op, table, demand, donate)

    table, _ = settle(count, table, shortfall=lambda r: r[1] if r[1].over.any() else None,
                      remedy=remedy, tries=1, give_up=give_up)
    return table


def count_new_keys(table: HashTable, words: Words64, active: jax.Array
                   ) -> tuple[jax.Array, jax.Array]:
    """``(new, present)``: how many distinct active keys are absent or tombstones (the live
    keys an insert of them adds, slots permitting), and each active key's live slot (-1
    elsewhere). O(batch)."""
    slot, _, flags = find_slots(table, words, active)
    live = active & (slot >= 0) & ((flags & EVICTED) == 0)
    first = first_occurrences(words, active)
    lead = active & (first == jnp.arange(first.shape[0], dtype=jnp.int32))
    return jnp.sum(lead & ~live, dtype=jnp.int32), jnp.where(live, slot, -1)


def _count_on_shard(router, skip, table, words, active, replicated):
    if skip is not None:  # before routing: a replaced key goes to its replacement's shard
        words, skipped = effective_keys(words, *skip)
        active = active & ~skipped
    ex = router.keys(words, active)
    received, _ = ex.received
    new, present = count_new_keys(table, received, ex.active)
    return (None, router.back(ex, router.global_slots(present), -1), router.every(new),
            ex.sent)


def _inserted_keys(words: Words64, skip: Any) -> Words64:
    """The keys an insert routes: ``filter_key`` replaced where the call asks (an upper
    bound where it skips it instead)."""
    return words if skip is None else effective_keys(words, *skip)[0]


def _keys_per_shard(placement: Placement, words: Words64) -> np.ndarray:
    """Keys of the batch each shard holds (host int ``[num_shards]``)."""
    if placement.num_shards == 1:
        return np.array([words.lo.shape[0]])
    return np.asarray(_shard_counts(words.lo, words.hi, placement.num_shards))


@functools.partial(jax.jit, static_argnums=2)
def _shard_counts(lo: jax.Array, hi: jax.Array, shards: int) -> jax.Array:
    return jnp.zeros(shards, jnp.int32).at[owner_shard(lo, hi, shards)].add(1)
