"""Row optimizers for hash tables, optax-style: each factory returns ``(init, update)``.

``update(table, state, slots, grads, step=None)`` moves only the rows at ``slots`` (from
``lookup_or_insert``'s ``info.slots``; -1 is skipped and counted), sums duplicate slots
first, costs O(batch) and writes into the table's and state's buffers in place when a
jitted step donates them.

>>> import numpy as np, jax, jax.numpy as jnp, jaxops.hashtable as ht
>>> t = ht.init_table(16, 2, initializer_mode="constant", constant_value=1.0)
>>> t, rows, info = ht.lookup_or_insert(t, np.array([7, -3, 7], np.int64))
>>> opt = ht.optim.rowwise_adagrad(0.1)
>>> step = jax.jit(opt.update, donate_argnums=(0, 1))
>>> t, state = step(t, opt.init(t), info.slots, jnp.ones((3, 2)))
>>> int(state.skipped), ht.find(t, np.array([-3], np.int64))[0].shape
(0, (1, 2))
"""

from jaxops.hashtable.optim._apply import rounding_count
from jaxops.hashtable.optim._optax import OptaxRowState, from_optax
from jaxops.hashtable.optim._rows import RowOptimizer, make_row_optimizer, slot_owners, sum_by_slot
from jaxops.hashtable.optim._rules import (AdagradState, AdamState, FtrlState, RowwiseAdagradState,
                                           SgdState, adagrad, adam, adamw, ftrl, rowwise_adagrad,
                                           sgd)

__all__ = [
    "AdagradState", "AdamState", "FtrlState", "OptaxRowState", "RowOptimizer",
    "RowwiseAdagradState", "SgdState", "adagrad", "adam", "adamw", "from_optax", "ftrl",
    "make_row_optimizer", "rounding_count", "rowwise_adagrad", "sgd", "slot_owners",
    "sum_by_slot",
]
