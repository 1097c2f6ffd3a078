"""Capacity ladders: cost that follows the data, inside jit, with one compile.

An operator whose cost grows with a static capacity ``K`` (the sorts and IoU bitmask of an
NMS over ``K`` candidate slots, Unique's tables of ``K`` distinct values) pays for ``K``
even when the data fill a few slots. :func:`climb` runs it at the smallest *tier* of a
geometric ladder (:func:`tiers`) that holds the actual count: ``lax.switch`` over the tiers
on the traced count, every tier compiled once, together. Each branch pads its result back
to the top tier's shapes (:func:`pad_to`), so the caller sees one function of one output
shape. Nothing is cut: a branch only runs when its tier holds the count, and the top tier
is the capacity itself, so the result is the top tier's wherever the branch is exact at
every tier that holds the count (each caller's contract; tests compare with the ladder off,
:func:`settings`).

Under ``vmap`` the tier is the one that holds the largest count of the batch (a batched
switch index would run every tier), so a vmapped call costs one tier, not the ladder.

>>> import jax, jax.numpy as jnp
>>> tiers(20000)
(256, 2048, 20000)
>>> x = jnp.array([5, 3, 9, 0, 0, 0, 0, 0])    # the data fill the first 3 slots
>>> def top3(t):                                # cost follows t; padded back to 8 slots
...     return pad_to(-jnp.sort(-x[:t]), 8, fill=0)
>>> jax.jit(lambda x: climb(jnp.sum(x > 0), (2, 4, 8), top3))(x).tolist()   # tier 4 runs
[9, 5, 3, 0, 0, 0, 0, 0]
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jaxops.core.shape_trace import tracing_shapes_only

__all__ = ["LadderSettings", "climb", "pad_to", "settings", "tier_index", "tiers"]


class LadderSettings(NamedTuple):
    """The ladder's shape: tiers ``smallest * factor**i``; ``enabled=False`` runs every
    operator at its full capacity (the reference the tests compare with)."""

    smallest: int = 256
    factor: int = 8
    enabled: bool = True


# smallest 256: below it a tier's fixed costs (one 64-candidate NMS block is 1/4 of it)
# dominate; factor 4: B's untuned NMS (20,000 slots) has 4 tiers and its compile time
# about 2x one tier's (see docs in the report); factor 2 doubled the tiers for ~1.3x less
# padding waste.
_SETTINGS: contextvars.ContextVar[LadderSettings] = contextvars.ContextVar(
    "jaxops_ladder", default=LadderSettings())


@contextlib.contextmanager
def settings(**changes: Any) -> Iterator[LadderSettings]:
    """Changes the ladder while tracing inside the ``with`` block (``smallest``,
    ``factor``, ``enabled``). Read at trace time: a function jitted before keeps the
    ladder it was traced with (``jax.clear_caches()`` retraces).

    >>> with settings(enabled=False):
    ...     tiers(20000)
    (20000,)
    """
    token = _SETTINGS.set(_SETTINGS.get()._replace(**changes))
    try:
        yield _SETTINGS.get()
    finally:
        _SETTINGS.reset(token)


def tiers(capacity: int, smallest: int | None = None, factor: int | None = None
          ) -> tuple[int, ...]:
    """The ladder up to ``capacity``: ``smallest * factor**i`` while ``capacity`` is at
    least ``factor / 2`` times it (a last step of 2 would cost a tier's compile for
    little), then ``capacity``.

    >>> tiers(1024), tiers(1000), tiers(300), tiers(672000)
    ((256, 1024), (1000,), (300,), (256, 2048, 16384, 131072, 672000))
    """
    s = _SETTINGS.get()
    smallest, factor = smallest or s.smallest, factor or s.factor
    steps = []
    t = max(1, smallest)
    while s.enabled and t * factor <= 2 * capacity and t < capacity:
        steps.append(t)
        t *= factor
    return (*steps, capacity)


def tier_index(count: jax.Array, steps: Sequence[int]) -> jax.Array:
    """Index of the smallest tier ``>= count`` (the top one when none is), an int32 scalar;
    ``count`` of any shape is read as its maximum.

    >>> int(tier_index(jnp.array([3, 200, 7]), (4, 256, 1024)))
    1
    """
    top = _batch_max(lax.stop_gradient(jnp.max(jnp.asarray(count, jnp.int32), initial=0)))
    return sum(((top > t).astype(jnp.int32) for t in steps[:-1]), jnp.int32(0))


def climb(count: jax.Array, steps: Sequence[int], branch: Callable[[int], Any]) -> Any:
    """``branch(t)`` at the smallest tier ``t`` of ``steps`` that holds ``count`` (its
    maximum), chosen inside jit; ``branch`` must return the same shapes at every tier
    (:func:`pad_to` the top tier). One tier: a plain call, no switch; so is a trace for
    the output's shapes only (:func:`~jaxops.core.shape_trace.shapes_only`): the top tier."""
    if len(steps) == 1 or tracing_shapes_only():
        return branch(steps[-1])
    return lax.switch(tier_index(count, steps), [lambda t=t: branch(t) for t in steps])


def pad_to(x: jax.Array, size: int, axis: int = 0, fill: Any = 0) -> jax.Array:
    """``x`` padded with ``fill`` along ``axis`` to ``size`` (the top tier's length).

    >>> pad_to(jnp.array([[1, 2]]), 4, axis=1).tolist()
    [[1, 2, 0, 0]]
    """
    axis = axis % x.ndim
    if x.shape[axis] == size:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, size - x.shape[axis])
    return jnp.pad(x, widths, constant_values=jnp.asarray(fill, x.dtype))


@jax.custom_batching.custom_vmap
def _batch_max(count: jax.Array) -> jax.Array:
    """``count``; under ``vmap``, the batch's largest, unbatched: the switch on it stays a
    switch (a batched index would turn it into every branch and a select)."""
    return count


@_batch_max.def_vmap
def _batch_max_rule(axis_size: int, in_batched: list, count: jax.Array):
    (batched,) = in_batched
    return (jnp.max(count, axis=0) if batched else count), False
