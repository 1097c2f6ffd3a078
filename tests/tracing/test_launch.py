"""tracing.args and tracing.launch: arg kinds, impl-mode selection, cache, OP_OUTSHAPE."""

import jax.numpy as jnp
import numpy as np
import pytest

import tracing
from jaxops import DynArray
from jaxops.core.errors import OpArgumentError, OpDTypeError, OutshapeError
from jaxops.core.impl_mode import OpExecMode, OpImplMode, impl_mode
import tests.helpers.cases.relu  # noqa: F401  (registers the test-only Relu op)
from tests.helpers.cases.positives import NAME as SELECT
from tracing import (OP_ATTR, OP_EMPTY, OP_INPUT, OP_MEMSET, OP_MODE, OP_OPTION, OP_OUTPUT,
                     OP_OUTSHAPE, OP_WORKSPACE, OpArgContext, OpArgKind, launch)


@pytest.fixture(autouse=True)
def fresh_cache():
    tracing.cache_clear()
    yield


def test_arg_kind_numbering():
    assert {k.name: int(k) for k in OpArgKind} == {
        "INPUT": 0, "OUTPUT": 1, "ATTR": 2, "WORKSPACE": 3, "OUTSHAPE": 4, "OPTION": 5,
        "EXEC_MODE": 6, "MEMSET": 7, "EMPTY": 8}


def test_context_collects_every_kind():
    t = np.zeros(18, np.int64)
    ctx = OpArgContext(OP_INPUT(1, 2), OP_INPUT(3), OP_OUTPUT("y"), OP_ATTR(a=1), OP_ATTR(b=2),
                       OP_WORKSPACE("w"), OP_MEMSET("m"), OP_OUTSHAPE((t, 0)), OP_OUTSHAPE(t, 1),
                       OP_OPTION("high_performance"), OP_MODE(OpExecMode.HF32), OP_EMPTY())
    assert ctx.inputs == [1, 2, 3] and ctx.outputs == ["y"] and ctx.attrs == {"a": 1, "b": 2}
    assert ctx.workspace == ["w"] and ctx.memset == ["m"]
    assert ctx.outshape == [(t, 0), (t, 1)]
    assert ctx.impl_mode is OpImplMode.HIGH_PERFORMANCE and ctx.exec_mode is OpExecMode.HF32


def test_outshape_pairs_must_share_one_tensor():
    with pytest.raises(OutshapeError, match="share one"):
        OpArgContext(OP_OUTSHAPE(np.zeros(9), 0), OP_OUTSHAPE(np.zeros(9), 1))
    with pytest.raises(OutshapeError, match="tensor, output_index"):
        OP_OUTSHAPE(np.zeros(9))
    with pytest.raises(OutshapeError, match=r"expected a shape tensor.*got list; pass np.asarray"):
        OP_OUTSHAPE([0] * 9, 0)  # a list: the kernel could not write into it


def test_option_combines_modes_and_rejects_non_args():
    assert OP_OPTION("high_precision", OpImplMode.KEEP_FP16).value == (
        OpImplMode.HIGH_PRECISION | OpImplMode.KEEP_FP16)
    with pytest.raises(TypeError, match="OP_INPUT"):
        OpArgContext(np.zeros(3))


def test_launch_static_op_and_cache_counts():
    x = jnp.array([-1.0, 2.0])
    r = launch("Relu", OP_INPUT(x), OP_ATTR(alpha=0.5))
    np.testing.assert_allclose(r.outputs[0], [-0.5, 2.0])
    assert r.outshape is None and r.backend == "xla" and not r.cache_hit
    assert r.impl_mode is OpImplMode.HIGH_PRECISION
    r2 = launch("Relu", OP_INPUT(x + 1), OP_ATTR(alpha=0.5))
    assert r2.cache_hit
    launch("Relu", OP_INPUT(x), OP_ATTR(alpha=0.25))          # new attrs: miss
    launch("Relu", OP_INPUT(jnp.zeros(3)), OP_ATTR(alpha=0.5))  # new aval: miss
    info = tracing.cache_info()
    assert (info.hits, info.misses, info.compiles, info.abandoned, info.size) == (1, 3, 3, 0, 3)


def test_launch_selects_impl_mode_and_keys_cache_on_it():
    x = jnp.array([-1.0, 2.0])
    fast = launch("Relu", OP_INPUT(x), OP_OPTION("high_performance"))
    assert fast.impl_mode is OpImplMode.HIGH_PERFORMANCE and not fast.cache_hit
    keep = launch("Relu", OP_INPUT(x), OP_OPTION("keep_fp16"))  # unsupported → high_precision
    assert keep.impl_mode is OpImplMode.HIGH_PRECISION and not keep.cache_hit
    with impl_mode("high_performance"):
        ctx_mode = launch("Relu", OP_INPUT(x))
    assert ctx_mode.impl_mode is OpImplMode.HIGH_PERFORMANCE and ctx_mode.cache_hit
    assert tracing.cache_info().compiles == 2


def test_exec_mode_is_part_of_the_key():
    x = jnp.array([1.0])
    launch("Relu", OP_INPUT(x))
    r = launch("Relu", OP_INPUT(x), OP_MODE(OpExecMode.HF32))
    assert not r.cache_hit and tracing.cache_info().compiles == 2


def test_launch_validates_before_tracing():
    with pytest.raises(OpDTypeError, match="Relu"):
        launch("Relu", OP_INPUT(jnp.array([1, 2])))
    with pytest.raises(OpArgumentError, match="inferred max shape"):
        launch("Relu", OP_INPUT(jnp.zeros(3)), OP_OUTPUT(np.zeros(4, np.float32)))
    assert tracing.cache_info().compiles == 0


def test_outshape_launch_refreshes_and_abandons():
    x = jnp.array([1.0, -2.0, 3.0, -4.0, 5.0])
    t = np.zeros(18, np.int64)
    r = launch(SELECT, OP_INPUT(x), OP_OUTSHAPE((t, 0)), OP_OUTSHAPE((t, 1)))
    np.testing.assert_array_equal(r.outputs[0], [1.0, 3.0, 5.0])
    np.testing.assert_array_equal(r.outputs[1], [0, 2, 4])
    np.testing.assert_array_equal(t, [1, 3] + [0] * 7 + [1, 3] + [0] * 7)  # written in place
    np.testing.assert_array_equal(r.outshape, t)
    np.testing.assert_array_equal(r.wire[0], [1.0, 3.0, 5.0, 0.0, 0.0])  # wire layout, max shape
    np.testing.assert_array_equal(r.wire[1], [0, 2, 4, -1, -1])
    r2 = launch(SELECT, OP_INPUT(-x), OP_OUTSHAPE((t, 0)), OP_OUTSHAPE((t, 1)))
    assert r2.cache_hit and r2.outputs[0].tolist() == [2.0, 4.0]
    info = tracing.cache_info()
    assert info.compiles == 1 and info.abandoned == 2


def test_outshape_only_some_outputs_and_uint64_flag():
    t = np.zeros(9, np.int64)
    r = launch(SELECT, OP_INPUT(jnp.array([1.0, 0.0])), OP_OUTSHAPE(t, 1), uint64_flag=True)
    assert t[0] == 0x80000001 and t[1] == 1
    assert r.outputs[1].tolist() == [0]
    assert isinstance(r.outputs[0], DynArray)  # not refreshed: stays a DynArray


@pytest.mark.parametrize("dtype", [np.int32, np.float32])
def test_outshape_other_dtypes(dtype):
    t = np.zeros(9, dtype)
    r = launch(SELECT, OP_INPUT(jnp.array([1.0, 2.0, 0.0])), OP_OUTSHAPE(t, 0))
    assert t.dtype == dtype and t[:2].tolist() == [1, 2] and r.outputs[0].tolist() == [1.0, 2.0]


def test_outshape_errors():
    with pytest.raises(OutshapeError, match="need 11"):  # 9 words, then the last's 1 + rank 1
        t = np.zeros(9, np.int64)
        launch(SELECT, OP_INPUT(jnp.ones(2)), OP_OUTSHAPE(t, 0), OP_OUTSHAPE(t, 1))
    with pytest.raises(OutshapeError, match="names output 7"):
        launch(SELECT, OP_INPUT(jnp.ones(2)), OP_OUTSHAPE(np.zeros(9, np.int64), 7))
    with pytest.raises(OutshapeError, match="Unsupported outshape dtype"):
        launch(SELECT, OP_INPUT(jnp.ones(2)), OP_OUTSHAPE(np.zeros(9, np.int16), 0))


@pytest.mark.parametrize("op, x, words, dtype", [
    ("NonZero", jnp.array([[0, 3], [5, 0], [0, 7]]), 3, np.int32),   # A2's NonZero: rank + 1
    ("MaskedSelect", None, 2, np.int64),                              # MaskedSelectV3: {2} int64
    ("NonZero", jnp.array([[0, 3], [5, 0], [0, 7]]), 9, np.uint64),  # uint64 read as int64
])
def test_outshape_tensor_variants_cann_kernels_use(op, x, words, dtype):
    """opbase's RefreshOutputShape reads 1 + rank words of a slot, from int32, int64,
    float32 (and uint64 as int64) tensors; CANN's kernels allocate just that (issue 40:
    launch refused the 3-word int32 tensor of A2's NonZero)."""
    t = np.zeros(words, dtype)
    inputs = (x,) if op == "NonZero" else (jnp.array([1.0, 2.0, 3.0]), jnp.array([True, False, True]))
    r = launch(op, OP_INPUT(*inputs), OP_OUTSHAPE(t, 0), uint64_flag=dtype == np.uint64)
    rank = 2 if op == "NonZero" else 1
    want = (2, 3) if op == "NonZero" else (2,)
    assert t[:1 + rank].astype(np.int64).tolist() == [rank | (0x80000000 if dtype == np.uint64 else 0), *want]
    assert r.outputs[0].shape == want and r.outshape.dtype == dtype and r.outshape.size == words
    assert tracing.outshape.decode(t) == [want]
    with pytest.raises(OutshapeError, match=f"need {1 + rank}"):
        launch(op, OP_INPUT(*inputs), OP_OUTSHAPE(np.zeros(rank, dtype), 0))


def test_data_dependent_launch_without_outshape_returns_dynarrays():
    r = launch(SELECT, OP_INPUT(jnp.array([1.0, -1.0])), OP_ATTR(size=1))
    assert isinstance(r.outputs[0], DynArray) and r.outshape is None
    assert tracing.cache_info().abandoned == 0


def _matmul_op():
    from jaxops.core.dtypes import FLOATING
    from jaxops.core.registry import Input, OpDef, Output, get_op, list_ops, register_op
    if "TestMatMul" in list_ops():
        return get_op("TestMatMul")
    op = register_op(OpDef(name="TestMatMul", inputs=[Input("a", FLOATING), Input("b", FLOATING)],
                           outputs=[Output("y", FLOATING)], doc="a @ b; registered by the tests"))
    op.kernel("xla")(lambda a, b: (a @ b,))
    return op


def test_hf32_exec_mode_compiles_with_lower_matmul_precision():
    from tracing import executor
    _matmul_op()
    a = jnp.ones((4, 4), jnp.float32)
    launch("TestMatMul", OP_INPUT(a), OP_INPUT(a))
    launch("TestMatMul", OP_INPUT(a), OP_INPUT(a), OP_MODE(OpExecMode.HF32))
    default, hf32 = (c.as_text() for c in executor._cache.values())
    assert "operand_precision" not in default  # XLA's default: the backend's fastest
    assert "operand_precision={high,high}" in hf32  # tensorfloat32 lowers to HIGH


@pytest.mark.x64_off
def test_x64_setting_is_part_of_the_key():
    import jax
    x = np.array([0, 3, 0, 5], np.int32)  # the same aval with x64 off and on
    narrow = launch("NonZero", OP_INPUT(x))
    with jax.enable_x64(True):
        wide = launch("NonZero", OP_INPUT(x))
    assert not wide.cache_hit and tracing.cache_info().compiles == 2
    assert narrow.outputs[0].data.dtype == np.int32 and wide.outputs[0].data.dtype == np.int64


def test_outshape_launch_reports_overflow_and_can_raise():
    import warnings
    from jaxops.core.errors import CapacityOverflowError
    from jaxops.errors import CapacityOverflowWarning
    x = np.array([0, 3, 0, 5, 7, 1], np.int32)  # 4 non-zeros
    shape = np.zeros(9, np.int64)
    fits = launch("NonZero", OP_INPUT(x), OP_ATTR(size=4), OP_OUTSHAPE((shape, 0)))
    assert fits.true_shapes == fits.actual_shapes == [(1, 4)] and not fits.overflowed
    with pytest.warns(CapacityOverflowWarning, match=r"NonZero: launch output 0 truncated"):
        cut = launch("NonZero", OP_INPUT(x), OP_ATTR(size=2), OP_OUTSHAPE((shape, 0)))
    assert cut.overflowed and cut.true_shapes == [(1, 4)] and cut.outputs[0].shape == (1, 2)
    with pytest.raises(CapacityOverflowError, match=r"NonZero: output of 4 results does not fit capacity 2"):
        launch("NonZero", OP_INPUT(x), OP_ATTR(size=2), OP_OUTSHAPE((shape, 0)), overflow="error")
    with pytest.raises(ValueError, match="launch: argument 'overflow'"):
        launch("NonZero", OP_INPUT(x), OP_OUTSHAPE((shape, 0)), overflow="expand")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no size attr: nothing to report
        assert not launch("NonZero", OP_INPUT(x), OP_OUTSHAPE((shape, 0))).overflowed
