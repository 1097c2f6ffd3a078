"""A tiny non-dynamic operator registered only for the tests: proves the registry path."""

import jax.numpy as jnp
import numpy as np

from jaxops.core.dtypes import FLOATING
from jaxops.core.impl_mode import OpImplMode
from jaxops.core.registry import AttrDef, Input, OpDef, Output, get_op, list_ops, register_op
from tests.helpers.op_matrix import OpCase

if "Relu" not in list_ops():
    RELU = register_op(OpDef(
        name="Relu",
        inputs=[Input("x", FLOATING)],
        outputs=[Output("y", FLOATING)],
        attrs=[AttrDef("alpha", "float", 0.0, check=lambda a: a >= 0, expected="a float >= 0")],
        infer_shape=lambda ctx: [ctx.inputs[0].shape],
        impl_modes=OpImplMode.HIGH_PRECISION | OpImplMode.HIGH_PERFORMANCE,
        doc="max(x, alpha * x); registered by the tests only",
    ))

    @RELU.kernel("xla")
    def _relu(x, *, alpha):
        return (jnp.where(x > 0, x, alpha * x),)

    @RELU.kernel("xla", modes=OpImplMode.HIGH_PERFORMANCE)
    def _relu_fast(x, *, alpha):  # same maths; exists to prove per-mode kernel selection
        return (jnp.maximum(x, alpha * x),)
else:
    RELU = get_op("Relu")


def relu(x, alpha=0.0, **kw):
    return RELU(x, alpha=alpha, **kw)[0]


def _ref(x, alpha=0.0):
    return np.where(x > 0, x, alpha * x)


CASES = [
    OpCase("relu", "Relu", relu, lambda rng: (rng.standard_normal((3, 4)).astype(np.float32),),
           _ref, attrs={"alpha": 0.1}, grad_argnums=(0,),
           grad_reference=lambda x, ct, alpha: [np.where(x > 0, 1.0, alpha) * ct],
           rtol=1e-6),
]
