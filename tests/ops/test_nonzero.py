"""NonZero / argwhere / flatnonzero against numpy and ONNX Runtime."""

import chex
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jaxops
import tracing
from jaxops.core.errors import OpArgumentError, OpDTypeError
from tests.helpers.cases.nonzero import ref_flatnonzero, ref_nonzero
from tests.helpers.util import expected_truncation


def assert_indices(got, want):
    chex.assert_trees_all_equal(np.asarray(got, np.int64), np.asarray(want, np.int64))


def onnx_nonzero(x: np.ndarray) -> np.ndarray:
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper
    from onnx.helper import np_dtype_to_tensor_dtype
    elem = np_dtype_to_tensor_dtype(x.dtype)
    graph = helper.make_graph([helper.make_node("NonZero", ["X"], ["Y"])], "nz",
                              [helper.make_tensor_value_info("X", elem, None)],
                              [helper.make_tensor_value_info("Y", TensorProto.INT64, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"X": x})[0]


DTYPES = [np.bool_, np.uint16, ml_dtypes.bfloat16, np.float32, np.complex64]


def random_array(rng, shape, dtype):
    x = np.asarray(rng.standard_normal(shape) * (rng.random(shape) < 0.4), np.float32)
    x[rng.random(shape) < 0.05] = np.nan
    x[rng.random(shape) < 0.05] = -0.0
    if np.dtype(dtype).kind in "biu":
        return np.asarray(np.nan_to_num(x) * 3).astype(dtype)
    return np.asarray(x.astype(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_random_arrays_rank_0_to_4_match_numpy(dtype):
    rng = np.random.default_rng(0)
    for shape in [(), (7,), (3, 5), (2, 3, 4), (2, 1, 3, 2)]:
        x = random_array(rng, shape, dtype)
        assert_indices(jaxops.refresh(jaxops.nonzero(x)), ref_nonzero(x))


@pytest.mark.parametrize("shape", [(40000,), (150, 301), (6, 7, 9, 111)])
def test_large_inputs_take_the_blocked_path(shape):
    rng = np.random.default_rng(len(shape))
    x = random_array(rng, shape, np.float32)
    d = jax.jit(jaxops.nonzero)(x)
    assert_indices(jaxops.refresh(d), ref_nonzero(x))
    assert not bool(d.overflowed())


def test_onnxruntime_is_the_oracle():
    rng = np.random.default_rng(1)
    for shape, dtype in [((5,), np.float32), ((3, 4), np.int32), ((2, 3, 4), np.bool_),
                         ((2, 0, 3), np.float32), ((), np.float32), ((4, 1, 2, 3), np.int64)]:
        for _ in range(3):
            x = np.asarray(random_array(rng, shape, dtype))
            assert_indices(jaxops.refresh(jaxops.nonzero(x)), onnx_nonzero(x))


def test_nan_is_non_zero_and_negative_zero_is_zero():
    x = jnp.array([0.0, np.nan, -0.0, 1e-30, -np.inf])
    assert_indices(jaxops.refresh(jaxops.flatnonzero(x)), [1, 3, 4])


def test_scalars_follow_onnxruntime():
    assert_indices(jaxops.refresh(jaxops.nonzero(jnp.float32(3))), [[0]])
    chex.assert_shape(jaxops.refresh(jaxops.nonzero(jnp.float32(0))), (1, 0))
    assert_indices(jaxops.refresh(jaxops.argwhere(jnp.int32(2))), [[0]])


def test_empty_all_and_none_selected():
    chex.assert_shape(jaxops.refresh(jaxops.nonzero(jnp.zeros((2, 0, 3)))), (3, 0))
    x = jnp.ones((3, 4), bool)
    assert_indices(jaxops.refresh(jaxops.nonzero(x)), np.stack(np.nonzero(np.ones((3, 4)))))
    d = jaxops.nonzero(jnp.zeros((3, 4)))
    chex.assert_shape(jaxops.refresh(d), (2, 0))
    assert_indices(d.data, np.full((2, 12), -1))  # padding is -1


def test_capacity_exact_and_overflow_are_reported_inside_jit():
    x = np.array([[0, 1, 1], [1, 0, 1]])  # 4 non-zero
    f = jax.jit(lambda x, size: (lambda d: (d, d.overflowed(), d.lost()))(
        jaxops.nonzero(x, size=size)), static_argnums=1)
    d, over, lost = f(x, 4)
    assert_indices(jaxops.refresh(d), ref_nonzero(x))
    assert (not bool(over)) and int(lost) == 0
    d, over, lost = f(x, 3)
    assert_indices(jaxops.refresh(d, allow_truncated=True), ref_nonzero(x, 3))
    assert bool(over) and int(lost) == 2  # DynArray counts elements: 1 result x rank 2
    assert_indices(d.true_shape, [2, 4])
    chex.assert_shape(d.data, (2, 3))
    d, over, lost = f(x, 6)  # capacity above the maximum: padding only
    assert_indices(d.data[:, 4:], np.full((2, 2), -1))
    assert not bool(over)


def test_argwhere_and_flatnonzero_layouts():
    rng = np.random.default_rng(2)
    x = rng.integers(0, 2, (3, 4, 5))
    assert_indices(jaxops.refresh(jaxops.argwhere(x)), np.argwhere(x))
    with expected_truncation():
        rows = jaxops.argwhere(x, size=5, overflow="truncate")
        d = jaxops.flatnonzero(x, size=7, overflow="truncate")
    assert_indices(jaxops.refresh(rows, allow_truncated=True), np.argwhere(x)[:5])
    assert_indices(jaxops.refresh(d, allow_truncated=True), ref_flatnonzero(x, 7))
    assert int(d.lost()) == int(x.sum()) - 7


def test_vmap_over_masks_with_different_counts():
    rng = np.random.default_rng(3)
    masks = rng.random((5, 4, 6)) < np.linspace(0, 1, 5)[:, None, None]
    out = jaxops.refresh(jax.jit(jax.vmap(lambda m: jaxops.nonzero(m, size=10)))(masks),
                         allow_truncated=True)
    for got, m in zip(out, masks):
        assert_indices(got, ref_nonzero(m, 10))


def test_index_dtype_follows_x64():
    x = np.array([0, 2, 3])
    with jax.enable_x64(False):
        assert jaxops.nonzero(x).dtype == jnp.int32
        assert jaxops.get_op("NonZero").infer([x])[0].dtype.name == "INT32"
    with jax.enable_x64(True):
        d = jaxops.nonzero(x)
        assert d.dtype == jnp.int64
        assert_indices(jaxops.refresh(d), [[1, 2]])
        assert jaxops.get_op("NonZero").infer([x])[0].dtype.name == "INT64"


def test_launch_writes_the_outshape_words():
    x = np.array([[0, 5, 0], [7, 0, 9]], np.float32)
    t = np.zeros(9, np.int64)
    with expected_truncation():
        res = tracing.launch("NonZero", tracing.OP_INPUT(x), tracing.OP_ATTR(size=2),
                             tracing.OP_OUTSHAPE(t, 0))
    assert_indices(res.outputs[0], ref_nonzero(x, 2))
    assert t[:3].tolist() == [2, 2, 2]


def test_bad_inputs_name_the_operator_and_argument():
    with pytest.raises(OpArgumentError, match="NonZero: argument 'size'"):
        jaxops.nonzero(jnp.ones(3), size=-1)
    with pytest.raises(OpDTypeError, match="NonZero: argument 'x'"):
        jaxops.nonzero(np.array(["a", "b"]))
    with pytest.raises(OpArgumentError, match="NonZero: argument 'x'"):
        jaxops.nonzero([1, 0, 2])
