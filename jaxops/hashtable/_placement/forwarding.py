"""Keeping a jitted frame from copying the table leaves an operation leaves unchanged.

``jax.jit`` copies an output that is one of its inputs, so an operation that changes a
table's flags would copy its rows too (a second table in memory). :func:`forward_unchanged`
wraps the traced function of a frame (on one device the whole jitted function, on a mesh the
function of one shard inside ``shard_map``) so that its new state leaves out the leaves that
are input leaves (found by identity at trace time), and gives the caller of the jitted
function the input arrays back in their places. With donation XLA aliases the buffers
instead, so a donated frame keeps every leaf. The result shares those buffers with the
input, as ``table.replace(...)`` does. Both placements' frames use it.

>>> import jax, jax.numpy as jnp
>>> traced, bind = forward_unchanged(lambda s: ({"a": s[0], "b": s[1] + 1},), donate=False)
>>> call = bind(jax.jit(traced))
>>> a, b = jnp.ones(3), jnp.zeros(3)
>>> (out,) = call((a, b))
>>> out["a"] is a, out["b"].tolist()
(True, [1.0, 1.0, 1.0])
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["forward_unchanged"]


def forward_unchanged(fn: Callable, donate: bool) -> tuple[Callable, Callable]:
    """``(traced, bind)`` for ``fn(state, *rest) -> (new_state, *outs)``: ``traced`` is
    ``fn`` returning only the new state leaves that are not input leaves; ``bind(jitted)``
    (``jitted`` runs ``traced``, however wrapped) is the function of ``(state, *rest)`` that
    returns what ``fn`` returns, the unchanged leaves being the input arrays themselves.
    With ``donate`` nothing is split: ``(fn, lambda jitted: jitted)``."""
    if donate:
        return fn, lambda jitted: jitted
    plans = _Plans()

    def traced(state, *rest):
        new, *outs = fn(state, *rest)
        return plans.split(jax.tree.leaves(state), new), *outs

    def bind(jitted):
        def call(state, *rest):
            with plans.tracing((state, rest)) as key:
                kept, *outs = jitted(state, *rest)
            return plans.join(key, jax.tree.leaves(state), kept), *outs

        return call

    return traced, bind


class _Plans:
    """Where each leaf of a traced function's new state comes from, per input signature
    (shapes and dtypes: an empty batch may forward more), recorded while the jitted call
    traces (:meth:`tracing`)."""

    def __init__(self):
        self._plans: dict = {}
        self._current = threading.local()

    @contextlib.contextmanager
    def tracing(self, args: Any):
        """The signature of ``args``, current while the jitted call (re)traces."""
        leaves, tree = jax.tree.flatten(args)
        key = (tree, tuple((np.shape(x), getattr(x, "dtype", None) or jnp.result_type(x))
                           for x in leaves))
        self._current.key = key
        try:
            yield key
        finally:
            self._current.key = None

    def split(self, inputs: list, new: Any) -> list:
        leaves, tree = jax.tree.flatten(new)
        where = {id(x): i for i, x in enumerate(inputs)}
        plan = (tree, tuple(where.get(id(x), -1) for x in leaves))
        self._plans[getattr(self._current, "key", None)] = plan
        return [x for x, i in zip(leaves, plan[1]) if i < 0]

    def join(self, key: Any, inputs: list, kept: list) -> Any:
        tree, plan = self._plans[key]
        kept = iter(kept)
        return tree.unflatten([inputs[i] if i >= 0 else next(kept) for i in plan])
