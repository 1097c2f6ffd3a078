"""Host refresh: DynArrays become exact-shape numpy arrays after execution.

One device→host transfer for the whole pytree (a single :func:`jax.device_get`), then plain
numpy slicing, so no JAX compilation ever happens per distinct actual size.

>>> import jax, jax.numpy as jnp
>>> from jaxops import DynArray, refresh
>>> f = jax.jit(lambda x: DynArray(x, [jnp.sum(x > 0)], fill_value=0))
>>> refresh({"kept": f(jnp.array([4, 2, 0, 0])), "n": 7})
{'kept': array([4, 2], dtype=int32), 'n': 7}
"""

from __future__ import annotations

import warnings
from typing import Any

import jax
import numpy as np

from jaxops.core.dynarray import DynArray, dims_within, lost_elements
from jaxops.core.errors import CapacityOverflowWarning

__all__ = [
    "exact", "refresh",
]


def _is_dyn(x: Any) -> bool:
    return isinstance(x, DynArray)


def exact(data: np.ndarray, actual: np.ndarray, batch_ndim: int):
    """Slices a fetched max-shape buffer to its actual shape (a nested list when batched)."""
    if batch_ndim:
        return [exact(data[i], actual[i], batch_ndim - 1) for i in range(data.shape[0])]
    return data[tuple(slice(0, int(a)) for a in actual)]


def _check_fetched(data: np.ndarray, actual: np.ndarray, batch_ndim: int) -> None:
    """Raises unless every (batched) actual shape lies within the max shape."""
    max_shape = data.shape[batch_ndim:]
    if not dims_within(actual, max_shape):
        raise ValueError(f"refresh: a DynArray's actual shape {actual.tolist()} is outside its "
                         f"max shape {max_shape} (expected dims in [0, max])")


def _warn_truncated(actual: np.ndarray, true: np.ndarray | None) -> None:
    """Warns (once per call site of refresh) when an output lost results to its capacity."""
    if true is None:
        return
    lost = lost_elements(actual, true)
    if lost > 0:
        warnings.warn(CapacityOverflowWarning(
            f"refresh: a DynArray was truncated to its capacity: true shape "
            f"{true.tolist()}, kept {actual.tolist()}; {lost} elements lost (DynArray.lost()). "
            f"Pass a larger size=, or refresh(..., allow_truncated=True) if that is intended."),
            stacklevel=3)


def refresh(tree: Any, *, allow_truncated: bool = False) -> Any:
    """Every DynArray in ``tree`` becomes an exact-shape ``np.ndarray``; other leaves pass.

    A DynArray batched by :func:`jax.vmap` becomes a list of exact arrays, one per example
    (nested lists for several batch axes). A DynArray that overflowed its capacity (its
    ``true_shape`` exceeds its actual shape, e.g. ``jit(nonzero)`` with a small ``size``)
    gives its truncated data with a :class:`~jaxops.errors.CapacityOverflowWarning`
    (once per call site) unless ``allow_truncated=True``.
    """
    leaves, treedef = jax.tree_util.tree_flatten(tree, is_leaf=_is_dyn)
    dyn = [i for i, leaf in enumerate(leaves) if _is_dyn(leaf)]
    fetched = jax.device_get([(leaves[i].data, leaves[i].actual_shape,
                               None if allow_truncated else leaves[i].true_shape) for i in dyn])
    for i, (data, actual, true) in zip(dyn, fetched):
        data, actual, batch_ndim = np.asarray(data), np.asarray(actual), len(leaves[i].batch_shape)
        _check_fetched(data, actual, batch_ndim)
        _warn_truncated(actual, None if true is None else np.asarray(true))
        leaves[i] = exact(data, actual, batch_ndim)
    return jax.tree_util.tree_unflatten(treedef, leaves)
