"""The op registry: OpDef validation, inference, kernels per mode and backend, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxops.core.dtypes import DataType, FLOATING, INDEX
from jaxops.core.errors import (DuplicateOpError, KernelNotFoundError, MissingInputError,
                                OpArgumentError, OpDTypeError, UnknownAttrError, UnknownOpError)
from jaxops.core.impl_mode import OpImplMode, impl_mode
from jaxops.core.registry import (AttrDef, Input, OpDef, Output, get_op, list_ops, register_op,
                                  unregister_op)
from tests.helpers.cases.relu import RELU, relu


@pytest.fixture
def scratch_op():
    op = OpDef(
        name="ScratchGather",
        inputs=[Input("x", FLOATING), Input("indices", INDEX), Input("bias", FLOATING, "optional"),
                Input("extra", FLOATING, "dynamic")],
        outputs=[Output("y", FLOATING)],
        attrs=[AttrDef("axis", "int", 0), AttrDef("mode", "str", "clip", choices=("clip", "wrap")),
               AttrDef("scale", "float", 1.0, check=lambda s: s > 0, expected="a float > 0"),
               AttrDef("size", "int", None, optional=True), AttrDef("k", "int")],
        infer_shape=lambda ctx: [tuple(ctx.values["indices"].shape) + ctx.inputs[0].shape[1:]],
        value_depend=["indices"],
    )
    register_op(op)
    yield op
    unregister_op(op.name)


X = np.zeros((4, 3), np.float32)
I = np.array([0, 2], np.int32)


def test_check_fills_defaults_and_casts(scratch_op):
    inputs, attrs = scratch_op.check([X, I, None, []], {"k": np.int64(3), "scale": 2})
    assert inputs[2] is None
    assert attrs == {"axis": 0, "mode": "clip", "scale": 2.0, "size": None, "k": 3}
    assert type(attrs["k"]) is int and type(attrs["scale"]) is float


def test_missing_required_input(scratch_op):
    with pytest.raises(MissingInputError, match=r"ScratchGather: argument 'indices': expected a tensor"):
        scratch_op.check([X], {"k": 1})


def test_missing_required_attr(scratch_op):
    with pytest.raises(MissingInputError, match="argument 'k'"):
        scratch_op.check([X, I, None, []], {})


def test_dtype_outside_allowed_set(scratch_op):
    with pytest.raises(OpDTypeError) as e:
        scratch_op.check([X, I.astype(np.float32), None, []], {"k": 1})
    msg = str(e.value)
    assert "ScratchGather" in msg and "'indices'" in msg and "INT32, INT64" in msg and "float32" in msg
    assert isinstance(e.value, TypeError)


def test_dynamic_input_must_be_a_list(scratch_op):
    with pytest.raises(OpArgumentError, match="a list of tensors"):
        scratch_op.check([X, I, None, X], {"k": 1})
    with pytest.raises(OpDTypeError, match="'extra'"):
        scratch_op.check([X, I, None, [X, I]], {"k": 1})


def test_too_many_inputs(scratch_op):
    with pytest.raises(OpArgumentError, match="at most 4 inputs"):
        scratch_op.check([X, I, None, [], X], {"k": 1})


def test_unknown_attr_suggests_close_match(scratch_op):
    with pytest.raises(UnknownAttrError, match="Did you mean axis"):
        scratch_op.check([X, I, None, []], {"k": 1, "axes": 1})


@pytest.mark.parametrize("attrs, fragment", [
    ({"k": 1, "mode": "mirror"}, "one of 'clip', 'wrap'"),
    ({"k": 1, "scale": -1.0}, "a float > 0"),
    ({"k": 1, "axis": 1.5}, "expected int"),
    ({"k": True}, "expected int"),
    ({"k": 1, "size": "big"}, "int or None"),
])
def test_bad_attr_values(scratch_op, attrs, fragment):
    with pytest.raises(OpArgumentError, match=fragment) as e:
        scratch_op.check([X, I, None, []], attrs)
    assert isinstance(e.value, ValueError) and "ScratchGather" in str(e.value)


def test_infer_uses_value_dependent_input(scratch_op):
    (desc,) = scratch_op.infer([X, I, None, []], {"k": 1})
    assert desc.shape == (2, 3) and desc.dtype is DataType.FLOAT and desc.name == "y"


def test_registry_lookup_and_duplicates(scratch_op):
    assert get_op("ScratchGather") is scratch_op
    assert "ScratchGather" in list_ops() and list_ops() == sorted(list_ops())
    with pytest.raises(DuplicateOpError):
        register_op(OpDef(name="ScratchGather", inputs=[], outputs=[]))
    with pytest.raises(UnknownOpError, match="Did you mean: ScratchGather"):
        get_op("ScratchGathr")
    with pytest.raises(KeyError):
        get_op("NoSuchThing")


def test_relu_end_to_end():
    x = jnp.array([-2.0, 0.5, 3.0])
    np.testing.assert_allclose(relu(x, alpha=0.1), [-0.2, 0.5, 3.0], rtol=1e-6)
    np.testing.assert_allclose(jax.jit(relu)(x), [0.0, 0.5, 3.0])
    assert RELU.infer([x])[0].shape == (3,)
    with pytest.raises(OpDTypeError, match="Relu: argument 'x'"):
        relu(jnp.array([1, 2]))


def test_kernel_per_impl_mode():
    fast = RELU.get_kernel("xla", OpImplMode.HIGH_PERFORMANCE)
    precise = RELU.get_kernel("xla", OpImplMode.HIGH_PRECISION)
    assert fast is not precise
    assert RELU.select_mode(None) is OpImplMode.HIGH_PRECISION
    with impl_mode("high_performance"):
        assert RELU.select_mode(None) is OpImplMode.HIGH_PERFORMANCE
    assert RELU.select_mode("keep_fp16") is OpImplMode.HIGH_PRECISION
    with pytest.raises(OpArgumentError, match=r"Relu: argument 'impl_mode': expected one of "
                                              r"default, .*got 'fastest'"):
        RELU(np.ones(2, np.float32), impl_mode="fastest")
    with pytest.raises(KernelNotFoundError, match="no kernel for backend 'nowhere'"):
        RELU.get_kernel("nowhere", OpImplMode.HIGH_PRECISION)


def test_duplicate_kernel_raises(scratch_op):
    scratch_op.kernel("xla")(lambda *a, **k: None)
    with pytest.raises(DuplicateOpError):
        scratch_op.kernel("xla")(lambda *a, **k: None)


def test_summary_is_json_friendly():
    import json
    s = RELU.summary()
    assert json.loads(json.dumps(s))["attrs"][0] == {"name": "alpha", "type": "float", "default": 0.0,
                                                     "required": False, "accepts": "a float >= 0"}
    assert s["impl_modes"] == ["high_performance", "high_precision"] and s["backends"][0] == "xla"


def test_opdef_rejects_inconsistent_definitions():
    with pytest.raises(ValueError, match="unique"):
        OpDef(name="Bad", inputs=[Input("x", FLOATING)], outputs=[], attrs=[AttrDef("x", "int", 0)])
    with pytest.raises(ValueError, match="value_depend"):
        OpDef(name="Bad", inputs=[Input("x", FLOATING)], outputs=[], value_depend=["y"])
    with pytest.raises(ValueError, match="attr type"):
        AttrDef("a", "complex")
