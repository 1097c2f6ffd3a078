"""Runs an ONNX graph on :class:`~jaxops.dynamic.Tensor` values, node by node.

Three things happen around each handler call, none of them op-specific:

- **constant folding**: a node whose inputs are all known at trace time runs eagerly
  (``jax.ensure_compile_time_eval``), so the shape arithmetic of an exported model on
  static shapes costs nothing at run time and gives exact shapes;
- **value bounds**: for a traced output, the bounds follow from the inputs' by the rule the
  handler declared (:mod:`jaxops.onnx.registry`), evaluated with the handler itself on the
  bounds (or on element ids, for ops that move elements), never with a second copy of its
  semantics; an output whose bounds meet (``lo == hi``) becomes a known value;
- **errors** name the node, its op type, the argument, what was expected and what was given;
- **sizes**: a data-dependent op reports the size its output needed (:meth:`Context.sized`)
  into the run's ``sizes``, by its first output's name: what a capacity plan is made
  from, and how an overflow is told inside jit.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.core.errors import JaxopsError, OpArgumentError
from jaxops.dynamic.tensor import Tensor, is_traced
from jaxops.onnx.registry import HANDLERS, Handler, attrs_of

__all__ = ["Context", "Sized", "run_graph"]

_SMALL = 4096  # bounds are followed element by element up to this many elements
_NEVER_FOLD = {"RandomUniform", "RandomNormal", "RandomUniformLike", "RandomNormalLike",
               "Bernoulli", "Multinomial"}
_HUGE = float(2 ** 30)  # bounds beyond this are not followed through arithmetic


class Sized(NamedTuple):
    """What a data-dependent op's output needed in one run: ``size`` (traced int32) along
    its capacity ``axis``, against the ``capacity`` it ran at and its ``bound`` (the
    capacity without a plan); ``row_bytes``: the bytes of its outputs per unit of size."""

    op: str
    axis: int
    size: Any
    capacity: int
    bound: int
    row_bytes: int


class Context:
    """What a handler knows of its node."""

    def __init__(self, node: Any, opset: int, program: Any, sizes: dict | None = None):
        self.node, self.opset, self.program, self.sizes = node, opset, program, sizes
        self.op_type = node.op_type
        self.name = node.name or f"{node.op_type}->{node.output[0] if node.output else ''}"
        self.attrs = attrs_of(node)
        self.env: dict = {}  # the values in scope (for subgraphs)

    def attr(self, name: str, default: Any = None) -> Any:
        v = self.attrs.get(name, default)
        return v.decode() if isinstance(v, bytes) else v

    @property
    def where(self) -> str:
        return f"ONNX node {self.name!r} ({self.op_type})"

    def error(self, arg: str, expected: str, given: Any, hint: str = "") -> OpArgumentError:
        return OpArgumentError(self.where, arg, expected, given, hint)

    def capacity(self, k: int = 0) -> int | None:
        """The user's capacity for output ``k`` (by output name or node name), if any."""
        caps = self.program.capacities
        out = self.node.output[k] if k < len(self.node.output) else None
        return caps.get(out, caps.get(self.node.name)) if caps else None

    def subgraph(self, name: str, inputs: Sequence[Tensor], env: dict,
                 record: bool = True) -> list[Tensor]:
        """Runs the graph attribute ``name`` with ``inputs`` over the enclosing scope
        (``record``: its sizes count; not inside a traced loop body, whose values stay in
        the loop)."""
        graph = self.attrs[name]
        scope = dict(env)
        for value, tensor in zip(graph.input, inputs):
            scope[value.name] = tensor
        return run_graph(graph, scope, self.opset, self.program,
                         self.sizes if record else None)

    def sized(self, out: Any, axis: int, bound: int, *outputs: Any) -> None:
        """Records the size a data-dependent output (a DynArray) needed along ``axis``: its
        true size when a capacity cut it; ``bound``: its capacity without a plan;
        ``outputs``: the node's other outputs of that size (their bytes count)."""
        if self.sizes is None:
            return
        true = (out.true_shape if out.true_shape is not None else out.actual_shape)[axis]
        row = sum(math.prod(o.data.shape) // max(o.data.shape[axis], 1) * o.data.dtype.itemsize
                  for o in (out, *outputs))
        name = self.node.output[0]
        before = self.sizes.get(name)
        if before is not None:  # a node run again (an unrolled loop): the largest counts
            true = jnp.maximum(before.size, true)
        self.sizes[name] = Sized(self.op_type, axis, jnp.asarray(true, jnp.int32),
                                 int(out.data.shape[axis]), int(bound), int(row))

    def known_int(self, t: Tensor | None, arg: str, default: Any = None) -> Any:
        """A value that must be known at trace time (an axis list, a repeat count)."""
        if t is None:
            return default
        if not t.concrete:
            raise self.error(arg, "a value known at trace time", "a traced value")
        return np.asarray(t.data).astype(np.int64).tolist()

    def known_ints(self, t: Tensor | None, arg: str, default: Any = None) -> Any:
        """A list of ints known at trace time (a scalar is a list of one: ``axes=0``)."""
        v = self.known_int(t, arg, default)
        return [v] if isinstance(v, int) else v


def run_graph(graph: Any, env: dict, opset: int, program: Any,
              sizes: dict | None = None) -> list[Tensor]:
    """Runs ``graph``'s nodes in order over ``env`` (name -> Tensor, updated) and returns its
    outputs; data-dependent ops record their sizes into ``sizes`` (:class:`Sized`)."""
    for init in graph.initializer:
        if init.name not in env:
            env[init.name] = Tensor(program.initializer(init))
    for node in graph.node:
        run_node(node, env, opset, program, sizes)
    return [env[o.name] for o in graph.output]


def run_node(node: Any, env: dict, opset: int, program: Any, sizes: dict | None = None) -> None:
    h = HANDLERS[node.op_type]
    ctx = Context(node, opset, program, sizes)
    ctx.env = env
    inputs = []
    for name in node.input:
        if not name:
            inputs.append(None)
        elif name not in env:
            raise ctx.error("inputs", "inputs defined before the node", f"undefined {name!r}")
        else:
            inputs.append(env[name])
    fold = node.op_type not in _NEVER_FOLD and not _has_graph(node) and \
        all(t is None or t.concrete for t in inputs)
    try:
        if fold:
            with jax.ensure_compile_time_eval():
                outs = _call(h, ctx, inputs)
            outs = [None if t is None else Tensor(np.asarray(t.data)) if not is_traced(t.data)
                    else t for t in outs]
        else:
            outs = _call(h, ctx, inputs)
            outs = [None if t is None else _bounded(h, ctx, inputs, t, k)
                    for k, t in enumerate(outs)]
    except JaxopsError:
        raise
    except (ValueError, TypeError, IndexError) as e:  # a shape or dtype the op cannot take
        raise ctx.error("inputs", "inputs the op accepts",
                        [None if t is None else (t.dtype.name, list(t.shape)) for t in inputs],
                        f"({type(e).__name__}: {e})") from e
    for name, t in zip(node.output, outs):
        if name and t is not None:
            env[name] = t


def _has_graph(node: Any) -> bool:
    return any(a.type == a.GRAPH or a.type == a.GRAPHS for a in node.attribute)


def _call(h: Handler, ctx: Context, inputs: list) -> list:
    out = h.fn(ctx, *inputs)
    return list(out) if isinstance(out, (tuple, list)) else [out]


# -- value bounds --------------------------------------------------------------------------
def _bounded(h: Handler, ctx: Context, inputs: list, t: Tensor, k: int) -> Tensor:
    if t.lo is not None or t.concrete or t.dtype.kind not in "biuf":
        return t
    try:
        found = _derive(h, ctx, inputs, t, k)
    except (JaxopsError, ValueError, TypeError, IndexError):
        found = None  # bounds are an aid: an op that cannot run on them has none
    if found is None:
        return t
    lo, hi, syms = found
    t.lo, t.hi, t.syms = lo, hi, syms
    if t.is_static and np.array_equal(lo, hi) and np.all(np.isfinite(lo)) and t.data.size <= _SMALL:
        return Tensor(np.broadcast_to(lo, t.shape).astype(t.dtype))
    return t


def _finite(inputs: list) -> bool:
    for x in inputs:
        if x is None:
            continue
        lo, hi = x.bounds()
        if not (np.all(np.abs(lo) < _HUGE) and np.all(np.abs(hi) < _HUGE)):
            return False
    return True


def _as_bound(x: Tensor | None, v: np.ndarray) -> Tensor | None:
    if x is None:
        return None
    return Tensor(np.asarray(v).astype(x.dtype))


def _eval(h: Handler, ctx: Context, args: list, k: int) -> np.ndarray:
    with jax.ensure_compile_time_eval():
        out = _call(h, ctx, args)[k]
    return np.asarray(out.data, np.float64)


def _derive(h: Handler, ctx: Context, inputs: list, t: Tensor, k: int):
    kind = h.bounds
    if kind == "equal":  # known where the intervals are disjoint, or one same value
        (la, ha), (lb, hb) = inputs[0].bounds(), inputs[1].bounds()
        never = (ha < lb) | (la > hb)
        always = (la == ha) & (lb == hb) & (la == lb)
        return np.where(always, 1.0, 0.0), np.where(never, 0.0, 1.0), None
    if kind == "bool" or (kind is None and t.dtype.kind == "b"):
        return np.zeros(()), np.ones(()), None
    if kind in ("monotone", "antitone", "sub", "corners"):
        if not _finite(inputs):
            return None
        los = [None if x is None else _as_bound(x, x.bounds()[0]) for x in inputs]
        his = [None if x is None else _as_bound(x, x.bounds()[1]) for x in inputs]
        if kind == "monotone":
            return _eval(h, ctx, los, k), _eval(h, ctx, his, k), None
        if kind == "antitone":
            return _eval(h, ctx, his, k), _eval(h, ctx, los, k), None
        if kind == "sub":
            return (_eval(h, ctx, [los[0], his[1]], k), _eval(h, ctx, [his[0], los[1]], k), None)
        if ctx.op_type in ("Div", "Mod") and len(inputs) > 1:
            lo1, hi1 = inputs[1].bounds()
            if np.any((lo1 <= 0) & (hi1 >= 0)):
                return None
        outs = [_eval(h, ctx, list(c), k) for c in itertools.product(*[
            [None] if x is None else [lo, hi] for x, lo, hi in zip(inputs, los, his)])]
        return np.minimum.reduce(outs), np.maximum.reduce(outs), None
    if kind == "copy":
        return _copied(h, ctx, inputs, t, k)
    return None


def _copied(h: Handler, ctx: Context, inputs: list, t: Tensor, k: int):
    """Bounds, known values and dims of an op that copies elements: the handler run on
    element ids says where each output element came from."""
    data = [i for i in h.data if i < len(inputs) and inputs[i] is not None]
    others_known = all(x is None or x.concrete for i, x in enumerate(inputs) if i not in data)
    small = all(inputs[i].is_static and inputs[i].data.size <= _SMALL for i in data)
    if not (others_known and small and t.is_static and t.data.size <= _SMALL):
        los = [np.min(inputs[i].bounds()[0]) for i in data]
        his = [np.max(inputs[i].bounds()[1]) for i in data]
        return np.array(min(los)), np.array(max(his)), None
    args, offset, lo_all, hi_all, syms_all = list(inputs), 0, [], [], []
    for i in data:
        x = inputs[i]
        n = x.data.size
        args[i] = Tensor(np.arange(offset, offset + n, dtype=np.int32).reshape(x.shape))
        lo, hi = x.bounds()
        lo_all.append(np.broadcast_to(lo, x.shape).reshape(-1))
        hi_all.append(np.broadcast_to(hi, x.shape).reshape(-1))
        syms_all.append(x.syms.reshape(-1) if x.syms is not None else np.full(n, None, object))
        offset += n
    with jax.ensure_compile_time_eval():
        ids = np.asarray(_call(h, ctx, args)[k].data).astype(np.int64)
    lo, hi = np.concatenate(lo_all)[ids], np.concatenate(hi_all)[ids]
    syms = np.concatenate(syms_all)[ids.reshape(-1)].reshape(ids.shape)
    return lo, hi, (syms if any(s is not None for s in syms.reshape(-1)) else None)

