"""Checking a model's golden folder against ONNX's own reference (``jaxops golden check DIR``).

Each node case is recomputed from its recorded inputs by ``onnx.reference`` (ONNX's numpy
implementation of every op, no jaxops code), the node taken from the model with its
attributes; every output must equal the case's, dtype, shape and bits (NaN equal to NaN).
A node with subgraphs (``If``, ``Loop``) reads values outside its inputs and is reported
as not checked, never as passed.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np

from jaxops.core.errors import OpArgumentError
from jaxops.golden.files import load
from jaxops.golden.models import load_index

__all__ = ["NodeCheck", "check_model"]


@dataclasses.dataclass
class NodeCheck:
    """One node's check: ``status`` is ``"ok"``, ``"FAIL"`` or ``"not checked"``."""

    entry: dict
    status: str
    detail: str = ""

    def line(self) -> str:
        e = self.entry
        return (f"node {e['index']} {e['name']!r} ({e['op_type']}): {self.status}"
                + (f": {self.detail}" if self.detail else ""))


def _one_node_model(node: Any, case: dict, opset: int) -> tuple[Any, dict]:
    from onnx import helper

    feeds, ins = {}, []
    keys = {t["value"]: t["key"] for t in case["index_entry"]["inputs"]}
    for name in node.input:
        if name:
            a = case["arrays"][keys[name]]
            feeds[name] = a
            ins.append(helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(a.dtype), None))
    outs = [helper.make_tensor_value_info(n, 0, None) for n in node.output if n]
    graph = helper.make_graph([node], "node", ins, outs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), feeds


def _check_node(node: Any, case: dict, opset: int) -> tuple[str, str]:
    from onnx.reference import ReferenceEvaluator

    if any(a.type in (a.GRAPH, a.GRAPHS) for a in node.attribute):
        return "not checked", "its subgraphs read values outside its inputs"
    model, feeds = _one_node_model(node, case, opset)
    theirs = ReferenceEvaluator(model).run(None, feeds)
    outputs = {t["value"]: t["key"] for t in case["index_entry"]["outputs"]}
    for name, want in zip([n for n in node.output if n], theirs):
        ours = case["arrays"][outputs[name]]
        want = np.asarray(want)
        if want.dtype != ours.dtype or want.shape != ours.shape:
            return "FAIL", (f"{outputs[name]}: {ours.dtype} {list(ours.shape)}, the reference "
                            f"{want.dtype} {list(want.shape)}")
        same = (ours == want) | (np.isnan(ours) & np.isnan(want)) if ours.dtype.kind == "f" \
            else ours == want
        if not np.all(same):
            at = tuple(int(i) for i in np.argwhere(~same)[0])
            return "FAIL", (f"{outputs[name]}: {int((~same).sum())} of {ours.size} elements "
                            f"differ; at {list(at)} {ours[at]!r}, the reference {want[at]!r}")
    return "ok", "equals onnx.reference"


def check_model(folder: str | os.PathLike, model: Any = None) -> list[NodeCheck]:
    """Checks every node case of a model's golden folder against ``onnx.reference``.

    Args:
      folder: the folder ``jaxops golden --onnx`` wrote.
      model: the ``.onnx`` path (or ModelProto); default the path the index records.

    Returns:
      One :class:`NodeCheck` per node, in the index's order.
    """
    import onnx

    index = load_index(folder)
    model = index.get("model_path") if model is None else model
    if model is None or (not hasattr(model, "graph") and not os.path.isfile(model)):
        raise OpArgumentError("golden check", "--onnx", "the model the folder was written "
                              "from (the index's model_path, or --onnx MODEL)", repr(model))
    proto = model if hasattr(model, "graph") else onnx.load(os.fspath(model))
    nodes = list(proto.graph.node)
    found = []
    for entry in index["nodes"]:
        node = nodes[entry["index"]] if entry["index"] < len(nodes) else None
        if node is None or node.op_type != entry["op_type"] or \
                [t["value"] for t in entry["outputs"]] != [n for n in node.output if n]:
            raise OpArgumentError("golden check", "--onnx", f"the model whose node "
                                  f"{entry['index']} is {entry['op_type']} {entry['name']!r}",
                                  repr(getattr(node, "op_type", None)))
        case = {**load(os.path.join(os.fspath(folder), entry["case"])), "index_entry": entry}
        found.append(NodeCheck(entry, *_check_node(node, case, index["opset"])))
    return found
