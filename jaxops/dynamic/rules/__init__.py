"""The valid-region rules: one rule per kind of op, saying how the dynamic dims flow and
how the op reads only the valid region (masking with each reduction's identity).

This is XLA's dynamic-dimension inference (``dynamic_dimension_inference.cc``: a visitor
with a rule per op, and a padder that masks with the identity of each reduction) written
for :class:`~jaxops.dynamic.Tensor`. The ONNX front end (:mod:`jaxops.onnx`) calls these
rules, one per handler, and so can a Python program (:mod:`jaxops.dynamic` re-exports them,
taking and returning DynArrays). :data:`RULES` lists them by name. By kind of rule:

- ``_pointwise``: elementwise with broadcasting, ``expand``;
- ``_reductions``: reductions, arg-reductions, softmax, top-k (they read across an axis);
- ``_layout``: transpose, (un)squeeze, reshape, flatten, tile;
- ``_moves``: concat, slice, gathers and scatters (they move valid blocks);
- ``_rows``: ops over independent rows (``per_row``, ``by_rows``: cost follows the data),
  matmul.

The invariant: the padding of a Tensor is unspecified. Elementwise rules keep it so (no
work); a rule that reads across a dynamic axis masks first; a rule that moves elements
between positions (concat, reshape, gather) places the valid blocks where the leading-block
layout wants them.

>>> import jax.numpy as jnp
>>> from jaxops.dynamic.tensor import Tensor
>>> t = Tensor(jnp.array([[1.0, 2.0, 9.0], [3.0, 4.0, 9.0]]), [2, jnp.int32(2)])
>>> reduce(t, "max", axes=(1,), keepdims=False).data.tolist()
[2.0, 4.0]
>>> sorted(RULES)[:4]
['arg_reduce', 'by_rows', 'concat', 'elementwise']
"""

from jaxops.dynamic.rules._common import RULES, rule
from jaxops.dynamic.rules._layout import flatten, reshape, squeeze, tile, transpose, unsqueeze
from jaxops.dynamic.rules._moves import (concat, gather, gather_elements, gather_nd,
                                         scatter_elements, slice_axis)
from jaxops.dynamic.rules._pointwise import broadcast_dims, elementwise, expand
from jaxops.dynamic.rules._reductions import IDENTITIES, arg_reduce, reduce, softmax, top_k
from jaxops.dynamic.rules._rows import LADDER_START, by_rows, matmul, per_row

__all__ = [
    "IDENTITIES", "LADDER_START", "RULES", "arg_reduce", "broadcast_dims", "by_rows",
    "concat", "elementwise", "expand", "flatten", "gather", "gather_elements", "gather_nd",
    "matmul", "per_row", "reduce", "reshape", "rule", "scatter_elements", "slice_axis",
    "softmax", "squeeze", "tile", "top_k", "transpose", "unsqueeze",
]
