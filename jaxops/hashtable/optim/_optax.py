"""``from_optax``: an element-wise optax ``GradientTransformation`` applied to table rows.

The transform's state is built for the whole ``table.values`` (``tx.init(values)``); at each
update the leaves shaped like a slot array (leading dimension ``bucket_size``) are read at
the touched slots, ``tx.update`` runs on those rows only, and the results are written back.
Other leaves (optax's scalar ``count``) advance once per update: they are global, so
``from_optax(optax.adam(lr))`` is TensorFlow's LazyAdam (global bias correction), whereas
:func:`~jaxops.hashtable.optim.adam` corrects each row with its own count.

**Which transforms are safe.** Only transforms whose update of an element depends on that
element's gradient, parameter and state alone (and on global scalars). Safe: ``sgd`` (with
``momentum`` / ``nesterov``), ``adagrad``, ``adam``, ``adamw``, ``adamax``, ``amsgrad``,
``nadam``, ``rmsprop``, ``adabelief``, ``lion``, ``yogi``, ``sign_sgd``, ``adadelta``,
``clip`` (element-wise), ``add_decayed_weights``, ``scale``, ``scale_by_schedule`` and
chains of these. **Not** safe (they reduce over the whole array or over axes, which here
would be the batch's rows): ``clip_by_global_norm``, ``clip_by_block_rms``, ``lamb``,
``lars``, ``adafactor`` (factored moments), ``sm3``, ``novograd``, ``fromage``,
``scale_by_trust_ratio``, ``centralize``, ``normalize_by_update_norm``; and anything that
adds noise (``noisy_sgd``) draws it per batch, not per row.

A slot that another key took (see :mod:`~jaxops.hashtable._walks.slot_owner`) starts from
``tx.init`` of its row at its first update: a key never inherits another key's state.

>>> import numpy as np, jax.numpy as jnp, optax, jaxops.hashtable as ht
>>> t = ht.init_table(8, 1, initializer_mode="constant", constant_value=1.0)
>>> t, _, info = ht.lookup_or_insert(t, np.array([5], np.int64))
>>> opt = ht.optim.from_optax(optax.sgd(0.5, momentum=0.9))
>>> state = opt.init(t)
>>> for _ in range(2):
...     t, state = opt.update(t, state, info.slots, jnp.ones((1, 1)))
>>> round(float(t.values[info.slots[0], 0]), 4)
-0.45
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxops.core.errors import OpArgumentError
from jaxops.hashtable._table.row_dtype import widened
from jaxops.hashtable._table.table import HashTable
from jaxops.hashtable._table.words64 import Counter64
from jaxops.hashtable._walks.slot_owner import SlotOwner
from jaxops.hashtable.optim._apply import rounding_count
from jaxops.hashtable.optim._rows import RowOptimizer, make_row_optimizer, slot_owners

__all__ = ["OptaxRowState", "from_optax"]


class OptaxRowState(NamedTuple):
    """``inner``: the wrapped transform's state; ``owner``: the key each slot's state rows
    belong to (see :mod:`~jaxops.hashtable._walks.slot_owner`); ``skipped``: batch entries with
    slot -1 (a uint64 :class:`~jaxops.hashtable._table.words64.Counter64`); ``rounding``: on
    half rows, the updates done (seeds the stochastic rounding), else None."""

    inner: Any
    owner: SlotOwner
    skipped: Counter64
    rounding: Any = None


def _own_buffers(tree: Any) -> Any:
    """Copies leaves that share a buffer with an earlier leaf, so the state can be donated."""
    seen: set[int] = set()

    def own(x):
        if isinstance(x, jax.Array) and id(x) in seen:
            return jnp.array(x, copy=True)
        seen.add(id(x))
        return x

    return jax.tree.map(own, tree)


def from_optax(tx: Any, name: str = "from_optax") -> RowOptimizer:
    """Wraps an element-wise optax ``GradientTransformation`` as a row optimizer.

    Args:
        tx: anything with optax's ``init(params)`` / ``update(updates, state, params)``
            (optax itself is not imported). See the module docstring for which are safe.
        name: used in error messages.

    Returns:
        A :class:`~jaxops.hashtable.optim.RowOptimizer`; its state is an :class:`OptaxRowState`.
        ``step`` is ignored (optax keeps its own count).
    """
    if not (callable(getattr(tx, "init", None)) and callable(getattr(tx, "update", None))):
        raise OpArgumentError(f"hashtable.optim.{name}", "tx", "an optax GradientTransformation "
                              "(init and update)", type(tx).__name__)

    def init(table: HashTable) -> OptaxRowState:
        # Half rows: the transform sees (and keeps its state for) float32 rows.
        return OptaxRowState(_own_buffers(tx.init(widened(table.values))), slot_owners(table),
                             Counter64.zero(), rounding_count(table))

    def rule(w, g, state, step):
        (inner,) = state
        updates, inner = tx.update(g, inner, w)
        return w + updates.astype(w.dtype), (inner,)

    return make_row_optimizer(name, init, rule)
