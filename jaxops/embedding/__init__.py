"""Embedding models on hash tables: ragged bags of ids, pooling and feature collections.

>>> import numpy as np, jax, jaxops.hashtable as ht
>>> from jaxops.embedding import Bags, EmbeddingCollection, TableConfig
>>> coll = EmbeddingCollection([TableConfig("t", 16, 2, ("a",), ht.optim.sgd(0.1), 1.0)])
>>> state, looked = coll.lookup_or_insert(coll.init(jax.random.key(0)),
...                                       {"a": Bags.from_lengths(np.array([4, 5]), np.array([2, 0]))})
>>> coll.pool(looked)["a"].tolist()
[[2.0, 2.0], [0.0, 0.0]]
"""

from jaxops.embedding.bags import Bags
from jaxops.embedding.collection import (EmbeddingCollection, Lookup, TableConfig, TableReport,
                                         TableState, feature_salt, salt_ids)
from jaxops.embedding.pooling import POOLINGS, pool

__all__ = [
    "POOLINGS", "Bags", "EmbeddingCollection", "Lookup", "TableConfig", "TableReport",
    "TableState",
    "feature_salt", "pool", "salt_ids",
]
