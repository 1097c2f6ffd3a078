"""Backends: where an operator's kernel runs.

Only ``xla`` (pure JAX, the default) exists so far; the ``host`` and ``ascend`` backends and
the selection rules arrive with the backends issue.
"""

from __future__ import annotations

from jaxops.core.errors import BackendUnavailableError


def select_backend(op, requested: str | None = None) -> str:
    """The backend an ``op`` call runs on."""
    backend = requested or "xla"
    if not op.has_kernel(backend):
        raise BackendUnavailableError(f"{op.name}: backend {backend!r} has no kernel for this "
                                      f"operator; available: {op.backends()}")
    return backend
