"""What every rule shares: the registry of rules and the arithmetic of dims and losses."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np

from jaxops.dynamic.tensor import Dim, Tensor

__all__ = ["RULES", "dim_max", "dim_min", "highest", "is_float", "lost_of", "lowest", "rule",
           "same_dim"]

#: Every rule by name (:func:`rule` fills it).
RULES: dict[str, Callable] = {}


def rule(fn: Callable) -> Callable:
    """Registers ``fn`` in :data:`RULES` under its name (a name registered twice is an error)."""
    if fn.__name__ in RULES:
        raise ValueError(f"rule {fn.__name__!r} registered twice")
    RULES[fn.__name__] = fn
    return fn


def lost_of(*ts: Tensor) -> Any:
    """What the inputs' overflowed capacities may have cut, together (``None``: nothing)."""
    found = [t.lost for t in ts if t.lost is not None]
    return None if not found else found[0] if len(found) == 1 else sum(found[1:], found[0])


def same_dim(a: Dim, b: Dim) -> bool:
    """The same dim: one traced object, or equal static sizes."""
    return a is b or (isinstance(a, int) and isinstance(b, int) and a == b)


def dim_max(a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return max(a, b)
    return jnp.maximum(jnp.asarray(a, jnp.int32), jnp.asarray(b, jnp.int32))


def dim_min(a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    return jnp.minimum(jnp.asarray(a, jnp.int32), jnp.asarray(b, jnp.int32))


def is_float(dtype) -> bool:
    """A floating dtype, bfloat16 (numpy kind ``V``) included."""
    return bool(jnp.issubdtype(dtype, jnp.floating))


def lowest(dtype) -> Any:
    """The dtype's lowest value (``-inf`` for floats): the identity of ``max``."""
    dtype = np.dtype(dtype)
    return -np.inf if is_float(dtype) else False if dtype.kind == "b" else np.iinfo(dtype).min


def highest(dtype) -> Any:
    """The dtype's highest value (``inf`` for floats): the identity of ``min``."""
    dtype = np.dtype(dtype)
    return np.inf if is_float(dtype) else True if dtype.kind == "b" else np.iinfo(dtype).max
