"""In-table AdamW (CANN EmbeddingHashTableApplyAdamW), on any placement.

Only the rows of the given keys move (lazy / sparse AdamW): each gets decoupled weight
decay ``w *= 1 - lr * wd`` and the bias-corrected Adam step, computed with the Ascend
kernel's expressions. ``beta1_power`` / ``beta2_power`` are table-wide and advance once per
call, so a row updated at every step follows ``optax.adamw`` exactly (up to rounding). On a
mesh the state lies beside the table, sharded the same way (every per-slot leaf gets the
leading shard axis; the beta powers and ``skipped`` are kept per shard, the powers all
equal; the total skipped: ``int(ht.words.sum_counters(state.skipped))``).

>>> import numpy as np, jax.numpy as jnp, jaxops.hashtable as ht
>>> t = ht.init_table(8, 2, initializer_mode="constant", constant_value=1.0)
>>> t, _, _ = ht.lookup_or_insert(t, np.array([5], np.int64))
>>> state = ht.adam_w_init(t)
>>> t, state = ht.apply_adam_w(t, state, np.array([5, 6], np.int64), jnp.ones((2, 2)),
...                            lr=0.1, weight_decay=0.0)
>>> row = ht.find(t, np.array([5], np.int64))[0]
>>> round(float(row[0, 0]), 4), int(state.skipped)
(0.9, 1)
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.core.errors import OpArgumentError, OpDTypeError
from jaxops.ops.hashtable.batch import (flat_words, group_first, group_sum, is_first, key_batch,
                                        live_slots, set_rows, slot_words)
from jaxops.ops.hashtable.checks import check_numeric
from jaxops.ops.hashtable.opdefs import APPLY_ADAM_W_OP
from jaxops.ops.hashtable.owner import SlotOwner, changed_hands, record_owners, slot_owners
from jaxops.ops.hashtable.placement import placement_of, run_routed
from jaxops.ops.hashtable.probe import take
from jaxops.ops.hashtable.table import EVICTED, VALID, HashTable
from jaxops.ops.hashtable.words import Counter64, Words64, add_to_words

__all__ = ["AdamWState", "adam_w_init", "adam_w_step", "apply_adam_w"]


GRADS = "a float array [N, embedding_dim] (one gradient row per key)"

class AdamWState(NamedTuple):
    """Optimizer state beside a table (CANN passes these as tensors).

    Attributes:
        m, v: float32 ``[bucket_size, dim]`` first and second moments, per slot.
        max_v: float32 ``[bucket_size, dim]`` running max of ``v`` (amsgrad), else ``[0, dim]``.
        beta1_power, beta2_power: float32 scalars, ``beta ** steps``.
        owner: :class:`~jaxops.ops.hashtable.owner.SlotOwner` ``[bucket_size]``: the key
            (and slot epoch) each slot's moments belong to (12 bytes a slot; not in CANN,
            see below).
        skipped: :class:`~jaxops.ops.hashtable.words.Counter64` (uint64): keys skipped so
            far (absent or evicted keys); ``int(state.skipped)`` reads it.
    """

    m: jax.Array
    v: jax.Array
    max_v: jax.Array
    beta1_power: jax.Array
    beta2_power: jax.Array
    owner: SlotOwner
    skipped: Counter64


def adam_w_init(table: Any, amsgrad: bool = False) -> AdamWState:
    """Zero moments and unit beta powers for ``table`` (any placement)."""
    place = placement_of(APPLY_ADAM_W_OP.name, table)
    return place.map(_init_on_shard, bool(amsgrad), place.storage(table))[1]


def _init_on_shard(router, amsgrad, table, replicated):
    shape = table.values.shape
    # Separate buffers (not one zeros array twice): a jitted step may donate the state.
    zeros = lambda s: jnp.zeros(s, jnp.float32)  # noqa: E731
    return None, AdamWState(zeros(shape), zeros(shape),
                            zeros(shape if amsgrad else (0, shape[1])), jnp.ones((), jnp.float32),
                            jnp.ones((), jnp.float32), slot_owners(table), Counter64.zero())


def apply_adam_w(table: Any, state: AdamWState, keys: Any, grads: jax.Array, *, lr,
                 weight_decay, beta1=0.9, beta2=0.999, epsilon=1e-8, amsgrad: bool = False,
                 maximize: bool = False, slots: jax.Array | None = None,
                 route_capacity: int | None = None, overflow: str = "expand"
                 ) -> tuple[Any, AdamWState]:
    """One AdamW step on the rows of ``keys`` (or of ``slots``).

    Gradients of duplicate keys are summed first; absent keys and tombstones are skipped and
    counted in ``state.skipped``. The key -1 is a key like any other (beyond CANN, whose
    kernel skips -1 as its "unused" key: here every operation treats -1 alike, so a row
    that :func:`lookup_or_insert` returned for -1 is also trained). The scalars may be
    traced (schedules inside ``lax.scan``).

    A slot's moments belong to its key (``state.owner``; beyond CANN, where only the same
    key reuses a slot): a key that took an evicted key's slot, or that ``compact`` moved,
    starts from zero moments like a never-touched row (the beta powers stay table-wide).

    Args:
        table: the table.
        state: from :func:`adam_w_init` (with ``amsgrad`` matching).
        keys: int64 keys ``[N]`` in any accepted form; ``None`` when ``slots`` are given.
        grads: float32 ``[N, embedding_dim]``.
        lr, weight_decay, beta1, beta2, epsilon: AdamW hyper-parameters.
        amsgrad: use the running max of ``v`` (PyTorch's AMSGrad, as CANN).
        maximize: ascend instead of descend.
        slots: int32 ``[N]`` (global) slots instead of keys, e.g. ``info.slots`` of the
            :func:`lookup_or_insert` that read the rows (a training step then probes the
            table once). Slot -1 and slots not holding a live key are skipped and counted.
        route_capacity, overflow: on a mesh, as in ``lookup_or_insert``.

    Returns:
        ``(table, state)``.
    """
    op = APPLY_ADAM_W_OP.name
    place = placement_of(op, table)
    storage = place.storage(table)
    if slots is not None:
        slots = jnp.asarray(slots)
        if not jnp.issubdtype(slots.dtype, jnp.integer):
            raise OpDTypeError(op, "slots", "int32 slots (LookupInfo.slots)", str(slots.dtype))
        first = slots.reshape(-1).astype(jnp.int32)
    elif keys is None:
        raise OpArgumentError(op, "keys", "int64 keys, or slots=", "None")
    else:
        first = flat_words(op, keys, storage.key_dtype)[0]
    n, dim = int(jax.tree.leaves(first)[0].shape[0]), storage.embedding_dim
    grads = jnp.asarray(check_numeric(op, "grads", grads, GRADS), jnp.float32)
    if grads.size != n * dim:
        raise OpArgumentError(op, "grads", f"[{n}, {dim}] float32 (one row per key)",
                              f"shape {tuple(grads.shape)}")
    _check_state(op, place, storage, state)
    if amsgrad and state.max_v.shape[-2] != storage.bucket_size:
        raise OpArgumentError(op, "state", "a state from adam_w_init(table, amsgrad=True)",
                              "a state without max_v", "Create the state with amsgrad=True.")
    statics = (slots is not None, bool(amsgrad), bool(maximize))
    hyper = tuple(jnp.asarray(x, jnp.float32) for x in (lr, weight_decay, beta1, beta2, epsilon))

    def attempt(capacity):
        (new, opt), _, _, route = place.call(_adam_on_shard, statics, (storage, state),
                                             (first, grads.reshape(n, dim)), hyper,
                                             capacity=capacity)
        return place.rebuild(table, new, route.lost), opt, route

    return run_routed(op, place, attempt, lambda r: r[2], n, route_capacity, overflow,
                      table)[:2]


def _adam_on_shard(router, statics, state, batch, active, hyper):
    by_slots, amsgrad, maximize = statics
    table, opt = state
    keys_or_slots, grads = batch
    if by_slots:
        ex = router.slots(keys_or_slots, active, grads)
        slots, grads = ex.received
    else:
        ex = router.keys(keys_or_slots, active, grads)
        words, grads = ex.received
        slots = live_slots(table, key_batch(APPLY_ADAM_W_OP.name, words, table.bucket_size),
                           ex.active)
    slots = jnp.where(ex.active, slots, -1)
    new_table, new_opt = adam_w_step(table, opt, slots, grads, *hyper, amsgrad=amsgrad,
                                     maximize=maximize)
    padding = jnp.sum(~ex.active, dtype=jnp.uint32)  # padding lanes are no keys: not skipped
    return (new_table, new_opt._replace(skipped=_minus(new_opt.skipped, padding))), (), ()


def _minus(count: Counter64, amount: jax.Array) -> Counter64:
    lo = count.lo - amount
    return Counter64(lo, count.hi - (lo > count.lo).astype(jnp.uint32))


def _check_state(op: str, place: Any, storage: HashTable, state: Any) -> None:
    """``state`` is an :class:`AdamWState` of the table's shape (not another table's)."""
    if not isinstance(state, AdamWState):
        raise OpArgumentError(op, "state", "an AdamWState (from adam_w_init(table))",
                              type(state).__name__)
    want = tuple(storage.values.shape)
    for name in ("m", "v"):
        got = tuple(np.shape(getattr(state, name)))
        if got != want:
            raise OpArgumentError(op, "state", f"the state of this table: {name} of shape {want}",
                                  f"{name} of shape {got}", "The state belongs to another table "
                                  "(or to this one before a resize, or on another placement): "
                                  "create it with adam_w_init(table).")
    got = tuple(np.shape(getattr(state.owner, "lo", state.owner)))
    if got != want[:-1]:
        raise OpArgumentError(op, "state", f"owner words of shape {want[:-1]}", f"shape {got}",
                              "Create the state with adam_w_init(table).")


@APPLY_ADAM_W_OP.kernel("xla")
def _adam_w_kernel(table: HashTable, state: AdamWState, words: Words64, grads, lr, weight_decay,
                   beta1, beta2, epsilon, slots=None, *, amsgrad, maximize):
    if slots is None:
        flat = Words64(words.lo.reshape(-1), words.hi.reshape(-1))
        slots = live_slots(table, key_batch(APPLY_ADAM_W_OP.name, flat, table.bucket_size))
    return adam_w_step(table, state, slots.reshape(-1).astype(jnp.int32), grads, lr,
                       weight_decay, beta1, beta2, epsilon, amsgrad=amsgrad, maximize=maximize)


@functools.partial(jax.jit, inline=True, static_argnames=("amsgrad", "maximize"))
def adam_w_step(table: HashTable, state: AdamWState, slots: jax.Array, grads, lr, weight_decay,
                beta1, beta2, epsilon, *, amsgrad, maximize) -> tuple[HashTable, AdamWState]:
    """One shard's AdamW step on the rows at ``slots`` (-1 and slots not holding a live key
    are skipped and counted)."""
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    lr, wd, b1, b2, eps = map(f32, (lr, weight_decay, beta1, beta2, epsilon))
    size = table.bucket_size
    inside = (slots >= 0) & (slots < size)
    flag = take(table.flags, jnp.where(inside, slots, 0))
    slot = jnp.where(inside & ((flag & VALID) != 0) & ((flag & EVICTED) == 0), slots, -1)
    group = slot_words(slot)
    first = group_first(group, slot >= 0)
    lead = is_first(first, slot >= 0)
    g = group_sum(first, slot >= 0, grads)  # the sums sit at the leads, the rows written
    g = -g if maximize else g
    b1p, b2p = state.beta1_power * b1, state.beta2_power * b2
    at = jnp.maximum(slot, 0)
    changed, keys = changed_hands(state.owner, table, at)  # another key's moments: zeros
    old = lambda a: jnp.where(changed[:, None], 0.0, take(a, at))  # noqa: E731
    # The Ascend kernel's expressions, term by term.
    w = take(table.values, at) * (1 + (-lr * wd))
    m = old(state.m) * b1 - (b1 + -1) * g
    v = old(state.v) * b2 - (b2 + -1) * g * g
    max_v = jnp.maximum(old(state.max_v), v) if amsgrad else v
    denom = jnp.sqrt(-max_v / (b2p + -1)) + eps
    w = w + (lr * m / (b1p + -1)) / denom
    new_state = AdamWState(set_rows(state.m, slot, m, lead), set_rows(state.v, slot, v, lead),
                           set_rows(state.max_v, slot, max_v, lead) if amsgrad else state.max_v,
                           b1p, b2p, record_owners(state.owner, slot, keys, lead & changed),
                           add_to_words(state.skipped, jnp.sum(slot < 0, dtype=jnp.int32)))
    return table.replace(values=set_rows(table.values, slot, w, lead)), new_state
