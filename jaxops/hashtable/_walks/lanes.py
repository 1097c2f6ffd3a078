"""Data-parallel probing over a shrinking set of lanes.

Every hash operation is "each key walks its probe sequence until something happens". Done
naively inside one ``lax.while_loop`` each round costs the whole batch even when a handful
of keys still walk. :func:`drain` runs the rounds in stages of static, shrinking capacity:
when the active lanes fit the next stage they are compacted into it (with the shared
:func:`~jaxops.ops.compaction.compact_map`), so late rounds cost what is left.

>>> import jax.numpy as jnp
>>> def step(lanes, active, carry):   # count each lane's value down to zero
...     v = jnp.where(active, lanes["v"] - 1, lanes["v"])
...     return {**lanes, "v": v}, active & (v > 0), carry + jnp.sum(active)
>>> rounds, stages = drain({"v": jnp.array([3, 1, 0, 2])}, jnp.array([True, True, False, True]),
...                        step, jnp.int32(0))
>>> int(rounds)
6
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxops.ops.compaction import compact_map
from jaxops.ops.loops import while_loop

Lanes = dict[str, jax.Array]
Step = Callable[[Lanes, jax.Array, Any], tuple[Lanes, jax.Array, Any]]


def capacities(n: int, shrink: int = 4, min_lanes: int = 512) -> list[int]:
    """Static lane counts of the stages: ``n, n // shrink, ...`` down to ``min_lanes``."""
    caps = [n]
    while caps[-1] // shrink >= min_lanes:
        caps.append(caps[-1] // shrink)
    return caps


def drain(lanes: Lanes, active: jax.Array, step: Step, carry: Any, *, shrink: int = 4,
          min_lanes: int = 512, peel: bool | Step = False
          ) -> tuple[Any, list[tuple[Lanes, jax.Array]]]:
    """Runs ``step(lanes, active, carry) -> (lanes, active, carry)`` until no lane is active.

    ``lanes`` is a dict of arrays with one leading entry per lane. A lane never becomes
    active again by itself, but ``step`` may hand it new work (``active`` stays True).
    ``step`` must leave inactive lanes as they are. Lanes without an ``"id"`` field get
    one (their input index) when they first move to a smaller stage, so a step that does
    not read it need not carry it through the full-width first stage.

    Args:
        peel: run the first step outside any loop (one fused pass over the batch); the
            first stage's loop then runs only while too many lanes are still active, so when
            one step settles almost every lane the full-width loop never iterates. A step
            function given here runs as that first step instead of ``step``.

    Returns:
        ``(carry, stages)``: ``stages`` holds, per stage, the lanes as they were when the
        stage ended and the mask of lanes that retired during it; a caller that keeps
        per-lane results reads them there with :func:`retired_values`.
    """
    caps = capacities(int(active.shape[0]), shrink, min_lanes)
    stages = []
    for k, cap in enumerate(caps):
        nxt = caps[k + 1] if k + 1 < len(caps) else 0
        entered = active

        def more(state, nxt=nxt):
            return jnp.sum(state[1], dtype=jnp.int32) > nxt

        state = (lanes, active, carry)
        if k == 0 and peel:
            # the loop below checks ``more`` before its first step
            state = (step if peel is True else peel)(*state)
        lanes, active, carry = while_loop(more, lambda s: step(*s), state)
        stages.append((lanes, entered & ~active))
        if nxt:
            names = list(lanes)
            implicit_id = "id" not in lanes  # first-stage lanes are in input order: id = index

            def move(i, lanes=lanes, names=names, implicit_id=implicit_id):
                return tuple(lanes[k][i] for k in names) + ((i,) if implicit_id else ())

            names = names + (["id"] if implicit_id else [])
            moved, count = compact_map(active, nxt, move, [0] * len(names))
            lanes = dict(zip(names, moved))
            active = jnp.arange(nxt) < count
    return carry, stages


def retired_values(stages: list[tuple[Lanes, jax.Array]], field: str, id_field: str = "id"
                   ) -> jax.Array:
    """Each input lane's ``field`` as it was when the lane retired (``[N, ...]``).

    The first stage's lanes are in input order and hold the value of every lane that
    retired there or was never active; the lanes that moved on are overwritten from the
    later stages, where each retired (one scatter for all of them).
    """
    result = stages[0][0][field]
    if len(stages) > 1:
        later = stages[1:]
        ids = jnp.concatenate([lanes[id_field] for lanes, _ in later])
        retired = jnp.concatenate([retired for _, retired in later])
        # Lanes that did not retire point past the end, each at its own index, so the
        # indices stay unique and the scatter may say so.
        where = jnp.where(retired, ids, result.shape[0] + jnp.arange(ids.shape[0], dtype=ids.dtype))
        values = jnp.concatenate([lanes[field] for lanes, _ in later])
        result = result.at[where].set(values, mode="drop", unique_indices=True)
    return result
