"""Bad models get a clear jaxops error naming the node or file, and nothing else happens;
the layers hold (nothing below jaxops.onnx imports it; ``import jaxops`` never imports onnx)."""

import pathlib
import subprocess
import sys

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

import jaxops.onnx  # noqa: E402
from jaxops.errors import OpArgumentError, ResourceRequestError  # noqa: E402
from onnx import TensorProto as T, helper, numpy_helper  # noqa: E402


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _external(name, dims):
    t = T()
    t.name, t.data_type = name, T.FLOAT
    t.dims.extend(dims)
    return t


X = helper.make_tensor_value_info("x", T.FLOAT, [3])
Y = helper.make_tensor_value_info("y", T.FLOAT, [3])


def test_malformed_graph_is_refused_naming_the_node():
    m = _model([helper.make_node("Relu", ["nowhere"], ["y"], name="r1")], [X], [Y])
    with pytest.raises(OpArgumentError, match="well-formed|r1"):
        jaxops.onnx.load(m)


def test_unsupported_op_is_refused_naming_node_and_supported_ops():
    m = _model([helper.make_node("Gru", ["x"], ["y"], name="odd")], [X], [Y])
    m.graph.node[0].op_type = "NoSuchOp"
    with pytest.raises(OpArgumentError) as e:
        jaxops.onnx.load(m)
    assert "NoSuchOp" in str(e.value) and "Add" in str(e.value)


def test_unsupported_opset_is_refused():
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [X], [Y], opset=99)
    with pytest.raises(OpArgumentError, match="opset"):
        jaxops.onnx.load(m)


def test_a_max_shape_that_cannot_fit_is_refused_before_allocating():
    shape = numpy_helper.from_array(np.array([1 << 20, 1 << 20], np.int64), "s")
    m = _model([helper.make_node("ConstantOfShape", ["s"], ["y"], name="huge")], [X],
               [helper.make_tensor_value_info("y", T.FLOAT, [1 << 20, 1 << 20])], [shape])
    fn = jaxops.onnx.load(m)
    with pytest.raises(ResourceRequestError, match="huge"):
        fn(np.zeros(3, np.float32))


def test_a_declared_initializer_too_big_is_refused_at_load(tmp_path):
    t = _external("w", [1 << 20, 1 << 20])
    t.data_location = T.EXTERNAL
    t.external_data.add(key="location", value="w.bin")
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [X], [Y], [t])
    onnx.save(m, str(tmp_path / "m.onnx"))
    with pytest.raises(ResourceRequestError, match="'w'"):
        jaxops.onnx.load(tmp_path / "m.onnx")


@pytest.mark.parametrize("where", ["../outside.bin", "/etc/passwd"])
def test_external_data_outside_the_folder_is_refused(tmp_path, where):
    t = _external("w", [3])
    t.data_location = T.EXTERNAL
    t.external_data.add(key="location", value=where)
    m = _model([helper.make_node("Add", ["x", "w"], ["y"])], [X], [Y], [t])
    folder = tmp_path / "model"
    folder.mkdir()
    onnx.save(m, str(folder / "m.onnx"))
    with pytest.raises(OpArgumentError, match="outside|inside the model's folder"):
        jaxops.onnx.load(folder / "m.onnx")


def test_wrong_input_shape_names_the_input():
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [X], [Y])
    with pytest.raises(OpArgumentError, match="'x'"):
        jaxops.onnx.load(m)(np.zeros(4, np.float32))


def test_capacity_overflow_shows_in_true_shape():
    import jax

    m = _model([helper.make_node("NonZero", ["x"], ["i"]),
                helper.make_node("Transpose", ["i"], ["t"]),
                helper.make_node("Mul", ["t", "t"], ["y"])], [X],
               [helper.make_tensor_value_info("y", T.INT64, ["n", 1])])
    out = jax.jit(jaxops.onnx.load(m, capacities={"i": 1}))(np.array([1.0, 2.0, 3.0], np.float32))[0]
    assert bool(out.overflowed()) and out.actual_shape.tolist() == [1, 1]


def test_import_jaxops_does_not_import_onnx():
    code = "import jaxops, sys; assert 'onnx' not in sys.modules and 'jaxops.onnx' not in sys.modules"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_nothing_below_imports_jaxops_onnx():
    root = pathlib.Path(__file__).resolve().parents[2] / "jaxops"
    bad = [str(p) for p in root.rglob("*.py") if "onnx" not in p.parts
           and ("jaxops.onnx" in p.read_text() and "import jaxops.onnx" in p.read_text())]
    assert not bad, bad
    below = [p for d in ("core", "capacity", "ops", "backends", "dynamic") for p in
             (root / d).rglob("*.py") if "from jaxops.onnx" in p.read_text()]
    assert not below, below
