"""One shard's in-table AdamW (CANN EmbeddingHashTableApplyAdamW): its state, the shard
functions and the kernel :func:`adam_w_step` (the OpDef's xla kernel), computed with the
Ascend kernel's expressions.

>>> import jax.numpy as jnp
>>> from jaxops.hashtable._table.table import HashTable
>>> t = HashTable.empty(4, 2, jnp.ones((4, 2)))
>>> _, state = adam_w_init_on_shard(None, False, t, None)
>>> state.m.shape, state.max_v.shape, int(state.skipped)
((4, 2), (0, 2), 0)
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxops.hashtable._kernels.opdefs import APPLY_ADAM_W_OP
from jaxops.hashtable._table.row_dtype import (is_half, rounding_seed, row_bits,
                                               stochastic_round)
from jaxops.hashtable._table.table import EVICTED, VALID, HashTable
from jaxops.hashtable._table.words64 import Counter64, Words64, add_to_words
from jaxops.hashtable._walks.batch import (group_first, group_sum, is_first, key_batch, live_slots,
                                           set_rows, slot_words)
from jaxops.hashtable._walks.probe import take
from jaxops.hashtable._walks.slot_owner import SlotOwner, changed_hands, record_owners, slot_owners

__all__ = ["AdamWState", "adam_w_init_on_shard", "adam_w_on_shard", "adam_w_step"]


class AdamWState(NamedTuple):
    """Optimizer state beside a table (CANN passes these as tensors).

    Attributes:
        m, v: float32 ``[bucket_size, dim]`` first and second moments, per slot.
        max_v: float32 ``[bucket_size, dim]`` running max of ``v`` (amsgrad), else ``[0, dim]``.
        beta1_power, beta2_power: float32 scalars, ``beta ** steps``.
        owner: :class:`~jaxops.hashtable._walks.slot_owner.SlotOwner` ``[bucket_size]``: the key
            (and slot epoch) each slot's moments belong to (12 bytes a slot; not in CANN,
            see below).
        skipped: :class:`~jaxops.hashtable._table.words64.Counter64` (uint64): keys skipped so
            far (absent or evicted keys); ``int(state.skipped)`` reads it.
    """

    m: jax.Array
    v: jax.Array
    max_v: jax.Array
    beta1_power: jax.Array
    beta2_power: jax.Array
    owner: SlotOwner
    skipped: Counter64


def adam_w_init_on_shard(router, amsgrad, table, replicated):
    """One shard's new :class:`AdamWState` (a ``Placement.map`` function)."""
    shape = table.values.shape
    # Separate buffers (not one zeros array twice): a jitted step may donate the state.
    zeros = lambda s: jnp.zeros(s, jnp.float32)  # noqa: E731
    return None, AdamWState(zeros(shape), zeros(shape),
                            zeros(shape if amsgrad else (0, shape[1])), jnp.ones((), jnp.float32),
                            jnp.ones((), jnp.float32), slot_owners(table), Counter64.zero())


def adam_w_on_shard(router, statics, state, batch, active, hyper):
    """``apply_adam_w`` on one shard: each key (or global slot) and its gradient to its
    shard, one AdamW step on the rows there."""
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
    return (new_table, new_opt._replace(skipped=_minus(new_opt.skipped, padding))), (), (), \
        ex.sent


def _minus(count: Counter64, amount: jax.Array) -> Counter64:
    lo = count.lo - amount
    return Counter64(lo, count.hi - (lo > count.lo).astype(jnp.uint32))


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
    if is_half(table.values):  # rounded stochastically, seeded by the clock and beta powers
        seed = rounding_seed(table.clock, None, jax.lax.bitcast_convert_type(b1p, jnp.uint32)
                             ^ jax.lax.bitcast_convert_type(b2p, jnp.uint32))
        w = stochastic_round(w, table.values.dtype, row_bits(seed, at, w.shape[-1]))
    new_state = AdamWState(set_rows(state.m, slot, m, lead), set_rows(state.v, slot, v, lead),
                           set_rows(state.max_v, slot, max_v, lead) if amsgrad else state.max_v,
                           b1p, b2p, record_owners(state.owner, slot, keys, lead & changed),
                           add_to_words(state.skipped, jnp.sum(slot < 0, dtype=jnp.int32)))
    return table.replace(values=set_rows(table.values, slot, w, lead)), new_state
