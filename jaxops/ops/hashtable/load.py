"""Load-factor policy: what an insert does when a table passes its ``max_load_factor``.

Linear probing slows down sharply as a table fills (measured at 2^22 slots: 1.7-3.4 M
inserts/s below 56 % load, 0.34 M/s at 88-94 %, 30 K/s at 97-98 %), so every table carries
a limit, ``max_load_factor`` (default 0.9, static), and a policy for an insert that would
pass it — never silent. Eagerly the policy acts **before** the insert, on the table as it
is (so a donated table is never half-updated): a call whose keys could pass the limit
(``live + len(keys) > max_live``) first counts its new keys (one O(batch) probe), and when
``live + new`` passes the limit:

- ``"error"``: the call raises and the table is unchanged.
- ``"grow"``: the table is rehashed into one twice the size (until the keys fit the limit;
  tombstones are dropped) and the call runs there.
- ``"evict"`` / ``"evict_lfu"``: the ``live + new - max_live`` live keys of lowest score
  that the call does not touch become tombstones
  (:func:`~jaxops.ops.hashtable.scored.evict_lowest`, least recently used first / least
  frequently used first), and the call's new keys reuse their slots. Each such call pays one scored selection over the table's
  slots (O(table)); a table kept at its limit amortises that by evicting a ``fraction``
  with ``evict_lowest`` now and then, leaving headroom for many calls.

Inside ``jit`` (shapes are static, nothing can be raised) every policy lets the keys in
while slots last and reports ``info.over_limit``, as the operators' overflow policies do.
This is beyond CANN, which has no limit. A policy is a function in :data:`LOAD_POLICIES`.

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

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.core.errors import OpArgumentError
from jaxops.ops.hashtable.batch import first_occurrences
from jaxops.ops.hashtable.probe import find_slots
from jaxops.ops.hashtable.table import EVICTED, HashTable, Words64, check_table

__all__ = ["LOAD_POLICIES", "set_load_policy"]


def _raise(op: str, table: HashTable, needed: int, present: np.ndarray, donate: bool):
    raise OpArgumentError(
        op, "table", f"at most {table.max_live} live keys (max_load_factor "
        f"{table.max_load_factor:g} of {table.bucket_size} slots)", f"{needed} after this call",
        "Grow the table with resize(), reclaim tombstones with compact(), or "
        "set_load_policy(table, policy='grow' or 'evict').")


def _grow(op: str, table: HashTable, needed: int, present: np.ndarray, donate: bool):
    from jaxops.ops.hashtable.resize import resize  # resize inserts, so it imports us

    size = table.bucket_size * 2
    while int(table.max_load_factor * size) < needed:
        size *= 2
    grown = resize(table, size)
    if donate:
        consume(table, grown)
    return grown


def _evict_by(by: str) -> Callable:
    def evict_policy(op: str, table: HashTable, needed: int, present: np.ndarray,
                     donate: bool):
        from jaxops.ops.hashtable.scored import evict_lowest  # scored uses the table's ops

        spare = np.unique(present[present >= 0])
        n = needed - table.max_live
        if n > int(table.live) - spare.size:
            _raise(op, table, needed, present, donate)
        return evict_lowest(table, n, by=by, keep=spare, donate=donate)

    evict_policy.__name__ = f"evict_{by}"
    return evict_policy


#: ``policy(op, table, needed, present, donate) -> table``: called eagerly before an insert
#: that would leave ``needed`` live keys, more than ``table.max_live``; ``present`` holds the
#: slots (numpy int32, -1 padded) of the call's keys already live, which it must keep. It
#: returns the table to insert into, or raises; with ``donate`` it may consume ``table``.
LOAD_POLICIES: dict[str, Callable] = {"error": _raise, "grow": _grow,
                                      "evict": _evict_by("lru"), "evict_lfu": _evict_by("lfu")}


def set_load_policy(table: HashTable, *, max_load_factor: float = 0.9,
                    policy: str = "error") -> HashTable:
    """``table`` with another load limit and policy (see the module docstring).

    Args:
        table: the table.
        max_load_factor: in ``(0, 1]``; 1.0 lets a table fill up (inserts that find no slot
            are then counted in ``info.unplaced`` and ``table.dropped``).
        policy: a name in :data:`LOAD_POLICIES` (``"error"``, ``"grow"``, ``"evict"``,
            ``"evict_lfu"``).
    """
    op = "set_load_policy"
    table = check_table(op, table)
    if not 0.0 < float(max_load_factor) <= 1.0:
        raise OpArgumentError(op, "max_load_factor", "a float in (0, 1]", repr(max_load_factor))
    if policy not in LOAD_POLICIES:
        raise OpArgumentError(op, "policy", f"one of {sorted(LOAD_POLICIES)}", repr(policy))
    return table.replace(max_load_factor=float(max_load_factor), load_policy=policy)


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


def insert_under_policy(op: str, table: HashTable, n_keys: int,
                        count: Callable[[HashTable], tuple[jax.Array, jax.Array]],
                        run: Callable[[HashTable], Any], donate: bool = False) -> Any:
    """``run(table)``, an insert of ``n_keys`` keys, under the table's load policy.

    ``count(table)`` is :func:`count_new_keys` of the call's keys; it runs only when the
    call could pass the limit. Inside ``jit`` the call runs as it is (its info reports the
    excess).
    """
    live = table.live
    if isinstance(live, jax.core.Tracer) or int(live) + n_keys <= table.max_live:
        return run(table)
    new, present = jax.device_get(count(table))
    needed = int(live) + int(new)
    if min(needed, table.bucket_size) > table.max_live:
        table = LOAD_POLICIES[table.load_policy](op, table, needed, np.asarray(present), donate)
    return run(table)


def consume(table: HashTable, result: Any = ()) -> None:
    """Deletes the arrays of ``table`` that are not in ``result`` (a donated input that was
    not donated to XLA, e.g. the old table of a grow, is consumed all the same)."""
    keep = {id(x) for x in jax.tree_util.tree_leaves(result)}
    for leaf in jax.tree_util.tree_leaves(table):
        if id(leaf) not in keep and isinstance(leaf, jax.Array) and not leaf.is_deleted():
            leaf.delete()
