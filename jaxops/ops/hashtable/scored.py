"""Scored eviction (as HierarchicalKV offers it; beyond CANN): make room by score.

Every live entry has two scores: its access counter (LFU: least frequently used first) and
its age, ``table.clock - last_access`` modulo 2**32, the steps since a lookup last touched
it (LRU: least recently used first; see
:func:`~jaxops.ops.hashtable.inserting.lookup_or_insert` for the clock).

- :func:`evict_lowest` evicts the ``n`` (or a ``fraction`` of the) live entries of lowest
  score. Ties are broken deterministically: ``by="lru"`` orders by (age, descending;
  counter; slot), ``by="lfu"`` by (counter; age, descending; slot) — among equal scores the
  lower slot goes first.
- :func:`evict_if` evicts the live entries a predicate picks, e.g. :func:`counter_below`
  or :func:`not_seen_for` (TTL-style cleanup).

Evicted entries become tombstones exactly as :func:`~jaxops.ops.hashtable.evicting.evict`
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
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.core.errors import OpArgumentError
from jaxops.ops.hashtable.checks import check_int, check_numeric
from jaxops.ops.hashtable.owner import reset_rows
from jaxops.ops.hashtable.placement import placement_of
from jaxops.ops.hashtable.table import EVICTED, EXPORT, VALID, HashTable
from jaxops.ops.hashtable.words import Words64

__all__ = ["SlotPredicate", "SlotScores", "counter_below", "evict_if", "evict_lowest",
           "evict_lowest_per_shard", "not_seen_for"]


class SlotScores(NamedTuple):
    """What an :func:`evict_if` predicate sees: one entry per slot (``[bucket_size]``).

    Attributes:
        key: the keys (:class:`~jaxops.ops.hashtable.words.Words64`).
        counter: the access counters (Words64; ``join_words(counter, signed=False)`` is
            uint64 with x64 on).
        last_access: uint32, the clock of the last lookup that touched the slot.
        age: uint32, ``clock - last_access`` modulo 2**32 (steps since then).
        clock: uint32 scalar, the table's clock.
    """

    key: Words64
    counter: Words64
    last_access: jax.Array
    age: jax.Array
    clock: jax.Array


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


def counter_below(threshold: int) -> SlotPredicate:
    """A predicate for :func:`evict_if`: the access counter is below ``threshold``.

    >>> import numpy as np
    >>> s = SlotScores(None, Words64(np.uint32([1, 7]), np.uint32([0, 0])), None, None, None)
    >>> counter_below(5)(s).tolist()
    [True, False]
    """
    threshold = check_int("counter_below", "threshold", threshold, 0, 2**64 - 1,
                          "an int in [0, 2**64)")
    return SlotPredicate(_counter_below, (jnp.uint32(threshold & 0xFFFFFFFF),
                                          jnp.uint32(threshold >> 32)))


def _age_at_least(scores: SlotScores, steps) -> jax.Array:
    return scores.age >= steps


def not_seen_for(steps: int) -> SlotPredicate:
    """A predicate for :func:`evict_if`: no lookup touched the slot in the last ``steps``
    steps (``age >= steps``)."""
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
    place = placement_of("evict_lowest", table)
    n, keep = eviction_count(table.live, n, fraction, by, keep)
    storage = place.storage(table)
    new, _ = place.map(_lowest_on_shard, (by, float(const_val), True), storage, (n, keep),
                       donate=donate)
    return place.rebuild(table, new)


def evict_lowest_per_shard(table: Any, counts: Any, keep: Any, by: str, *,
                           donate: bool = False, states: Any = ()) -> Any:
    """Evicts ``counts[i]`` entries of lowest score in shard ``i`` (host ints), sparing the
    (global) slots ``keep`` (the ``"evict"`` load policy). ``states``: optimizer states
    beside the table as ``(state, init)`` pairs, whose rows at the evicted slots are reset
    to ``init``'s; then ``(table, [state, ...])`` is returned."""
    place = placement_of("evict_lowest", table)
    counts = np.asarray(counts, np.int32).reshape(place.num_shards)
    keep = jnp.asarray(np.asarray(keep, np.int32).reshape(-1))
    storage = place.storage(table)
    new, _ = place.map(_lowest_on_shard, (by, 0.0, False), storage,
                       (jnp.asarray(counts), keep), donate=donate and not states)
    if not states:
        return place.rebuild(table, new)
    inits = tuple(init for _, init in states)
    _, reset = place.map(_reset_on_shard, inits, (storage.flags, new.flags,
                                                  tuple(state for state, _ in states)))
    return place.rebuild(table, new), list(reset)


def _reset_on_shard(router, inits, state, replicated):
    old_flags, new_flags, states = state
    evicted = ((new_flags & EVICTED) != 0) & ((old_flags & EVICTED) == 0)
    return None, tuple(reset_rows(s, init, evicted) for s, init in zip(states, inits))


def _lowest_on_shard(router, statics, table, replicated):
    by, const_val, across = statics
    n, keep = replicated
    base = router.index() * np.int32(table.bucket_size)
    mine = (keep >= base) & (keep < base + table.bucket_size)
    local_keep = jnp.where(mine, keep - base, -1)
    if not across:  # n: every shard's count
        return evict_lowest_kernel(table, n[router.index()], local_keep, by=by,
                                   const_val=const_val), ()
    return evict_lowest_kernel(table, n, local_keep, by=by, const_val=const_val,
                               total=router.total, before=router.before), ()


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
    place = placement_of(op, table)
    if not callable(predicate):
        raise OpArgumentError(op, "predicate", "a function SlotScores -> bool[bucket_size]",
                              type(predicate).__name__)
    rule, params = (predicate.rule, predicate.params) if isinstance(predicate, SlotPredicate) \
        else (_whole(predicate), None)
    new, _ = place.map(_if_on_shard, (rule, float(const_val)), place.storage(table), params,
                       donate=donate)
    return place.rebuild(table, new)


@functools.lru_cache(maxsize=64)
def _whole(predicate: Callable) -> Callable:
    """A plain predicate as a rule (cached: the same function, the same program)."""
    return lambda scores, params: predicate(scores)


def _if_on_shard(router, statics, table, params):
    rule, const_val = statics
    picked = jnp.asarray(rule(_scores(table), params))
    if picked.shape != (table.bucket_size,) or picked.dtype != jnp.bool_:
        raise OpArgumentError("evict_if", "predicate", f"a bool [{table.bucket_size}] result",
                              f"{picked.dtype} of shape {picked.shape}")
    return _tombstones(table, picked, const_val), ()


def _live(table: HashTable) -> jax.Array:
    return (table.flags & (VALID | EVICTED)) == VALID


def _scores(table: HashTable) -> SlotScores:
    return SlotScores(table.keys, table.counters, table.last_access,
                      table.clock - table.last_access, table.clock)


def _tombstones(table: HashTable, evicted: jax.Array, const_val: float) -> HashTable:
    """``table`` with the live slots in ``evicted`` made tombstones (as ``evict`` does)."""
    evicted = evicted & _live(table)
    zero = jnp.uint32(0)
    return table.replace(
        flags=jnp.where(evicted, table.flags | jnp.uint8(EVICTED), table.flags),
        counter_lo=jnp.where(evicted, zero, table.counter_lo),
        counter_hi=jnp.where(evicted, zero, table.counter_hi),
        last_access=jnp.where(evicted, zero, table.last_access),
        values=jnp.where(evicted[:, None], jnp.float32(const_val), table.values),
        live=table.live - jnp.sum(evicted, dtype=jnp.int32),
        not_exported=table.not_exported - jnp.sum(evicted & ((table.flags & EXPORT) == 0),
                                                  dtype=jnp.int32))


def _score_words(table: HashTable, by: str) -> list[jax.Array]:
    """The score as uint32 words, most significant first (lower evicts first)."""
    recency = ~(table.clock - table.last_access)  # the older, the lower
    counter = [table.counter_hi, table.counter_lo]
    return [recency, *counter] if by == "lru" else [*counter, recency]


def lowest(words: list[jax.Array], candidate: jax.Array, n: jax.Array,
           total: Callable = lambda c: c, before: Callable = lambda c: 0) -> jax.Array:
    """The mask of the ``n`` candidates of lowest score (``words`` most significant first;
    ties to the lower index). A bisection, one bit a step: ``below`` gathers the candidates
    known to be lower than the ``n``-th score, ``tied`` those still equal to it so far.
    ``total`` and ``before`` let the candidates span several devices (a sharded table):
    ``total(count)`` sums a count over all of them, ``before(count)`` over those before
    this one (the order of the ties).

    >>> lowest([jnp.uint32([5, 1, 5, 3])], jnp.array([True, True, True, False]),
    ...        jnp.int32(2)).tolist()
    [True, True, False, False]
    """
    k = jnp.minimum(n, total(jnp.sum(candidate, dtype=jnp.int32)))
    below = jnp.zeros_like(candidate)
    tied = candidate

    for word in words:
        def bit_step(i, state, word=word):
            below, tied, k = state
            zero = tied & (((word >> (31 - i).astype(jnp.uint32)) & 1) == 0)
            c0 = total(jnp.sum(zero, dtype=jnp.int32))
            one = c0 < k  # the n-th lowest has a 1 here: every 0 among the tied is lower
            return (jnp.where(one, below | zero, below), jnp.where(one, tied & ~zero, zero),
                    jnp.where(one, k - c0, k))

        below, tied, k = jax.lax.fori_loop(0, 32, bit_step, (below, tied, k))
    rank = before(jnp.sum(tied, dtype=jnp.int32)) + jnp.cumsum(tied, dtype=jnp.int32)
    return below | (tied & (rank <= k))


def evict_lowest_kernel(table: HashTable, n, keep, *, by, const_val, total=lambda c: c,
                        before=lambda c: 0) -> HashTable:
    """One shard's part of :func:`evict_lowest` (``total``/``before``: sums over all shards
    and over those before this one, see :func:`lowest`)."""
    size = table.bucket_size
    spared = jnp.zeros(size, bool).at[jnp.where(keep >= 0, keep, size)].set(True, mode="drop")
    picked = lowest(_score_words(table, by), _live(table) & ~spared, jnp.maximum(n, 0), total,
                    before)
    return _tombstones(table, picked, const_val)
