"""What :func:`jaxops.onnx.load` refuses before anything runs, each refusal a jaxops error
naming the node (or file, or value), the argument, what is supported and what was given:

- a graph that is malformed (``onnx.checker``; an input used before it is defined), uses an
  op without a handler, another domain, or an opset outside :data:`OPSETS`;
- a value that is not a tensor (sequences, optionals, maps) or whose element type JAX does
  not compute in here (strings, float8 e8m0, 6-bit floats), wherever it is
  declared: graph inputs, outputs and value infos, initializers, constants, ``Cast``'s
  ``to``;
- an attribute or constant input an op's handler declares it cannot run (the handler's
  ``check``, e.g. Dropout's random masks);
- external data outside the model's folder, and an initializer too big for memory (checked
  before its bytes are read).

>>> from onnx import helper, TensorProto as T
>>> g = helper.make_graph([helper.make_node("Cast", ["x"], ["y"], to=T.FLOAT8E8M0)], "g",
...     [helper.make_tensor_value_info("x", T.FLOAT, [2])],
...     [helper.make_tensor_value_info("y", T.FLOAT8E8M0, [2])])
>>> check_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)]), None)
... # doctest: +ELLIPSIS
Traceback (most recent call last):
...
jaxops.core.errors.OpDTypeError: ONNX node 'Cast->y' (Cast): argument 'to': expected an element type jaxops.onnx computes in (float32, uint8, ...), got FLOAT8E8M0.
"""

from __future__ import annotations

import math
import os
import pathlib
from typing import Any

import ml_dtypes
import numpy as np

from jaxops.core.errors import OpArgumentError, OpDTypeError
from jaxops.core.memory import refuse_unless_fits
from jaxops.onnx.registry import HANDLERS

__all__ = ["OPSETS", "LoadNode", "check_elem_type", "check_model", "check_nodes",
           "external_inside", "plan_initializer"]

#: Default-domain opsets whose semantics the handlers implement.
OPSETS = range(1, 29)
_DOMAINS = ("", "ai.onnx")
#: ONNX element types JAX computes in (by TensorProto code); every other one is refused.
_TYPES = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64",
          9: "bool", 10: "float16", 11: "float64", 12: "uint32", 13: "uint64",
          14: "complex64", 15: "complex128", 16: "bfloat16", 17: "float8_e4m3fn",
          18: "float8_e4m3fnuz", 19: "float8_e5m2", 20: "float8_e5m2fnuz", 21: "uint4",
          22: "int4", 23: "float4_e2m1fn", 25: "uint2", 26: "int2"}
_SUPPORTED = ", ".join(_TYPES.values())
#: Attributes that name an element type, by op.
_TYPE_ATTRS = {"Cast": "to", "EyeLike": "dtype", "RandomUniform": "dtype",
               "RandomNormal": "dtype", "RandomUniformLike": "dtype",
               "RandomNormalLike": "dtype", "Bernoulli": "dtype", "Multinomial": "dtype"}


def _fail(arg: str, expected: str, given: Any, hint: str = "") -> OpArgumentError:
    return OpArgumentError("jaxops.onnx.load", arg, expected, given, hint)


def _type_name(code: int) -> str:
    from onnx import TensorProto

    try:
        return TensorProto.DataType.Name(code)
    except ValueError:
        return f"element type {code}"


def check_elem_type(where: str, arg: str, code: int) -> None:
    """Refuses an element type JAX does not compute in (:data:`_TYPES`)."""
    if code and code not in _TYPES:
        raise OpDTypeError(where, arg, f"an element type jaxops.onnx computes in ({_SUPPORTED})",
                           _type_name(code))


class LoadNode:
    """What a handler's ``check`` sees of its node at load: attributes, opset, which inputs
    are constants (initializers or ``Constant`` outputs in scope) and their values."""

    def __init__(self, node: Any, opset: int, constants: dict):
        from jaxops.onnx.registry import attrs_of

        self.node, self.opset, self.op_type = node, opset, node.op_type
        self.name = node.name or f"{node.op_type}->{node.output[0] if node.output else ''}"
        self.attrs = attrs_of(node)
        self._constants = constants

    @property
    def where(self) -> str:
        return f"ONNX node {self.name!r} ({self.op_type})"

    def attr(self, name: str, default: Any = None) -> Any:
        v = self.attrs.get(name, default)
        return v.decode() if isinstance(v, bytes) else v

    def given(self, k: int) -> bool:
        """Whether input ``k`` is given (not omitted)."""
        return k < len(self.node.input) and bool(self.node.input[k])

    def constant(self, k: int) -> np.ndarray | None:
        """Input ``k``'s value when it is a constant, else ``None``."""
        if not self.given(k):
            return None
        t = self._constants.get(self.node.input[k])
        if t is None:
            return None
        from onnx import numpy_helper

        return numpy_helper.to_array(t)

    def error(self, arg: str, expected: str, given: Any, hint: str = "") -> OpArgumentError:
        return OpArgumentError(self.where, arg, expected, given, hint)


def _check_value(where: str, value: Any) -> None:
    """A graph input, output or value info: a tensor of a supported element type."""
    kind = value.type.WhichOneof("value")
    if kind is None:  # no type declared (allowed for outputs and value infos)
        return
    if kind != "tensor_type":
        raise OpDTypeError(where, value.name, "a tensor (jaxops.onnx runs no sequence, "
                           "optional, map or sparse values)",
                           f"a value of kind {kind.replace('_type', '')!r}")
    check_elem_type(where, value.name, value.type.tensor_type.elem_type)


def _check_values(node: Any, where: str, declared: dict, inits: dict) -> None:
    """The node's inputs and outputs whose type the graph declares (graph inputs, outputs,
    value infos, initializers): refused naming the node and the value."""
    for name in list(node.input) + list(node.output):
        if name in declared:
            _check_value(where, declared[name])
        if name in inits:
            check_elem_type(where, name, inits[name].data_type)


def _check_attributes(node: Any, where: str) -> None:
    from onnx import helper

    for a in node.attribute:
        if a.type == a.TENSOR:
            check_elem_type(where, a.name, a.t.data_type)
        elif a.type == a.SPARSE_TENSOR:
            raise OpDTypeError(where, a.name, "a dense tensor", "a sparse tensor")
    name = _TYPE_ATTRS.get(node.op_type)
    if name is not None:
        v = next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), None)
        if isinstance(v, int):
            check_elem_type(where, name, v)


def check_nodes(graph: Any, opset: int, outer: set[str], constants: dict) -> None:
    """Every node of ``graph`` (and its subgraphs): an op with a handler at this opset,
    inputs defined before use, supported types and attributes (the handler's ``check``)."""
    known = set(outer) | {v.name for v in graph.input} | {t.name for t in graph.initializer}
    constants = {**constants, **{t.name: t for t in graph.initializer}}
    values = list(graph.input) + list(graph.output) + list(graph.value_info)
    declared = {v.name: v for v in values}
    for node in graph.node:
        where = LoadNode(node, opset, constants).where
        if node.domain not in _DOMAINS:
            raise OpArgumentError(where, None, "an op of the default domain",
                                  f"domain {node.domain!r}")
        h = HANDLERS.get(node.op_type)
        if h is None:
            raise OpArgumentError(where, None, "an op jaxops.onnx supports (one of "
                                  + ", ".join(sorted(HANDLERS)) + ")", repr(node.op_type))
        if opset < h.since:
            raise OpArgumentError(where, None, f"opset >= {h.since} for {node.op_type}", opset)
        for name in node.input:
            if name and name not in known:
                raise OpArgumentError(where, "inputs", "inputs defined before the node",
                                      f"undefined {name!r}")
        _check_attributes(node, where)
        _check_values(node, where, declared, constants)
        if h.check is not None:
            h.check(LoadNode(node, opset, constants))
        for a in node.attribute:
            for g in ([a.g] if a.type == a.GRAPH else list(a.graphs)):
                check_nodes(g, opset, known, constants)
        if node.op_type == "Constant" and node.output:
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            if value is not None:
                constants[node.output[0]] = value
        known.update(o for o in node.output if o)
    for value in values:  # those no node uses
        _check_value(f"jaxops.onnx.load: graph {graph.name!r}", value)
    for t in graph.initializer:
        check_elem_type(f"jaxops.onnx.load: initializer {t.name!r}", "data_type", t.data_type)
    for o in graph.output:
        if o.name not in known:
            raise _fail("model", "graph outputs that some node or input defines",
                        f"undefined {o.name!r}")


def check_model(proto: Any, folder: pathlib.Path | None) -> int:
    """Every load-time check of a model (see the module docstring); returns its opset."""
    import onnx

    external_inside(proto, folder)
    for t in proto.graph.initializer:
        plan_initializer(t)
    opset = None
    for imp in proto.opset_import:
        if imp.domain in _DOMAINS:
            opset = imp.version
        elif any(n.domain == imp.domain for n in proto.graph.node):
            raise _fail("model", "ops of the default ONNX domain only",
                        f"domain {imp.domain!r}")
    if opset is None or opset not in OPSETS:
        raise _fail("model", f"default-domain opset in [{OPSETS.start}, {OPSETS.stop - 1}]",
                    opset)
    check_nodes(proto.graph, opset, set(), {})  # first: an op we lack is named as such
    try:
        onnx.checker.check_model(proto)
    except Exception as e:
        raise _fail("model", "a well-formed ONNX graph", f"{type(e).__name__}: {e}") from e
    return opset


def external_inside(proto: Any, folder: pathlib.Path | None) -> None:
    """External data must name a file inside the model's folder (no absolute path, no
    ``..`` out of it, no link leading out): checked before any byte is read."""
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    for tensor in _get_all_tensors(proto):
        if not uses_external_data(tensor):
            continue
        info = {e.key: e.value for e in tensor.external_data}
        where = info.get("location", "")
        if folder is None:
            raise _fail("model", "external data loaded with the model (pass its path)",
                        f"tensor {tensor.name!r} stored in {where!r}")
        base = folder.resolve()
        target = (base / where).resolve()
        if os.path.isabs(where) or base not in target.parents:
            raise _fail("model", f"external data inside the model's folder {str(base)!r}",
                        f"tensor {tensor.name!r} pointing at {where!r}",
                        "Move the data file beside the model.")


def plan_initializer(t: Any) -> None:
    """Refuses an initializer whose declared shape cannot fit in memory, before reading it."""
    check_elem_type(f"jaxops.onnx.load: initializer {t.name!r}", "data_type", t.data_type)
    dtype = np.dtype(getattr(ml_dtypes, _TYPES[t.data_type], None) or _TYPES[t.data_type])
    refuse_unless_fits(f"jaxops.onnx: initializer {t.name!r}", "dims",
                       math.prod(t.dims) * dtype.itemsize,
                       f"the declared {list(t.dims)} {_TYPES[t.data_type]} tensor")
