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

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.core.errors import OpArgumentError, OpDTypeError
from jaxops.hashtable._kernels.adamw_kernel import AdamWState, adam_w_init_on_shard, adam_w_on_shard
from jaxops.hashtable._kernels.opdefs import APPLY_ADAM_W_OP
from jaxops.hashtable._placement.placement import placement_of
from jaxops.hashtable._placement.run import run_batch
from jaxops.hashtable._table.checks import check_numeric
from jaxops.hashtable._table.table import HashTable
from jaxops.hashtable._walks.batch import flat_words

__all__ = ["AdamWState", "adam_w_init", "apply_adam_w"]


GRADS = "a float array [N, embedding_dim] (one gradient row per key)"

def adam_w_init(table: Any, amsgrad: bool = False) -> AdamWState:
    """Zero moments and unit beta powers for ``table`` (any placement)."""
    placement = placement_of(APPLY_ADAM_W_OP.name, table)
    return placement.map(adam_w_init_on_shard, bool(amsgrad), placement.storage(table))[1]


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
    storage = placement_of(op, table).storage(table)
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
    _check_state(op, storage, state)
    if amsgrad and state.max_v.shape[-2] != storage.bucket_size:
        raise OpArgumentError(op, "state", "a state from adam_w_init(table, amsgrad=True)",
                              "a state without max_v", "Create the state with amsgrad=True.")
    statics = (slots is not None, bool(amsgrad), bool(maximize))
    hyper = tuple(jnp.asarray(x, jnp.float32) for x in (lr, weight_decay, beta1, beta2, epsilon))
    ran = run_batch(op, table, adam_w_on_shard, statics, (first, grads.reshape(n, dim)), hyper,
                    beside=state, route_capacity=route_capacity, overflow=overflow)
    return ran.table, ran.beside


def _check_state(op: str, storage: HashTable, state: Any) -> None:
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
