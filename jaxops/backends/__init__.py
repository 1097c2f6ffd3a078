"""Backends: where an operator's kernel runs.

- ``xla`` (default): the pure-JAX kernels; jit, vmap and grad everywhere.
- ``host``: numpy kernels reached from jit through :func:`jax.pure_callback`
  (:mod:`jaxops.backends.host_kernels`); integer results identical to ``xla``; the
  backward pass of a gradient runs on ``xla`` (:mod:`jaxops.backends.callback`).
- ``ascend``: Huawei Ascend aclnn kernels through the CANN runtime
  (:mod:`jaxops.backends.ascend`).

Each backend registers itself into the core's backend table
(:mod:`jaxops.core.backend_table`). Selection rules (``backend=``, :func:`use_backend`, ``JAXOPS_BACKEND``, automatic) are in
:mod:`jaxops.backends.selection`; :func:`explain` says what an operator runs on and why,
:func:`available` lists the backends with their status.

>>> import jaxops
>>> [(b.name, b.available) for b in jaxops.backends.available()][:2]
[('xla', True), ('host', True)]
"""

from __future__ import annotations

# Each import registers its backend into the core's table; this order is the table's order.
from jaxops.backends import callback  # noqa: F401,I001  (host)
from jaxops.backends import ascend  # noqa: F401  (ascend)
from jaxops.backends import selection
from jaxops.backends.selection import (AUTOMATIC, ENV_VAR, BackendStatus, Selection, available,
                                       explain, select, select_backend, use_backend)
from jaxops.core.errors import BackendUnavailableError

__all__ = [
    "AUTOMATIC", "BACKENDS", "ENV_VAR", "BackendStatus", "BackendUnavailableError", "Selection",
    "available", "explain", "select", "select_backend", "use_backend",
]


def __getattr__(name: str):
    if name == "BACKENDS":  # the registered backends, read when asked (the table grows)
        return selection.BACKENDS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
