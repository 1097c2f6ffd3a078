"""Constants are read by tensor, not by name: two If branches whose Constant nodes name
their value tensors alike (exporters do) keep their own values under jit."""

import jax
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import jaxops.onnx  # noqa: E402


def _branch(name: str, values: list[int]) -> onnx.GraphProto:
    value = numpy_helper.from_array(np.array(values, np.int64), name="value")  # same name
    const = helper.make_node("Constant", [], [f"{name}_out"], value=value)
    out = helper.make_tensor_value_info(f"{name}_out", TensorProto.INT64, [None])
    return helper.make_graph([const], name, [], [out])


def _model() -> onnx.ModelProto:
    cond = helper.make_tensor_value_info("cond", TensorProto.BOOL, [])
    y = helper.make_tensor_value_info("y", TensorProto.INT64, [None])
    node = helper.make_node("If", ["cond"], ["y"], then_branch=_branch("then", [1, 2]),
                            else_branch=_branch("else", [3, 4, 5]))
    graph = helper.make_graph([node], "if_constants", [cond], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_if_branches_keep_their_own_constants_under_jit():
    model = _model()
    fn = jax.jit(jaxops.onnx.load(model))
    reference = ReferenceEvaluator(model)
    for cond in (True, False, True):
        want = reference.run(None, {"cond": np.array(cond)})[0]
        got = np.asarray(jaxops.refresh(fn(np.array(cond))[0]))
        np.testing.assert_array_equal(got, want)
