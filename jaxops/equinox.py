"""Equinox layer for hash-table embeddings (optional extra: ``pip install jaxops[equinox]``).

:class:`Embedding` is an immutable ``eqx.Module`` holding an
:class:`~jaxops.embedding.EmbeddingCollection` (static) and its state (tables and row
optimizer states). Calling it returns pooled embeddings (read-only: unseen ids give zeros);
:meth:`Embedding.lookup_or_insert` and :meth:`Embedding.apply_gradients` return a new
module. Keep it beside the dense model rather than inside it, so ``eqx.filter_grad`` never
differentiates the tables (the row gradients come from the looked-up rows, O(batch)):

>>> import numpy as np, jax, jax.numpy as jnp, optax, equinox as eqx
>>> import jaxops.hashtable as ht, jaxops.equinox
>>> from jaxops.embedding import Bags, EmbeddingCollection, TableConfig
>>> embed = jaxops.equinox.Embedding(EmbeddingCollection(
...     [TableConfig("ids", 256, 4, ("user",), ht.optim.adagrad(0.1))]), key=jax.random.key(0))
>>> head = eqx.nn.Linear(4, 1, key=jax.random.key(1))
>>> tx = optax.adam(1e-2)
>>> opt_state = tx.init(eqx.filter(head, eqx.is_array))
>>> @eqx.filter_jit(donate="all")
... def train_step(head, embed, opt_state, features, labels):
...     embed, looked = embed.lookup_or_insert(features)
...     def loss_fn(params):
...         head, rows = params
...         logits = jax.vmap(head)(embed.pool(looked, rows)["user"])[:, 0]
...         return optax.sigmoid_binary_cross_entropy(logits, labels).mean()
...     loss, (grads, row_grads) = eqx.filter_value_and_grad(loss_fn)((head, looked.rows))
...     updates, opt_state = tx.update(grads, opt_state, eqx.filter(head, eqx.is_array))
...     return eqx.apply_updates(head, updates), embed.apply_gradients(looked, row_grads), \\
...         opt_state, loss
>>> features = {"user": Bags.from_lengths(np.array([3, 4, 4, 9]), np.array([2, 2]))}
>>> losses = []
>>> for _ in range(5):
...     head, embed, opt_state, loss = train_step(head, embed, opt_state, features,
...                                               jnp.array([1.0, 0.0]))
...     losses.append(float(loss))
>>> losses[-1] < losses[0], int(embed.state["ids"].table.live)
(True, 3)
"""

from __future__ import annotations

from typing import Any, Mapping

import equinox as eqx
import jax

from jaxops.embedding import Bags, EmbeddingCollection, Lookup, TableState
from jaxops.hashtable import Maintenance

__all__ = ["Embedding"]


class Embedding(eqx.Module):
    """Pooled hash-table embeddings as an Equinox module (see the module docstring).

    Args:
        collection: the features and tables.
        key: a PRNG key for the tables' initial rows.
    """

    collection: EmbeddingCollection = eqx.field(static=True)
    state: dict[str, TableState]

    def __init__(self, collection: EmbeddingCollection, *, key: jax.Array,
                 state: dict[str, TableState] | None = None):
        self.collection = collection
        self.state = collection.init(key) if state is None else state

    def __call__(self, features: Mapping[str, Bags]) -> dict[str, jax.Array]:
        """feature → pooled ``[num_bags, dim]``, reading only (unseen ids are zero rows)."""
        looked = self.collection.lookup(self.state, features)
        return self.collection.pool(looked)

    def lookup_or_insert(self, features: Mapping[str, Bags]) -> tuple["Embedding", Lookup]:
        """``(module with the ids inserted, lookup)`` for :meth:`pool` and
        :meth:`apply_gradients`."""
        state, looked = self.collection.lookup_or_insert(self.state, features)
        return eqx.tree_at(lambda m: m.state, self, state), looked

    def pool(self, looked: Lookup, rows: Mapping[str, jax.Array] | None = None
             ) -> dict[str, jax.Array]:
        """Pooled embeddings of ``looked`` (with ``rows`` in place of ``looked.rows``)."""
        return self.collection.pool(looked, rows)

    def apply_gradients(self, looked: Lookup, row_grads: Mapping[str, jax.Array],
                        step: Any = None) -> "Embedding":
        """The module after each table's row optimizer step on d loss / d ``looked.rows``."""
        state = self.collection.apply_gradients(self.state, looked, row_grads, step)
        return eqx.tree_at(lambda m: m.state, self, state)

    def maintain(self, headroom: int | None = None
                 ) -> tuple["Embedding", dict[str, Maintenance]]:
        """Between jitted steps: ``(module, reports)`` after every table's load policy
        (grow with its optimizer state, evict, or raise; see
        :meth:`EmbeddingCollection.maintain`)."""
        state, reports = self.collection.maintain(self.state, headroom=headroom)
        return eqx.tree_at(lambda m: m.state, self, state), reports
