"""Loops that also run inside ``jax.shard_map(check_vma=True)``.

There a loop carry built from constants (zeros, ``arange``) is not device-varying while the
body's output, computed from a device's shard, is, and ``lax.while_loop`` refuses carries
whose types differ. :func:`while_loop` casts the initial carry (``lax.pcast``, free at run
time) to the varying axes the body gives each leaf; outside ``shard_map`` it is the plain
loop. Every loop of jaxops whose trip count depends on data goes through here, so an
operation runs the same on one device and on each shard of a mesh.

>>> import jax.numpy as jnp
>>> int(fori_loop(0, jnp.int32(4), lambda i, x: x + i, jnp.int32(0)))
6
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

__all__ = ["fori_loop", "while_loop"]


def while_loop(cond: Callable, body: Callable, init: Any) -> Any:
    """``jax.lax.while_loop(cond, body, init)``, also inside ``shard_map(check_vma=True)``."""
    mesh = jax.sharding.get_abstract_mesh()
    manual = {name for name, kind in zip(mesh.axis_names, mesh.axis_types)
              if kind == jax.sharding.AxisType.Manual} if mesh.axis_names else set()
    for _ in range(len(manual) + 1 if manual else 0):  # each pass adds axes; a fixpoint
        out = jax.eval_shape(body, init)
        widened = jax.tree.map(_vary_as, init, out)
        if all(_varying(a) == _varying(b) for a, b in
               zip(jax.tree.leaves(widened), jax.tree.leaves(init))):
            break
        init = widened
    return jax.lax.while_loop(cond, body, init)


def fori_loop(lower: Any, upper: Any, body: Callable, init: Any) -> Any:
    """``jax.lax.fori_loop`` with a traced bound, as :func:`while_loop`."""
    def step(state):
        i, x = state
        return i + 1, body(i, x)

    start = jax.numpy.asarray(lower, jax.numpy.int32)
    return while_loop(lambda s: s[0] < upper, step, (start, init))[1]


def _varying(x: Any) -> frozenset:
    kind = getattr(jax.typeof(x) if not isinstance(x, jax.ShapeDtypeStruct) else x,
                   "manual_axis_type", None)
    return frozenset(kind.varying) if kind is not None else frozenset()


def _vary_as(x: jax.Array, like: Any) -> jax.Array:
    missing = _varying(like) - _varying(x)
    return jax.lax.pcast(x, tuple(sorted(missing)), to="varying") if missing else x
