"""Traces that want only an output's shapes and dtypes.

A native kernel takes its output's structure from the ``xla`` kernel's trace
(``jax.eval_shape``, jaxops/native/kernels.py). Code whose trace cost does not change the
output's shapes may trace less inside :func:`shapes_only`: the capacity ladder
(jaxops/ops/ladder.py) traces its top tier alone instead of every tier, whose outputs all
have the top tier's shapes.

>>> tracing_shapes_only()
False
>>> with shapes_only():
...     tracing_shapes_only()
True
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

__all__ = ["shapes_only", "tracing_shapes_only"]

_SHAPES_ONLY: contextvars.ContextVar[bool] = contextvars.ContextVar("jaxops_shapes_only",
                                                                    default=False)


@contextlib.contextmanager
def shapes_only() -> Iterator[None]:
    """Marks the traces inside the block as wanting only the output's shapes and dtypes."""
    token = _SHAPES_ONLY.set(True)
    try:
        yield
    finally:
        _SHAPES_ONLY.reset(token)


def tracing_shapes_only() -> bool:
    """Whether the current trace wants only the output's shapes and dtypes."""
    return _SHAPES_ONLY.get()
