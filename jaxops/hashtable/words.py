"""64-bit integers (keys, counters) as pairs of uint32 words, as they live inside JAX.

With ``jax_enable_x64`` off, pass 64-bit ids to a jitted step as ``as_words(ids)``: JAX
itself narrows a numpy int64 argument to int32 before any jaxops code sees it.

>>> import numpy as np, jaxops.hashtable as ht
>>> w = ht.words.as_words(np.array([2**40 + 5, -1], np.int64))
>>> ht.words.to_host_int64(w).tolist()
[1099511627781, -1]
>>> int(ht.words.Counter64.zero())
0
"""

from jaxops.hashtable._table.words64 import (Counter64, Words64, add_to_words, as_words, join_words,
                                             sum_counters, to_host_int64)

__all__ = ["Counter64", "Words64", "add_to_words", "as_words", "join_words", "sum_counters",
           "to_host_int64"]
