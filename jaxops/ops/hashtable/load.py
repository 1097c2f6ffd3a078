"""Load-factor policy: what an insert does when a table passes its ``max_load_factor``.

Linear probing slows down sharply as a table fills (measured at 2^22 slots: 1.7-3.4 M
inserts/s below 56 % load, 0.34 M/s at 88-94 %, 30 K/s at 97-98 %), so every table carries
a limit, ``max_load_factor`` (default 0.9, static), and a policy for an insert that would
pass it — never silent:

- ``"error"``: eagerly, the call raises and the table is unchanged; inside ``jit`` the keys
  are inserted while slots last and ``info.over_limit`` says the limit was passed.
- ``"grow"``: eagerly, the table is rehashed into one twice the size (until the keys fit the
  limit; tombstones are dropped) and the call runs there; inside ``jit`` it is reported like
  ``"error"`` (shapes are static there), as the operators' overflow policies do.

This is beyond CANN, which has no limit. A policy is a function in :data:`LOAD_POLICIES`;
scored eviction (``"evict"``) plugs in there.

>>> import numpy as np, jaxops.hashtable as ht
>>> t = ht.set_load_policy(ht.init_table(8, 1, initializer_mode="constant"), policy="grow")
>>> t, _, _ = ht.lookup_or_insert(t, np.arange(10, dtype=np.int64))
>>> t.bucket_size, int(t.live)
(16, 10)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from jaxops.core.errors import OpArgumentError
from jaxops.ops.hashtable.table import HashTable, check_table

__all__ = ["LOAD_POLICIES", "set_load_policy"]


def _raise(op: str, table: HashTable, live: int, retry: Callable[[HashTable], Any]):
    raise OpArgumentError(
        op, "table", f"at most {table.max_live} live keys (max_load_factor "
        f"{table.max_load_factor:g} of {table.bucket_size} slots)", f"{live} after this call",
        "Grow the table with resize(), reclaim tombstones with compact(), or "
        "set_load_policy(table, policy='grow').")


def _grow(op: str, table: HashTable, live: int, retry: Callable[[HashTable], Any]):
    from jaxops.ops.hashtable.resize import resize  # resize inserts, so it imports us

    size = table.bucket_size * 2
    while int(table.max_load_factor * size) < live:
        size *= 2
    return retry(resize(table, size))


#: ``policy(op, table, live_after, retry)``: called eagerly when a call would leave more
#: than ``table.max_live`` live keys; returns ``retry(new_table)``'s result or raises.
LOAD_POLICIES: dict[str, Callable] = {"error": _raise, "grow": _grow}


def set_load_policy(table: HashTable, *, max_load_factor: float = 0.9,
                    policy: str = "error") -> HashTable:
    """``table`` with another load limit and policy (see the module docstring).

    Args:
        table: the table.
        max_load_factor: in ``(0, 1]``; 1.0 lets a table fill up (inserts that find no slot
            are then counted in ``info.unplaced`` and ``table.dropped``).
        policy: a name in :data:`LOAD_POLICIES` (``"error"`` or ``"grow"``).
    """
    op = "set_load_policy"
    table = check_table(op, table)
    if not 0.0 < float(max_load_factor) <= 1.0:
        raise OpArgumentError(op, "max_load_factor", "a float in (0, 1]", repr(max_load_factor))
    if policy not in LOAD_POLICIES:
        raise OpArgumentError(op, "policy", f"one of {sorted(LOAD_POLICIES)}", repr(policy))
    return table.replace(max_load_factor=float(max_load_factor), load_policy=policy)


def apply_load_policy(op: str, table: HashTable, result: tuple, retry: Callable[[HashTable], Any]):
    """``result`` of an insert into ``table`` (``result[0]`` the new table), or what the
    table's policy makes of it when it passed the limit. Inside ``jit`` the result stands
    (its info reports the excess)."""
    live = result[0].live
    if isinstance(live, jax.core.Tracer) or int(live) <= table.max_live:
        return result
    needed = int(live) + int(result[-1].unplaced)  # the keys a full table could not take
    return LOAD_POLICIES[table.load_policy](op, table, needed, retry)
