"""Row optimizers for hash tables; the public face is :mod:`jaxops.hashtable.optim`."""

from jaxops.ops.hashtable.optim.rows import (RowOptimizer, make_row_optimizer, slot_owners,
                                             sum_by_slot)
from jaxops.ops.hashtable.optim.rules import (AdagradState, AdamState, FtrlState,
                                              RowwiseAdagradState, SgdState, adagrad, adam, adamw,
                                              ftrl, rowwise_adagrad, sgd)
from jaxops.ops.hashtable.optim.wrap import OptaxRowState, from_optax

__all__ = [
    "AdagradState", "AdamState", "FtrlState", "OptaxRowState", "RowOptimizer",
    "RowwiseAdagradState", "SgdState", "adagrad", "adam", "adamw", "from_optax", "ftrl",
    "make_row_optimizer", "rowwise_adagrad", "sgd", "slot_owners", "sum_by_slot",
]
