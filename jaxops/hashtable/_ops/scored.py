"""Scored eviction (as HierarchicalKV offers it; beyond CANN): make room by score.

Every live entry has two scores: its access counter (LFU: least frequently used first) and
its age, ``table.clock - last_access`` modulo 2**32, the steps since a lookup last touched
it (LRU: least recently used first; see
:func:`~jaxops.hashtable._ops.inserting.lookup_or_insert` for the clock).

- :func:`evict_lowest` evicts the ``n`` (or a ``fraction`` of the) live entries of lowest
  score. Ties are broken deterministically: ``by="lru"`` orders by (age, descending;
  counter; slot), ``by="lfu"`` by (counter; age, descending; slot) — among equal scores the
  lower slot goes first.
- :func:`evict_if` evicts the live entries a predicate picks, e.g. :func:`counter_below`
  or :func:`not_seen_for` (TTL-style cleanup).

Evicted entries become tombstones exactly as :func:`~jaxops.hashtable._ops.evicting.evict`
makes them (counter and ``last_access`` 0, row set to ``const_val``), and new keys reuse
their slots. Eviction is maintenance: a pass over the table's slots (the selection is a
32-step bisection per score word, with a few ``[bucket_size]`` masks as scratch), never a
second copy of the rows; with ``donate=True`` the table is updated in place.

On a mesh, ``evict_if`` runs the predicate on every shard's slots (an entry's scores do not
depend on where it lives, and every shard keeps the clock in step), so it evicts the same
entries as one table. ``evict_lowest`` selects the ``n`` lowest scores over **all** shards
(the bisection's counts are summed over the mesh axis), ties to the lower **global** slot;
:func:`evict_lowest_per_shard` evicts a count per shard (the ``"evict"`` load policy, whose
limit is per shard).

**Predicates are data.** :func:`not_seen_for` and :func:`counter_below` return a
:class:`SlotPredicate`: a rule (static) and its thresholds (traced arrays), so a loop that
calls ``evict_if(t, not_seen_for(k))`` with a new ``k`` each time compiles once. A plain
function works too, but each distinct function object is a program of its own.

>>> import numpy as np, jaxops.hashtable as ht
>>> t = ht.init_table(16, 1, initializer_mode="constant")
>>> t, _, _ = ht.lookup_or_insert(t, np.array([1, 2, 3, 1], np.int64))   # step 1
>>> t, _, _ = ht.lookup_or_insert(t, np.array([2], np.int64))            # step 2
>>> ht.find(ht.evict_lowest(t, 1, by="lfu"), np.array([1, 2, 3], np.int64))[1].tolist()
[True, True, False]
>>> ht.find(ht.evict_lowest(t, 2, by="lru"), np.array([1, 2, 3], np.int64))[1].tolist()
[False, True, False]
>>> t = ht.evict_if(t, ht.not_seen_for(1))   # keys 1 and 3 were last seen at step 1
>>> int(t.live)
1
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.core.errors import OpArgumentError
from jaxops.hashtable._kernels.score_kernel import (SlotScores, if_on_shard, lowest_on_shard,
                                                    reset_on_shard)
from jaxops.hashtable._placement.placement import placement_of
from jaxops.hashtable._table.checks import check_int, check_numeric

__all__ = ["SlotPredicate", "SlotScores", "counter_below", "evict_if", "evict_lowest",
           "evict_lowest_per_shard", "not_seen_for"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SlotPredicate:
    """An :func:`evict_if` predicate as data: ``rule(scores, params) -> bool [slots]`` with
    ``rule`` static (a module-level function) and ``params`` a pytree of arrays, traced: a
    new threshold is a new value, not a new program.

    >>> import jax.numpy as jnp
    >>> old = SlotPredicate(lambda s, p: s.age >= p, jnp.uint32(10))
    >>> callable(old), old.params.dtype
    (True, dtype('uint32'))
    """

    rule: Callable[[SlotScores, Any], jax.Array] = dataclasses.field(metadata={"static": True})
    params: Any

    def __call__(self, scores: SlotScores) -> jax.Array:
        return self.rule(scores, self.params)


def _counter_below(scores: SlotScores, params) -> jax.Array:
    t_lo, t_hi = params
    c = scores.counter
    return (c.hi < t_hi) | ((c.hi == t_hi) & (c.lo < t_lo))


def _traced_uint32(op: str, arg: str, x: Any) -> jax.Array | None:
    """``x`` if it is a uint32 scalar array (a threshold computed inside ``jit``); None
    for anything else but a JAX array, which is refused (a signed or wider value would be
    cast silently)."""
    if not isinstance(x, jax.Array):
        return None
    if x.dtype != jnp.uint32 or x.ndim != 0:
        raise OpArgumentError(op, arg, "a Python int, or a uint32 scalar array (inside jit)",
                              f"a {x.dtype} array of shape {list(x.shape)}",
                              f"Pass jnp.uint32({arg}) or {arg}.astype(jnp.uint32).")
    return x


def counter_below(threshold: int | jax.Array) -> SlotPredicate:
    """A predicate for :func:`evict_if`: the access counter is below ``threshold``, a
    Python int in ``[0, 2**64)`` or a uint32 scalar array (traced inside ``jit``).

    >>> import numpy as np
    >>> from jaxops.hashtable.words import Words64
    >>> s = SlotScores(None, Words64(np.uint32([1, 7]), np.uint32([0, 0])), None, None, None)
    >>> counter_below(5)(s).tolist(), counter_below(jnp.uint32(8))(s).tolist()
    ([True, False], [True, True])
    """
    traced = _traced_uint32("counter_below", "threshold", threshold)
    if traced is not None:
        return SlotPredicate(_counter_below, (traced, jnp.uint32(0)))
    threshold = check_int("counter_below", "threshold", threshold, 0, 2**64 - 1,
                          "an int in [0, 2**64)")
    return SlotPredicate(_counter_below, (jnp.uint32(threshold & 0xFFFFFFFF),
                                          jnp.uint32(threshold >> 32)))


def _age_at_least(scores: SlotScores, steps) -> jax.Array:
    return scores.age >= steps


def not_seen_for(steps: int | jax.Array) -> SlotPredicate:
    """A predicate for :func:`evict_if`: no lookup touched the slot in the last ``steps``
    steps (``age >= steps``), ``steps`` a Python int in ``[0, 2**32)`` or a uint32 scalar
    array (traced inside ``jit``)."""
    traced = _traced_uint32("not_seen_for", "steps", steps)
    if traced is not None:
        return SlotPredicate(_age_at_least, traced)
    steps = check_int("not_seen_for", "steps", steps, 0, 2**32 - 1, "an int in [0, 2**32)")
    return SlotPredicate(_age_at_least, jnp.uint32(steps))


def evict_lowest(table: Any, n: Any = None, *, fraction: float | None = None,
                 by: str = "lru", keep: Any = None, const_val: float = 0.0,
                 donate: bool = False) -> Any:
    """Evicts the ``n`` live entries of lowest score (see the module docstring for the
    order and its ties), over all shards of the table's placement.

    Args:
        table: the table (any placement).
        n: how many entries (an int, or an int32 scalar inside ``jit``); more than the
            live entries evicts them all.
        fraction: instead of ``n``, a fraction in ``[0, 1]`` of the live entries
            (``floor(fraction * live)``; inside ``jit`` computed in float32).
        by: ``"lru"`` (oldest ``last_access`` first) or ``"lfu"`` (lowest counter first).
        keep: int32 (global) slots never to evict (e.g. ``info.slots`` of the current
            batch; -1 is ignored).
        const_val: the value the evicted rows get.
        donate: update ``table`` in place; it is consumed (see ``lookup_or_insert``).

    Returns:
        The new table.
    """
    placement = placement_of("evict_lowest", table)
    n, keep = eviction_count(table.live, n, fraction, by, keep)
    storage = placement.storage(table)
    new, _ = placement.map(lowest_on_shard, (by, float(const_val), True), storage, (n, keep),
                           donate=donate)
    return placement.with_storage(table, new)


def evict_lowest_per_shard(table: Any, counts: Any, keep: Any, by: str, *,
                           donate: bool = False, states: Any = ()) -> Any:
    """Evicts ``counts[i]`` entries of lowest score in shard ``i`` (host ints), sparing the
    (global) slots ``keep`` (the ``"evict"`` load policy). ``states``: optimizer states
    beside the table as ``(state, init)`` pairs, whose rows at the evicted slots are reset
    to ``init``'s; then ``(table, [state, ...])`` is returned."""
    placement = placement_of("evict_lowest", table)
    counts = np.asarray(counts, np.int32).reshape(placement.num_shards)
    keep = jnp.asarray(np.asarray(keep, np.int32).reshape(-1))
    storage = placement.storage(table)
    new, _ = placement.map(lowest_on_shard, (by, 0.0, False), storage,
                           (jnp.asarray(counts), keep), donate=donate and not states)
    if not states:
        return placement.with_storage(table, new)
    inits = tuple(init for _, init in states)
    _, reset = placement.map(reset_on_shard, inits, (storage.flags, new.flags,
                                                     tuple(state for state, _ in states)))
    return placement.with_storage(table, new), list(reset)


def eviction_count(live: Any, n: Any, fraction: float | None, by: str, keep: Any
                   ) -> tuple[jax.Array, jax.Array]:
    """``evict_lowest``'s arguments checked: ``(n, keep)`` as int32 arrays, ``n`` from
    ``fraction`` of ``live`` where given."""
    op = "evict_lowest"
    if by not in ("lru", "lfu"):
        raise OpArgumentError(op, "by", "'lru' or 'lfu'", repr(by))
    if (n is None) == (fraction is None):
        raise OpArgumentError(op, "n", "exactly one of n and fraction", f"n={n!r}, "
                              f"fraction={fraction!r}")
    if fraction is not None:
        if isinstance(fraction, (bool, np.bool_)) or not isinstance(
                fraction, (int, float, np.integer, np.floating)) or not 0.0 <= fraction <= 1.0:
            raise OpArgumentError(op, "fraction", "a float in [0, 1]", repr(fraction))
        n = (int(float(fraction) * int(live)) if not isinstance(live, jax.core.Tracer)
             else (live.astype(jnp.float32) * np.float32(fraction)).astype(jnp.int32))
    else:
        scalar = isinstance(n, (jax.Array, np.ndarray)) and np.ndim(n) == 0 and \
            jnp.issubdtype(n.dtype, jnp.integer)
        if not (scalar and isinstance(n, jax.core.Tracer)):  # a traced count: unchecked
            n = check_int(op, "n", n.item() if scalar else n, 0, 2**31 - 1,
                          "an int in [0, 2**31) (or an int32 scalar inside jit)")
    keep = jnp.full((1,), -1, jnp.int32) if keep is None else jnp.asarray(check_numeric(
        op, "keep", keep, "int32 slots never to evict (-1 is ignored)", integer=True),
        jnp.int32).reshape(-1)
    return jnp.asarray(n, jnp.int32), keep


def evict_if(table: Any, predicate: Callable[[SlotScores], jax.Array], *,
             const_val: float = 0.0, donate: bool = False) -> Any:
    """Evicts every live entry for which ``predicate`` is True.

    Args:
        table: the table (any placement; the predicate sees one shard's slots).
        predicate: a :class:`SlotPredicate` (e.g. ``counter_below(3)``,
            ``not_seen_for(100)``: one program whatever the threshold), or a function
            ``predicate(scores: SlotScores) -> bool [slots]``, vectorised over the slots
            (traced: use ``jnp``), e.g. ``lambda s: (s.age > 10) & (s.counter.lo < 5)``:
            one program per function object. Slots that are empty or tombstones are never
            evicted, whatever it says.
        const_val: the value the evicted rows get.
        donate: update ``table`` in place; it is consumed (see ``lookup_or_insert``).
    """
    op = "evict_if"
    placement = placement_of(op, table)
    if not callable(predicate):
        raise OpArgumentError(op, "predicate", "a function SlotScores -> bool[bucket_size]",
                              type(predicate).__name__)
    rule, params = (predicate.rule, predicate.params) if isinstance(predicate, SlotPredicate) \
        else (_whole(predicate), None)
    new, _ = placement.map(if_on_shard, (rule, float(const_val)), placement.storage(table),
                           params, donate=donate)
    return placement.with_storage(table, new)


@functools.lru_cache(maxsize=64)
def _whole(predicate: Callable) -> Callable:
    """A plain predicate as a rule (cached: the same function, the same program)."""
    return lambda scores, params: predicate(scores)
