"""Embedding hash tables (CANN ops-nn ``hash/``); the public API is :mod:`jaxops.hashtable`.

Importing this package registers the six CANN operators (see :mod:`.opdefs`) with their
kernels, which live in the operation modules imported here.
"""

from jaxops.ops.hashtable import (cann_adamw, create, evicting, exporting,  # noqa: F401
                                  importing, inserting)
