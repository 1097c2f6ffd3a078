"""Handlers by ONNX op type: one short function per op, registered with a decorator.

A handler takes the node's context (attributes, name, opset, capacities, subgraphs) and its
inputs as :class:`~jaxops.dynamic.Tensor` (``None`` for an omitted optional input) and
returns a Tensor or a tuple of them. It says the op's semantics by calling a jaxops
operator or a rule of :mod:`jaxops.dynamic.rules`; how the *value bounds* of its outputs
follow from its inputs' is declared at registration (``bounds=``), so the interpreter can
give shape-feeding integers static bounds without a second copy of the op:

- ``"monotone"``: non-decreasing in every input (``Add``, ``Max``, ``Floor``, ``Cast``):
  the handler run on the lower bounds gives the lower bound, on the upper the upper;
- ``"sub"``: increasing in the first input, decreasing in the second;
- ``"corners"``: the hull of the handler run on every combination of bounds (``Mul``,
  ``Div``, and the order comparisons, which are monotone in each input);
- ``"antitone"``: non-increasing (``Neg``, ``Not``);
- ``"equal"``: ``Equal``, known where the intervals are disjoint (or one same value);
- ``"copy"``: every output element is a copy of an element of the ``data`` inputs
  (``Gather``, ``Concat``, ``Slice``, ``Reshape``...): the handler run on element ids
  tells which, and bounds, known values and traced dims follow the copies;
- ``"bool"``: in ``[0, 1]``; ``None``: unknown (or set by the handler itself).

A handler may also declare ``check=``: a function of the node as load sees it
(:class:`jaxops.onnx.checks.LoadNode`: attributes, constant inputs) that raises for what
the handler cannot run (an attribute value, a constant input), so that such a model is
refused at load, naming the node, the attribute and what is supported, before anything runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

__all__ = ["HANDLERS", "Handler", "attrs_of", "handler"]


@dataclasses.dataclass(frozen=True)
class Handler:
    op_type: str
    fn: Callable
    bounds: str | None = None
    data: tuple[int, ...] = (0,)  # the inputs whose elements a "copy" op moves
    since: int = 1  # the oldest opset whose semantics the handler implements
    check: Callable | None = None  # refuses, at load, what the handler cannot run


HANDLERS: dict[str, Handler] = {}


def handler(*op_types: str, bounds: str | None = None, data: tuple[int, ...] = (0,),
            since: int = 1, check: Callable | None = None) -> Callable:
    """Registers the decorated function for each of ``op_types`` (twice is an error)."""
    def register(fn: Callable) -> Callable:
        for op in op_types:
            if op in HANDLERS:
                raise ValueError(f"ONNX op {op!r} has two handlers")
            HANDLERS[op] = Handler(op, fn, bounds, data, since, check)
        return fn
    return register


def attrs_of(node: Any) -> dict[str, Any]:
    """A node's attributes as Python values (graphs stay GraphProtos)."""
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}
