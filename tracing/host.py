"""``host_refresh``: exact-shape results on the host from *inside* jit.

>>> import jax, jax.numpy as jnp
>>> from jaxops import DynArray
>>> seen = []
>>> @jax.jit
... def step(x):
...     kept = DynArray(x, [jnp.sum(x > 0)])
...     host_refresh({"kept": kept}, lambda t: seen.append(t["kept"].tolist()))
...     return x.sum()
>>> _ = step(jnp.array([5, 4, 0])); jax.effects_barrier()
>>> seen
[[5, 4]]

How it works: the DynArrays of the tree travel through one
:func:`jax.experimental.io_callback` together with their OP_OUTSHAPE tensor (int32 words,
encoded on the device); the host decodes it, slices the buffers and calls ``callback`` with
the tree in which every DynArray is an exact-shape ``np.ndarray``.

Under :func:`jax.vmap` the callback is called **once per example**, in batch order, each
time with that example's exact arrays (the whole batch still crosses in one callback).

Cost: each call copies the max-shape buffers (not just the valid part) to the host and runs
Python; with ``ordered=True`` (default) it is also sequenced after every earlier ordered
effect, which serialises the steps of a ``lax.scan`` with the host. ``ordered=False``
lets XLA overlap or reorder callbacks; calls may then arrive out of order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import custom_batching
from jax.experimental import io_callback

from jaxops.core.dynarray import DynArray
from jaxops.core.refresh import exact
from tracing.outshape import decode, encode

__all__ = [
    "host_refresh",
]


def host_refresh(tree: Any, callback: Callable[[Any], None], ordered: bool = True) -> None:
    """Calls ``callback`` on the host with ``tree``'s DynArrays refreshed to exact shapes.

    Array leaves are delivered as numpy arrays, other leaves unchanged. Usable inside
    ``jit``, ``lax.scan`` and ``vmap`` (see the module docstring for ordering and cost).
    """
    leaves, treedef = jax.tree_util.tree_flatten(tree, is_leaf=lambda x: isinstance(x, DynArray))
    dyn = [i for i, leaf in enumerate(leaves) if isinstance(leaf, DynArray)]
    arrays = [i for i, leaf in enumerate(leaves) if i not in dyn and isinstance(leaf, jax.Array)]
    payload = ([leaves[i].data for i in dyn],
               encode([leaves[i].actual_shape for i in dyn], np.int32),
               [leaves[i] for i in arrays])

    def deliver_one(datas, words, plain):
        out = list(leaves)
        for i, data, shape in zip(dyn, datas, decode(words, count=len(dyn))):
            out[i] = exact(data, np.asarray(shape), 0)
        for i, a in zip(arrays, plain):
            out[i] = a
        callback(jax.tree_util.tree_unflatten(treedef, out))

    def deliver(nbatch, payload):
        datas, words, plain = jax.tree_util.tree_map(np.asarray, payload)
        for idx in np.ndindex(*words.shape[:nbatch]):
            deliver_one([d[idx] for d in datas], words[idx], [p[idx] for p in plain])

    _sender(deliver, ordered, 0)(payload)


def _sender(deliver, ordered: bool, nbatch: int):
    """A custom-vmap'd io_callback: under vmap it sends the whole batch in one callback and
    recurses for nested vmaps (an ordered io_callback cannot be vmapped directly)."""

    @custom_batching.custom_vmap
    def send(payload):
        io_callback(lambda p: deliver(nbatch, p), None, payload, ordered=ordered)
        return jnp.zeros((), jnp.int32)

    @send.def_vmap
    def _rule(axis_size, in_batched, payload):
        payload = jax.tree_util.tree_map(
            lambda x, b: x if b else jnp.broadcast_to(x, (axis_size, *jnp.shape(x))),
            payload, in_batched[0])
        _sender(deliver, ordered, nbatch + 1)(payload)
        return jnp.zeros((axis_size,), jnp.int32), True

    return send
