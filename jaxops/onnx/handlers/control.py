"""``If`` and ``Loop``. A condition known at trace time runs its branch alone (exported
models guard shapes that way). A traced condition runs both branches and keeps one per
output, elementwise, at the larger max shape of the two: the branches' actual shapes may
differ, and the result's dims are the chosen branch's. A ``Loop`` with a trip count known
at trace time is unrolled (its carried values may change their actual shapes); otherwise
it runs as a ``lax.while_loop`` over carried values of static shape."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.dynamic.tensor import Tensor
from jaxops.onnx.handlers.common import scalar
from jaxops.onnx.registry import handler

_UNROLL = 256


def _pad_to(t: Tensor, shape) -> jax.Array:
    data = t.jax()
    return jnp.pad(data, [(0, m - n) for n, m in zip(data.shape, shape)]) \
        if data.shape != tuple(shape) else data


def _select(ctx, c, a: Tensor, b: Tensor) -> Tensor:
    canon = lambda t: np.dtype(jax.dtypes.canonicalize_dtype(t.dtype))
    if a.ndim != b.ndim or canon(a) != canon(b):
        raise ctx.error("branches", "outputs of one rank and dtype in both branches",
                        f"{a.dtype}{list(a.shape)} and {b.dtype}{list(b.shape)}")
    shape = tuple(max(m, n) for m, n in zip(a.shape, b.shape))
    data = jnp.where(c, _pad_to(a, shape), _pad_to(b, shape).astype(canon(a)))
    dims = []
    for k in range(a.ndim):
        da, db = a.dims[k], b.dims[k]
        if isinstance(da, int) and isinstance(db, int) and da == db == shape[k]:
            dims.append(da)
        else:
            dims.append(jnp.where(c, jnp.asarray(da, jnp.int32), jnp.asarray(db, jnp.int32)))
    lost = None
    if a.lost is not None or b.lost is not None:
        lost = jnp.where(c, *(jnp.asarray(0 if t.lost is None else t.lost, jnp.int32)
                              for t in (a, b)))
    out = Tensor(data, dims, lost=lost)
    la, ha = a.bounds()
    lb, hb = b.bounds()
    if la.shape == lb.shape == () or (la.shape == lb.shape and a.shape == b.shape):
        out.lo, out.hi = np.minimum(la, lb), np.maximum(ha, hb)
    return out


@handler("If")
def _if(ctx, cond):
    env = ctx.env
    if cond.concrete:
        branch = "then_branch" if bool(np.asarray(cond.data).reshape(-1)[0]) else "else_branch"
        return tuple(ctx.subgraph(branch, [], env))
    c = cond.jax().reshape(-1)[0].astype(bool)
    then = ctx.subgraph("then_branch", [], env)
    other = ctx.subgraph("else_branch", [], env)
    return tuple(_select(ctx, c, a, b) for a, b in zip(then, other))


class _Traced(Exception):
    """An unrolled loop met a condition computed at run time: it runs as a while loop."""


@handler("Loop")
def _loop(ctx, trip=None, cond=None, *carried):
    env = ctx.env
    body = ctx.attrs["body"]
    n_scan = len(body.output) - 1 - len(carried)
    m = scalar(trip)
    if (trip is None or trip.concrete) and (cond is None or cond.concrete) and \
            (m is None or m <= _UNROLL):
        try:
            return _unrolled(ctx, m, cond, list(carried), n_scan, env)
        except _Traced:
            pass
    return _while(ctx, trip, cond, list(carried), n_scan, env)


def _unrolled(ctx, m, cond, carried, n_scan, env):
    go = True if cond is None else bool(np.asarray(cond.data).reshape(-1)[0])
    scans = [[] for _ in range(n_scan)]
    i = 0
    while go and (m is None or i < m):
        if i >= _UNROLL:
            raise ctx.error("M", f"a loop of at most {_UNROLL} iterations known at trace time",
                            "more", "Give the loop a trip count.")
        it = Tensor(np.asarray(i, np.int64))
        c = Tensor(np.asarray(go))
        outs = ctx.subgraph("body", [it, c] + carried, env)
        c_out, carried, scanned = outs[0], outs[1:1 + len(carried)], outs[1 + len(carried):]
        for s, v in zip(scans, scanned):
            s.append(v)
        if not c_out.concrete:
            if all(t.is_static for t in carried):
                raise _Traced()
            raise ctx.error("cond", "a loop condition known at trace time, or static carried "
                            "values", "a traced condition with values whose size changes")
        go = bool(np.asarray(c_out.data).reshape(-1)[0])
        i += 1
    results = list(carried)
    for s in scans:
        if not s:
            raise ctx.error("M", "at least one iteration for a scan output", 0)
        results.append(Tensor(jnp.stack([v.jax() for v in s])))
    return tuple(results)


def _while(ctx, trip, cond, carried, n_scan, env):
    """A ``lax.while_loop`` over static carried values; scan outputs fill buffers of the trip
    count's upper bound, their actual size the iterations run."""
    if any(not t.is_static for t in carried):
        raise ctx.error("v_initial", "static carried values for a loop whose trip count or "
                        "condition is computed at run time", [repr(t) for t in carried])
    bound = None
    if trip is not None:
        hi = float(np.max(trip.bounds()[1]))
        bound = int(max(hi, 0)) if np.isfinite(hi) and hi < 2 ** 31 else None
    if n_scan and bound is None:
        raise ctx.error("M", "a trip count with a static upper bound for a loop with scan "
                        "outputs (their max size)", "an unbounded one",
                        "Bound it (a Min with a constant) or give it a constant.")
    m = jnp.asarray(np.iinfo(np.int32).max if trip is None else scalar(trip), jnp.int32)
    c0 = jnp.asarray(True if cond is None else cond.jax().reshape(-1)[0], bool)
    n_carried = len(carried)

    def body(i, c, vals):
        outs = ctx.subgraph("body", [Tensor(i.astype(jnp.int32)), Tensor(c)]
                            + [Tensor(v) for v in vals], env, record=False)
        for o in outs[1 + n_carried:]:
            if not o.is_static:
                raise ctx.error("body", "scan outputs of a static shape", repr(o))
        return (outs[0].jax().reshape(()).astype(bool),
                tuple(o.jax().astype(v.dtype) for o, v in zip(outs[1:], vals)),
                tuple(o.jax() for o in outs[1 + n_carried:]))
    vals0 = tuple(t.jax() for t in carried)
    shapes = jax.eval_shape(body, jnp.int32(0), c0, vals0)[2] if n_scan else ()
    bufs0 = tuple(jnp.zeros((bound,) + s.shape, s.dtype) for s in shapes)

    def step(state):
        i, _, vals, bufs = state
        c, vals, scanned = body(i, state[1], vals)
        bufs = tuple(jax.lax.dynamic_update_index_in_dim(b, s.astype(b.dtype), i, 0)
                     for b, s in zip(bufs, scanned))
        return i + 1, c, vals, bufs
    n, _, vals, bufs = jax.lax.while_loop(lambda s: s[1] & (s[0] < m), step,
                                          (jnp.int32(0), c0, vals0, bufs0))
    scans = [Tensor(b, [n] + list(b.shape[1:])) for b in bufs]
    return tuple([Tensor(v) for v in vals] + scans)
