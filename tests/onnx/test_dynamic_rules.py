"""jaxops.dynamic's valid-region rules on DynArrays whose padding holds garbage (NaN, huge
values): each result equals numpy on the exact arrays; and ONNX If/Loop whose actual
shapes change, under jit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxops
from jaxops import DynArray, dynamic
from jaxops.dynamic import rules
from jaxops.dynamic.tensor import Tensor

NAN = np.float32(np.nan)


def _dyn(valid, max_shape, fill=NAN):
    """A DynArray holding ``valid`` in its leading block, the padding ``fill``."""
    valid = np.asarray(valid, np.float32)
    data = np.full(max_shape, fill, np.float32)
    data[tuple(slice(0, n) for n in valid.shape)] = valid
    return DynArray(jnp.asarray(data), list(valid.shape))


X = np.array([[3.0, -1.0, 2.0], [0.5, 7.0, -4.0]], np.float32)


@pytest.mark.parametrize("kind, ref", [("sum", np.sum), ("max", np.max), ("min", np.min),
                                       ("mean", np.mean), ("prod", np.prod)])
@pytest.mark.parametrize("axis", [0, 1])
def test_reductions_read_only_the_valid_region(kind, ref, axis):
    got = jax.jit(lambda d: dynamic.reduce(d, kind, (axis,)))(_dyn(X, (4, 5)))
    np.testing.assert_allclose(jaxops.refresh(got), ref(X, axis=axis), rtol=1e-6)


def test_argmax_select_last_never_points_into_padding():
    x = np.array([[1.0, 5.0, 5.0]], np.float32)
    t = Tensor.of(_dyn(x, (1, 6), fill=9.0))
    first = rules.arg_reduce(t, "max", 1, False, False)
    last = rules.arg_reduce(t, "max", 1, False, True)
    assert int(first.data[0]) == 1 and int(last.data[0]) == 2


def test_softmax_and_matmul_ignore_nan_padding():
    d = _dyn(X, (3, 4))
    np.testing.assert_allclose(jaxops.refresh(dynamic.softmax(d, 1)),
                               np.exp(X) / np.exp(X).sum(1, keepdims=True), rtol=1e-6)
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_allclose(jaxops.refresh(dynamic.matmul(d, _dyn(w, (4, 4)))), X @ w,
                               rtol=1e-6)


def test_concat_compacts_and_gather_follows_dynarray_indices():
    a, b = _dyn([1.0, 2.0], (4,)), _dyn([3.0, 4.0, 5.0], (5,))
    both = jax.jit(lambda a, b: dynamic.concat([a, b]))(a, b)
    assert both.max_shape == (9,) and jaxops.refresh(both).tolist() == [1, 2, 3, 4, 5]
    idx = DynArray(jnp.array([4, -1, 0, 7]), [3])  # -1: from the actual end
    assert jaxops.refresh(dynamic.gather(both, idx)).tolist() == [5.0, 5.0, 1.0]


def test_top_k_with_a_traced_k():
    d = _dyn([0.5, 9.0, 3.0, 7.0], (6,), fill=100.0)
    f = jax.jit(lambda d, k: dynamic.top_k(d, k, k_max=3))
    values, indices = f(d, jnp.int32(2))
    assert jaxops.refresh(values).tolist() == [9.0, 7.0]
    assert jaxops.refresh(indices).tolist() == [1, 3]


def test_reshape_relayouts_a_dynamic_block_and_slice_takes_a_traced_end():
    t = Tensor.of(_dyn(X, (3, 4)))
    flat = rules.reshape(t, [t.numel()], [12])
    assert jaxops.refresh(flat.to_public()).tolist() == X.reshape(-1).tolist()
    cut = rules.slice_axis(flat, 0, 1, jnp.int32(4), 1, size_max=5)
    assert jaxops.refresh(cut.to_public()).tolist() == X.reshape(-1)[1:4].tolist()


def _model(nodes, inputs, outputs, inits=()):
    from onnx import helper

    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.x64_off
def test_if_whose_branches_differ_in_actual_shape():
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto as T, helper

    import jaxops.onnx

    out = helper.make_tensor_value_info("y", T.FLOAT, None)
    then = helper.make_graph([helper.make_node("Compress", ["x", "pos"], ["y"], axis=0)],
                             "then", [], [out])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "else", [], [out])
    m = _model([helper.make_node("Greater", ["x", "zero"], ["pos"]),
                helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
                helper.make_node("Greater", ["s", "zero"], ["c"]),
                helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
               [helper.make_tensor_value_info("x", T.FLOAT, [4])],
               [helper.make_tensor_value_info("y", T.FLOAT, ["n"])],
               [helper.make_tensor("zero", T.FLOAT, [], [0.0])])
    onnx.checker.check_model(m)
    f = jax.jit(jaxops.onnx.load(m))
    assert jaxops.refresh(f(jnp.array([2.0, -1.0, 3.0, -0.5]))[0]).tolist() == [2.0, 3.0]
    assert jaxops.refresh(f(jnp.array([-2.0, -1.0, 0.5, -3.0]))[0]).tolist() == \
        [-2.0, -1.0, 0.5, -3.0]


@pytest.mark.x64_off
def test_loop_carries_a_growing_tensor():
    pytest.importorskip("onnx")
    from onnx import TensorProto as T, helper

    import jaxops.onnx

    body = helper.make_graph(
        [helper.make_node("Identity", ["c_in"], ["c_out"]),
         helper.make_node("Concat", ["acc_in", "x"], ["acc_out"], axis=0)], "body",
        [helper.make_tensor_value_info("i", T.INT64, []),
         helper.make_tensor_value_info("c_in", T.BOOL, []),
         helper.make_tensor_value_info("acc_in", T.FLOAT, ["k"])],
        [helper.make_tensor_value_info("c_out", T.BOOL, []),
         helper.make_tensor_value_info("acc_out", T.FLOAT, ["k"])])
    m = _model([helper.make_node("Loop", ["m", "", "acc0"], ["acc"], body=body)],
               [helper.make_tensor_value_info("x", T.FLOAT, [2]),
                helper.make_tensor_value_info("acc0", T.FLOAT, [1])],
               [helper.make_tensor_value_info("acc", T.FLOAT, ["k"])],
               [helper.make_tensor("m", T.INT64, [], [3])])
    (acc,) = jax.jit(jaxops.onnx.load(m))(jnp.array([1.0, 2.0]), jnp.array([0.0]))
    assert np.asarray(acc).tolist() == [0.0, 1.0, 2.0, 1.0, 2.0, 1.0, 2.0]
