"""Every node's values in one run of a model, and which nodes' output sizes follow the data.

A node is **data-dependent** when the actual size of one of its outputs is computed from
the *values* of tensors, not only from sizes already known: ``NonZero``,
``NonMaxSuppression``, ``Unique``, ``Compress``, a ``TopK`` whose ``k`` is traced, a
``Reshape``/``Expand``/``Range``/``Slice``/``Tile``/``ConstantOfShape`` fed a traced shape
tensor, an ``If`` on a traced condition. It is found from the program itself, not from a
list of op types: the model is traced once (no compile) and, per node, each dynamic dim of
its outputs that no earlier tensor has is followed back through the computation; it is
data-dependent when the path reaches a tensor's values before it reaches known dims.
A node whose output only carries a size on (``Relu`` of a ``NonZero`` output, ``Concat``
of dynamic blocks, ``Gather`` by dynamic indices) is not.

:func:`node_values` then runs the model once under ``jax.jit`` and returns the chosen
nodes' inputs and outputs at their actual shapes (the values the jitted program computes).

>>> import numpy as np, jaxops.onnx
>>> from onnx import helper, TensorProto as T
>>> g = helper.make_graph(
...     [helper.make_node("NonZero", ["x"], ["i"]), helper.make_node("Neg", ["i"], ["y"])],
...     "g", [helper.make_tensor_value_info("x", T.FLOAT, [4])],
...     [helper.make_tensor_value_info("y", T.INT64, [1, "n"])])
>>> program = jaxops.onnx.load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
>>> x = np.array([0, 3, 0, 5], np.float32)
>>> data_dependent(program, x)          # NonZero; Neg only carries its size on
[0]
>>> run = node_values(program, [0], x=x)[0]     # inputs in order, or by name
>>> run.op_type, run.outputs[0].tolist(), run.max_shapes[0]
('NonZero', [[1, 3]], (1, 4))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.extend import core as jcore

from jaxops.core.dynarray import DynArray
from jaxops.dynamic.tensor import is_traced

__all__ = ["NodeValues", "data_dependent", "node_values"]


@dataclasses.dataclass
class NodeValues:
    """One node of one run: its ``inputs`` and ``outputs`` as numpy arrays at their actual
    shapes (``None`` for an omitted optional one), in the dtypes JAX computed them in;
    ``max_shapes``: per output the buffer shape jaxops planned; ``dynamic``: per output
    whether its shape is data-dependent (a DynArray in the program)."""

    index: int
    node: Any
    inputs: list
    outputs: list
    max_shapes: list
    dynamic: list

    @property
    def op_type(self) -> str:
        return self.node.op_type


def _env(program: Any, args: tuple, kwargs: dict) -> dict:
    # Program._run is the program's own run (inputs checked, graph interpreted): every
    # value of the main graph as a jaxops.dynamic.Tensor, by name.
    return program._run(args, kwargs)


def _dims(t: Any) -> list:
    return [d for d in t.dims if not isinstance(d, int)]


def data_dependent(program: Any, *args: Any, **kwargs: Any) -> list[int]:
    """The indices (in ``program.proto.graph.node``) of the nodes whose output sizes are
    computed from tensor values (see the module docstring), for these inputs' shapes and
    dtypes; the values themselves do not matter. Traces the program once, compiles
    nothing."""
    nodes = program.proto.graph.node
    layout: dict[str, tuple[int | None, list[int]]] = {}  # name -> (data slot, dim slots)

    def traced(xs, kw):
        env = _env(program, xs, kw)
        leaves = []
        for name, t in env.items():
            data = len(leaves) if is_traced(t.data) else None
            if data is not None:
                leaves.append(t.data)
            dims = []
            for d in _dims(t):
                dims.append(len(leaves))
                leaves.append(d)
            layout[name] = (data, dims)
        return leaves

    closed = jax.make_jaxpr(traced)(args, kwargs)  # every input traced, as under jit
    jaxpr = closed.jaxpr
    outvar = [v if isinstance(v, jcore.Var) else None for v in jaxpr.outvars]
    producer = {v: e for e in jaxpr.eqns for v in e.outvars}
    values = {outvar[s] for s, _ in layout.values() if s is not None} - {None}
    made = {o for n in nodes for o in n.output}
    known = {outvar[s] for name in layout if name not in made
             for s in layout[name][1]} - {None}
    found, inner = [], _Inner()
    for k, node in enumerate(nodes):
        new = [outvar[s] for o in node.output if o in layout for s in layout[o][1]]
        fresh = [v for v in new if v is not None and v not in known]
        if fresh and _reaches(fresh, values, known, producer, inner):
            found.append(k)
        known.update(v for v in new if v is not None)
    return found


def _reaches(start: list, values: set, known: set, producer: dict, inner: _Inner) -> bool:
    """Whether a backward walk from ``start`` meets a tensor's values (``values``) before
    known dims (``known``, where it stops)."""
    stack, seen = list(start), set()
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        eqn = producer.get(v)
        if eqn is None:  # a graph input or a constant
            if v in values:
                return True
            continue
        for w in inner.sources(eqn, eqn.outvars.index(v)):
            if not isinstance(w, jcore.Var) or w in known:
                continue
            if w in values:
                return True
            stack.append(w)
    return False


class _Inner:
    """Which inputs of an equation each of its outputs depends on: exactly through a nested
    jaxpr of the same arity (``pjit``, custom derivatives), all of them otherwise."""

    def __init__(self):
        self._deps: dict = {}

    def sources(self, eqn: Any, k: int) -> list:
        for p in eqn.params.values():
            inner = getattr(p, "jaxpr", p)
            if isinstance(inner, jcore.Jaxpr) and len(inner.invars) == len(eqn.invars) \
                    and len(inner.outvars) == len(eqn.outvars):
                used = self._inputs_of(inner, k)
                return [w for w, i in zip(eqn.invars, inner.invars) if i in used]
        return list(eqn.invars)

    def _inputs_of(self, jaxpr: Any, k: int) -> set:
        key = (id(jaxpr), k)
        if key not in self._deps:
            producer = {v: e for e in jaxpr.eqns for v in e.outvars}
            stack, seen = [jaxpr.outvars[k]], set()
            while stack:
                v = stack.pop()
                if not isinstance(v, jcore.Var) or v in seen:
                    continue
                seen.add(v)
                eqn = producer.get(v)
                if eqn is not None:
                    stack.extend(self.sources(eqn, eqn.outvars.index(v)))
            self._deps[key] = seen
        return self._deps[key]


def node_values(program: Any, indices: Sequence[int], *args: Any,
                **kwargs: Any) -> list[NodeValues]:
    """The inputs and outputs of the nodes at ``indices`` in one run of ``program`` under
    ``jax.jit`` (values known at trace time, such as constants, come from the trace), at
    their actual shapes."""
    nodes = [program.proto.graph.node[k] for k in indices]
    names = sorted({n for node in nodes for n in [*node.input, *node.output] if n})
    known: dict[str, np.ndarray] = {}
    planned: dict[str, tuple] = {}

    def run(xs, kw):
        env = _env(program, xs, kw)
        out = {}
        for n in names:
            t = env.get(n)
            if t is None:  # an optional output the op did not make
                continue
            planned[n] = (tuple(t.shape), not t.is_static)
            if t.concrete:
                known[n] = np.asarray(t.data)
            else:
                out[n] = t.to_public(program.fill_value)
        return out

    fetched = jax.device_get(jax.jit(run)(args, kwargs))
    host = {n: _actual(v) for n, v in fetched.items()}
    host.update(known)
    return [NodeValues(k, node, [host.get(n) for n in node.input],
                       [host.get(n) for n in node.output],
                       [planned.get(n, (None,))[0] for n in node.output],
                       [planned.get(n, (None, False))[1] for n in node.output])
            for k, node in zip(indices, nodes)]


def _actual(v: Any) -> np.ndarray:
    if isinstance(v, DynArray):
        shape = [int(d) for d in np.asarray(v.actual_shape)]
        return np.asarray(v.data)[tuple(slice(0, d) for d in shape)]
    return np.asarray(v)
