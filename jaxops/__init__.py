"""jaxops: data-dependent-shape operators and embedding hash tables for JAX, CANN-style.

>>> import jax.numpy as jnp, jaxops
>>> jaxops.refresh(jaxops.DynArray(jnp.arange(4), [2])).tolist()
[0, 1]
"""

from jaxops.core.dtypes import DataType
from jaxops.core.dynarray import DynArray
from jaxops.core.formats import Format
from jaxops.core.impl_mode import OpExecMode, OpImplMode, impl_mode
from jaxops.core.refresh import refresh
from jaxops.core.registry import OpDef, get_op, list_ops, register_op
from jaxops.core.tensor_desc import TensorDesc

__version__ = "0.1.0"

__all__ = [
    "DataType", "DynArray", "Format", "OpDef", "OpExecMode", "OpImplMode", "TensorDesc",
    "get_op", "impl_mode", "list_ops", "refresh", "register_op",
]
