"""Flax NNX layer for hash-table embeddings (optional extra: ``pip install jaxops[flax]``).

:class:`Embedding` holds an :class:`~jaxops.embedding.EmbeddingCollection`'s tables and row
optimizer states in an :class:`EmbeddingTables` variable (not an ``nnx.Param``, so
``nnx.Optimizer`` and ``nnx.grad`` leave it alone and no table-sized gradient is formed).
Calling it returns pooled embeddings (a read-only lookup: unseen ids give zeros). A
training step inserts ids with :meth:`Embedding.lookup_or_insert`, differentiates the loss w.r.t.
the looked-up rows alongside the dense parameters, and hands the row gradients to
:meth:`Embedding.apply_gradients` (the row optimizer, by slot):

>>> import numpy as np, jax, jax.numpy as jnp, optax
>>> from flax import nnx
>>> import jaxops.hashtable as ht, jaxops.nnx
>>> from jaxops.embedding import Bags, EmbeddingCollection, TableConfig
>>> class Model(nnx.Module):
...     def __init__(self, rngs):
...         self.embed = jaxops.nnx.Embedding(EmbeddingCollection(
...             [TableConfig("ids", 256, 4, ("user",), ht.optim.adagrad(0.1))]), rngs=rngs)
...         self.head = nnx.Linear(4, 1, rngs=rngs)
...     def __call__(self, features, rows=None, looked=None):
...         pooled = self.embed(features) if looked is None else self.embed.pool(looked, rows)
...         return self.head(pooled["user"])[:, 0]
>>> model = Model(nnx.Rngs(0))
>>> optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)

The step is Flax's low-overhead form: split the module graph once (``nnx.split``), run a
``jax.jit``-ed functional step that merges it, donate its state, and split again only when
the objects are needed (``nnx.update``). ``nnx.jit`` on the objects works too, but walks the
module graph on every call (1-5 ms of host time a step, measured on a DLRM-sized model, where
this form spends about 0.1 ms: ``benchmarks/dlrm.py``):

>>> import functools
>>> graphdef, state = nnx.split((model, optimizer))
>>> @functools.partial(jax.jit, static_argnums=0, donate_argnums=1)
... def train_step(graphdef, state, features, labels):
...     model, optimizer = nnx.merge(graphdef, state)
...     looked = model.embed.lookup_or_insert(features)
...     def loss_fn(model, rows):
...         logits = model(features, rows, looked)
...         return optax.sigmoid_binary_cross_entropy(logits, labels).mean()
...     loss, (grads, row_grads) = nnx.value_and_grad(loss_fn, argnums=(0, 1))(model, looked.rows)
...     optimizer.update(model, grads)
...     model.embed.apply_gradients(looked, row_grads)
...     return nnx.state((model, optimizer)), loss
>>> features = {"user": Bags.from_lengths(np.array([3, 4, 4, 9]), np.array([2, 2]))}
>>> losses = []
>>> for _ in range(5):
...     state, loss = train_step(graphdef, state, features, jnp.array([1.0, 0.0]))
...     losses.append(float(loss))
>>> nnx.update((model, optimizer), state)  # between steps: maintain(), evaluation, saving
>>> losses[-1] < losses[0], int(model.embed.state["ids"].table.live)
(True, 3)
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
from flax import nnx

from jaxops.embedding import Bags, EmbeddingCollection, Lookup, TableState
from jaxops.hashtable import Maintenance

__all__ = ["Embedding", "EmbeddingTables"]


class EmbeddingTables(nnx.Variable):
    """The collection's state (table name → ``TableState``): updated by the row optimizers,
    never by ``nnx.Optimizer``."""


class Embedding(nnx.Module):
    """Pooled hash-table embeddings as an NNX module (see the module docstring).

    Args:
        collection: the features and tables.
        rngs: ``nnx.Rngs``; ``rngs.params()`` draws the tables' initial rows.
    """

    def __init__(self, collection: EmbeddingCollection, *, rngs: nnx.Rngs):
        self.collection = collection
        self.tables = EmbeddingTables(collection.init(rngs.params()))

    @property
    def state(self) -> dict[str, TableState]:
        """Table name → ``TableState`` (the table and its row optimizer state)."""
        return self.tables.get_value()

    def __call__(self, features: Mapping[str, Bags]) -> dict[str, jax.Array]:
        """feature → pooled ``[num_bags, dim]``, reading only (unseen ids are zero rows)."""
        looked = self.collection.lookup(self.state, features)
        return self.collection.pool(looked)

    def lookup_or_insert(self, features: Mapping[str, Bags]) -> Lookup:
        """Inserts the ids (training) and returns what :meth:`pool` and
        :meth:`apply_gradients` need."""
        state, looked = self.collection.lookup_or_insert(self.state, features)
        self.tables.set_value(state)
        return looked

    def pool(self, looked: Lookup, rows: Mapping[str, jax.Array] | None = None
             ) -> dict[str, jax.Array]:
        """Pooled embeddings of ``looked`` (with ``rows`` in place of ``looked.rows``)."""
        return self.collection.pool(looked, rows)

    def apply_gradients(self, looked: Lookup, row_grads: Mapping[str, jax.Array],
                        step: Any = None) -> None:
        """Each table's row optimizer on d loss / d ``looked.rows``, by slot."""
        self.tables.set_value(self.collection.apply_gradients(self.state, looked, row_grads,
                                                              step))

    def maintain(self, headroom: int | None = None) -> dict[str, Maintenance]:
        """Between jitted steps: every table's load policy (grow with its optimizer state,
        evict, or raise; see :meth:`EmbeddingCollection.maintain`). Returns each table's
        report; a table that grew changes shape, so the next jitted step recompiles."""
        state, reports = self.collection.maintain(self.state, headroom=headroom)
        self.tables.set_value(state)
        return reports
