"""A small data-dependent operator registered only by the tests ("TestSelectPositive").

It keeps the strictly positive elements of a 1-D float array and their positions: two
data-dependent outputs, enough to exercise OP_OUTSHAPE launches with several pairs
independently of the real operators.
"""

import jax.numpy as jnp
import numpy as np

from jaxops.core.dtypes import DataType, FLOATING
from jaxops.core.dynarray import DynArray
from jaxops.core.impl_mode import OpImplMode
from jaxops.core.registry import AttrDef, Input, OpDef, Output, get_op, list_ops, register_op
from jaxops.ops.compaction import compact_indices
from tests.helpers.op_matrix import OpCase

NAME = "TestSelectPositive"

if NAME not in list_ops():
    SELECT_POSITIVE = register_op(OpDef(
        name=NAME,
        inputs=[Input("x", FLOATING)],
        outputs=[Output("values", FLOATING), Output("positions", {DataType.INT32})],
        attrs=[AttrDef("size", "int", None, optional=True)],
        infer_shape=lambda ctx: [(ctx.attrs["size"] or ctx.inputs[0].numel,)] * 2,
        infer_dtype=lambda ctx: [ctx.inputs[0].dtype, DataType.INT32],
        impl_modes=OpImplMode.HIGH_PRECISION,
        data_dependent=True,
        fill_values=[0, -1],
    ))

    @SELECT_POSITIVE.kernel("xla")
    def _select_positive(x, *, size):
        size = x.size if size is None else size
        idx, count = compact_indices(x.reshape(-1) > 0, size)
        n = jnp.minimum(count, size)
        values = jnp.where(idx >= 0, x.reshape(-1)[jnp.maximum(idx, 0)], 0)
        return (DynArray(values, [n], true_shape=[count], fill_value=0),
                DynArray(idx, [n], true_shape=[count], fill_value=-1))
else:
    SELECT_POSITIVE = get_op(NAME)


def select_positive(x, size=None):
    return SELECT_POSITIVE(x, size=size)


def _ref(x, size=None):
    pos = np.flatnonzero(x > 0)[:size].astype(np.int32)
    return x[pos], pos


CASES = [
    OpCase("select_positive", NAME, select_positive,
           lambda rng: (rng.standard_normal(7).astype(np.float32),), _ref,
           launch_outputs=lambda outs: tuple(outs)),
    OpCase("select_positive_size3", NAME, select_positive,
           lambda rng: (rng.standard_normal(9).astype(np.float32),), _ref, attrs={"size": 3},
           launch_outputs=lambda outs: tuple(outs)),
]
