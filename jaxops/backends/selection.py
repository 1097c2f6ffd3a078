"""Which backend an operator call runs on, and why.

The rules, strongest first:

1. ``backend=`` on the call (``jaxops.nonzero(x, backend="host")``, ``tracing.launch(...,
   backend=...)``): strict. An unknown or unavailable backend, or one without a kernel for
   the operator (or for its input dtype), raises :class:`BackendUnavailableError`.
2. :func:`use_backend` (innermost ``with`` wins), then the environment variable
   ``JAXOPS_BACKEND``: a preference for every call in scope. An unknown or unavailable
   backend raises; an operator the backend has no kernel for runs on ``xla`` instead, and
   :func:`explain` says so.
3. Otherwise automatic: ``ascend`` when the runtime is available and has the operator's
   aclnn kernel, else ``native`` (C++ XLA FFI kernels, :mod:`jaxops.native`) on the CPU when
   the library is built and ``JAXOPS_NATIVE`` is not ``0``, else ``xla``. ``host`` is never
   chosen automatically.

The rules run in the core (:mod:`jaxops.core.backend_table`), on the table every backend
registers into; this module adds the user's view (:func:`available`, :func:`explain`).

Selection happens when a call is *traced*: a function jitted before entering
``use_backend`` keeps the backend it was traced with (jit caches traces by argument
shapes only). Pass ``backend=`` or jit inside the ``with`` block.

>>> import jax.numpy as jnp
>>> from jaxops.core.dtypes import FLOATING
>>> from jaxops.core.registry import Input, OpDef, Output
>>> neg = OpDef("DocNeg", [Input("x", FLOATING)], [Output("y", FLOATING)])
>>> _ = neg.kernel("xla")(lambda x: (-x,))
>>> print(explain(neg, requested="xla"))
DocNeg runs on 'xla' (backend= argument): requested explicitly.
>>> with use_backend("host"):
...     print(explain(neg).reason)
fallback: DocNeg has no 'host' kernel (kernels: xla)
>>> from jaxops.core.errors import BackendUnavailableError
>>> try:
...     with use_backend("tpu"):
...         pass
... except BackendUnavailableError as e:
...     print(e)
unknown backend 'tpu' (from use_backend); known backends: xla, host, ascend, native
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from jaxops.core import backend_table, walk_table
from jaxops.core.backend_table import (AUTOMATIC, ENV_VAR, Selection, backend_names,
                                       backend_status, use_backend)
from jaxops.core.registry import OpDef, get_op, list_ops

__all__ = [
    "AUTOMATIC", "BACKENDS", "ENV_VAR", "BackendStatus", "Selection", "available", "explain",
    "select", "select_backend", "use_backend",
]


def __getattr__(name: str):
    if name == "BACKENDS":  # the table grows as backends register; read it when asked
        return backend_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclasses.dataclass(frozen=True)
class BackendStatus:
    """One backend: whether it can run here, why (or why not), and its operators."""

    name: str
    available: bool
    reason: str
    operators: tuple[str, ...]

    def __str__(self) -> str:
        state = "available" if self.available else "unavailable"
        return f"{self.name:7s} {state}: {self.reason} ({len(self.operators)} operators)"


def available() -> list[BackendStatus]:
    """Every backend with its status and the operators that have a kernel on it.

    >>> [b.name for b in available()]
    ['xla', 'host', 'ascend', 'native']
    """
    out = []
    for name in backend_names():
        ok, reason = backend_status(name)
        ops = tuple(n for n in list_ops() if get_op(n).has_kernel(name))
        out.append(BackendStatus(name, ok, reason, ops))
    return out


def select(op: OpDef | str, requested: str | None = None, inputs: Sequence[Any] | None = None,
           attrs: dict[str, Any] | None = None) -> Selection:
    """The backend a call of ``op`` runs on, with the reason (see the module docstring).

    ``inputs`` and ``attrs`` (optional) let the choice take input dtypes and attribute
    values into account (an aclnn kernel may not serve every configuration).
    """
    return backend_table.select(get_op(op) if isinstance(op, str) else op, requested, inputs,
                                attrs)


def select_backend(op: OpDef | str, requested: str | None = None,
                   inputs: Sequence[Any] | None = None,
                   attrs: dict[str, Any] | None = None) -> str:
    """The name of the backend a call of ``op`` runs on (the entry the registry and
    ``tracing.launch`` call)."""
    return select(op, requested, inputs, attrs).backend


def explain(op: OpDef | str, requested: str | None = None,
            inputs: Sequence[Any] | None = None,
            attrs: dict[str, Any] | None = None) -> Selection:
    """What a call of ``op`` would run on here and now, and why (``str()`` it to read;
    the module docstring has an example). For a hash-table operator it also says which
    path the table walks take (native C++ kernels or xla; :mod:`jaxops.core.walk_table`).

    >>> "Hash probing: " in str(explain("EmbeddingHashTableLookupOrInsert"))
    True
    """
    chosen = select(op, requested, inputs, attrs)
    if chosen.op not in walk_table.probing_ops():
        return chosen
    path, why = walk_table.walk_path()
    return dataclasses.replace(chosen, probing=f"{path} ({why})")
