"""``make_row_optimizer``: a row optimizer from its state and its rule, on every placement.

An optimizer is written once for every placement: its state lies beside the table, laid out
like it (on a mesh every leaf gets the leading shard axis, per-shard counts included);
``init`` maps the state constructor over the shards, and ``update`` runs one shard's update
(:mod:`~jaxops.hashtable.optim._apply`) through the placement's one batched call
(:func:`~jaxops.hashtable._placement.run.run_batch`).

>>> resolve(0.1, None, "sgd", "lr"), float(resolve(lambda s: s * 2.0, 3, "sgd", "lr"))
(0.1, 6.0)
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.core.errors import OpArgumentError, OpDTypeError
from jaxops.hashtable._placement.placement import placement_of
from jaxops.hashtable._placement.run import run_batch
from jaxops.hashtable._table.checks import check_numeric
from jaxops.hashtable._table.table import HashTable
from jaxops.hashtable._walks.slot_owner import slot_owners
from jaxops.hashtable.optim._apply import (RuleSpec, init_on_shard, is_per_slot, sum_by_slot,
                                           update_on_shard)

__all__ = ["RowOptimizer", "make_row_optimizer", "resolve", "slot_owners", "sum_by_slot"]


#: ``rule(rows, grads, state_rows, step) -> (new_rows, new_state_rows)``: the optimizer's
#: math on the touched rows only (``[K, dim]``), with every per-slot state leaf gathered the
#: same way and every other leaf (a global count) passed whole.
Rule = Callable[[jax.Array, jax.Array, tuple, Any], tuple[jax.Array, tuple]]


class RowOptimizer(NamedTuple):
    """An optax-style pair for hash-table rows.

    Attributes:
        init: ``init(table) -> state``: the optimizer state beside ``table`` (a NamedTuple
            of per-slot arrays, each its own buffer, and a ``skipped`` count).
        update: ``update(table, state, slots, grads, step=None) -> (table, state)``: one
            step on the rows at ``slots`` (int, any shape; -1 = absent, skipped and counted
            in ``state.skipped``) with ``grads`` (``slots.shape + (dim,)``); gradients of
            duplicate slots are summed first. ``step`` is the global step (optax's
            ``count``: updates done before this one), needed by learning-rate schedules.
    """

    init: Callable[..., Any]
    update: Callable[..., tuple[HashTable, Any]]


def resolve(value: Any, step: Any, op: str, arg: str) -> Any:
    """A hyper-parameter: a number (or array) as is, a schedule called at ``step``.
    """
    if callable(value):
        if step is None:
            raise OpArgumentError(op, "step", f"the global step when '{arg}' is a schedule",
                                  "None", "Pass update(..., step=count).")
        return value(step)
    return value


def _check_state(op: str, init: Callable[[Any], Any], table: Any, state: Any) -> None:
    """``state`` has the structure and leaf shapes ``init(table)`` gives: a state made for
    another table (or for this one before a resize, or on another placement) is refused by
    name."""
    want = jax.eval_shape(init, table)
    shapes = lambda tree: [tuple(np.shape(x)) for x in jax.tree.leaves(tree)]  # noqa: E731
    same_tree = jax.tree.structure(state) == jax.tree.structure(want)
    if not same_tree or shapes(state) != shapes(want):
        raise OpArgumentError(op, "state", f"the state of this table ({type(want).__name__} "
                              f"with leaf shapes {shapes(want)})",
                              f"{type(state).__name__} with leaf shapes {shapes(state)}",
                              "The state belongs to another table (or to this one before a "
                              "resize, or on another placement): create it with init(table).")


SLOTS = "an integer array of slots (lookup_or_insert's info.slots)"
GRADS = "a float array of shape slots.shape + (embedding_dim,)"


def check_update_args(op: str, table: HashTable, slots: Any, grads: Any
                      ) -> tuple[jax.Array, jax.Array]:
    """``(slots [N], grads [N, dim])`` flattened, after checking what the caller gave."""
    slots = jnp.asarray(check_numeric(op, "slots", slots, SLOTS, integer=True))
    grads = jnp.asarray(check_numeric(op, "grads", grads, GRADS))
    dim = table.embedding_dim
    if tuple(grads.shape) != tuple(slots.shape) + (dim,):
        raise OpArgumentError(op, "grads", f"shape slots.shape + ({dim},) = "
                              f"{tuple(slots.shape) + (dim,)}", f"shape {tuple(grads.shape)}")
    if not jnp.issubdtype(grads.dtype, jnp.floating):
        raise OpDTypeError(op, "grads", "a floating array", str(grads.dtype))
    return slots.reshape(-1), grads.reshape(-1, dim).astype(jnp.float32)  # half rows too


def make_row_optimizer(name: str, init_state: Callable[[HashTable], Any], rule: Rule
                       ) -> RowOptimizer:
    """A :class:`RowOptimizer` from a state constructor and a row rule.

    Args:
        name: the optimizer's name, used in error messages.
        init_state: ``table -> state``, a NamedTuple whose last field is ``skipped``, or
            ``skipped`` then ``rounding=rounding_count(table)`` (the updates done, which
            seed the stochastic rounding into half rows; without it two updates with the
            same table clock and ``step`` draw the same random bits);
            leaves whose leading dimension is ``bucket_size`` are per-slot. A state with
            per-slot leaves has an ``owner`` field, :func:`slot_owners` of the table: a
            touched slot whose key is not the owner of its state rows (a new key took
            another key's tombstone, or ``compact`` moved a key) starts from the rows
            ``init_state`` gives a table of the touched rows (see
            :mod:`~jaxops.hashtable._walks.slot_owner`).
        rule: see :data:`Rule`; it sees neither ``owner`` nor ``skipped``.

    >>> import numpy as np, jax.numpy as jnp, jaxops.hashtable as ht
    >>> class S(NamedTuple):
    ...     skipped: jax.Array
    >>> half = make_row_optimizer("half", lambda t: S(jnp.zeros((), jnp.int32)),
    ...                           lambda w, g, s, step: (w - 0.5 * g, s))
    >>> t = ht.init_table(8, 2, initializer_mode="constant", constant_value=1.0)
    >>> t, rows, info = ht.lookup_or_insert(t, np.array([3, 4], np.int64))
    >>> t, s = half.update(t, half.init(t), info.slots, jnp.ones((2, 2)))
    >>> float(ht.find(t, np.array([3], np.int64))[0][0, 0]), int(s.skipped)
    (0.5, 0)
    """
    op = f"hashtable.optim.{name}"

    def owned_init(table: HashTable) -> Any:
        state = init_state(table)
        if "owner" not in getattr(state, "_fields", ()) and any(
                is_per_slot(x, table.bucket_size) for x in jax.tree.leaves(state)):
            raise OpArgumentError(op, "init_state", "a state with per-slot rows that also "
                                  "records their owners (a field owner=slot_owners(table))",
                                  f"{type(state).__name__} without an owner field",
                                  "Without it a new key would inherit the state of the key "
                                  "whose tombstone it takes.")
        return state

    spec = RuleSpec(rule, owned_init)

    def init(table: Any) -> Any:
        placement = placement_of(op, table)
        return placement.map(init_on_shard, owned_init, placement.storage(table))[1]

    def update(table: Any, state: Any, slots: Any, grads: Any, step: Any = None, *,
               route_capacity: int | None = None, overflow: str = "expand") -> tuple[Any, Any]:
        storage = placement_of(op, table).storage(table)
        flat_slots, flat_grads = check_update_args(op, storage, slots, grads)
        _check_state(op, init, table, state)
        ran = run_batch(op, table, update_on_shard, spec,
                        (flat_slots.astype(jnp.int32), flat_grads), step, beside=state,
                        route_capacity=route_capacity, overflow=overflow)
        return ran.table, ran.beside

    init.__doc__ = f"The {name} state for ``table`` (see :class:`RowOptimizer`)."
    update.__doc__ = f"One {name} step on the touched rows (see :class:`RowOptimizer`)."
    return RowOptimizer(init, update)
