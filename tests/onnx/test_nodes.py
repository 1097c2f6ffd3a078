"""jaxops.onnx.nodes: which nodes' output sizes are computed from tensor values (a size
only carried on, or rebuilt from known dims, does not count), and node values of a run."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto as T  # noqa: E402
from onnx import helper  # noqa: E402

import jaxops.onnx  # noqa: E402
from jaxops.onnx.nodes import data_dependent, node_values  # noqa: E402


def _branch(name, values):
    out = helper.make_tensor_value_info(f"{name}_out", T.FLOAT, [len(values)])
    node = helper.make_node("Constant", [], [f"{name}_out"],
                            value=helper.make_tensor(f"{name}_v", T.FLOAT, [len(values)], values))
    return helper.make_graph([node], name, [], [out])


def _program():
    nodes = [
        helper.make_node("NonZero", ["x"], ["nz"], name="nonzero"),              # chosen
        helper.make_node("Shape", ["nz"], ["s"], name="shape"),
        helper.make_node("ConstantOfShape", ["s"], ["same"], name="same"),       # dims of nz
        helper.make_node("Add", ["s", "one"], ["s1"], name="add"),
        helper.make_node("ConstantOfShape", ["s1"], ["grown"], name="grown"),    # from values
        helper.make_node("Concat", ["same", "same"], ["cat"], axis=1, name="concat"),
        helper.make_node("ReduceMax", ["x"], ["top"], keepdims=0, name="max"),
        helper.make_node("Greater", ["top", "zero"], ["cond"], name="greater"),
        helper.make_node("If", ["cond"], ["picked"], name="if",                  # chosen
                         then_branch=_branch("two", [1.0, 2.0]),
                         else_branch=_branch("three", [3.0, 4.0, 5.0])),
        helper.make_node("Relu", ["picked"], ["relu"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [5])],
        [helper.make_tensor_value_info(n, e, None) for n, e in
         [("grown", T.FLOAT), ("cat", T.FLOAT), ("relu", T.FLOAT)]],
        [helper.make_tensor("one", T.INT64, [], [1]),
         helper.make_tensor("zero", T.FLOAT, [], [0.0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    for o in model.graph.output:  # ranks for the checker
        o.type.tensor_type.shape.dim.add()
        if o.name != "relu":
            o.type.tensor_type.shape.dim.add()
    return jaxops.onnx.load(model)


def test_sizes_from_values_are_found_carried_sizes_are_not():
    program = _program()
    x = np.array([0, 2, 0, 3, 0], np.float32)
    chosen = [program.proto.graph.node[k].name for k in data_dependent(program, x)]
    assert chosen == ["nonzero", "grown", "if"]
    grown, picked = node_values(program, [4, 8], x)
    assert grown.outputs[0].shape == (2, 3) and (grown.outputs[0] == 0).all()
    assert grown.inputs[0].tolist() == [2, 3] and grown.max_shapes[0] == (2, 6)
    assert picked.outputs[0].tolist() == [1.0, 2.0] and picked.dynamic == [True]
    (picked,) = node_values(program, [8], -x)  # the other branch, another size
    assert picked.outputs[0].tolist() == [3.0, 4.0, 5.0]
