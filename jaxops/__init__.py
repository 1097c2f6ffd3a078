"""jaxops: data-dependent-shape operators and embedding hash tables for JAX, CANN-style.

>>> import jax.numpy as jnp, jaxops
>>> jaxops.refresh(jaxops.DynArray(jnp.arange(4), [2])).tolist()
[0, 1]
>>> jaxops.refresh(jaxops.nonzero(jnp.array([0, 7, 0, 9]))).tolist()
[[1, 3]]
"""

from jaxops.core.dtypes import DataType
from jaxops.core.dynarray import DynArray
from jaxops.core.formats import Format
from jaxops.core.impl_mode import OpExecMode, OpImplMode, impl_mode
from jaxops.core.refresh import refresh
from jaxops.core.registry import OpDef, get_op, list_ops, register_op
from jaxops.core.tensor_desc import TensorDesc

import jaxops.ops  # noqa: E402,F401  (registers every operator)
import jaxops.backends.host_kernels  # noqa: E402,F401  (host kernels of those operators)
import jaxops.backends.ascend_ops  # noqa: E402,F401  (their Ascend aclnn kernels)
import jaxops.native  # noqa: E402,F401  (their native C++ FFI kernels)
from jaxops import backends, capacity, hashtable  # noqa: E402,F401
from jaxops.backends import use_backend  # noqa: E402
from jaxops.ops.masked_select import masked_select  # noqa: E402
from jaxops.ops.nms import batched_nms, efficient_nms, nms, non_max_suppression  # noqa: E402
from jaxops.ops.nonzero import argwhere, flatnonzero, nonzero  # noqa: E402
from jaxops.ops.unique import unique, unique_consecutive  # noqa: E402
from jaxops.capacity import check_overflow  # noqa: E402
from jaxops.core.registry import check_pending  # noqa: E402

check_pending()  # a kernel registered for a misspelt operator name fails the import

from jaxops.core.version import VERSION as __version__  # noqa: E402

__all__ = [
    "DataType", "DynArray", "Format", "OpDef", "OpExecMode", "OpImplMode", "TensorDesc",
    "argwhere", "backends", "batched_nms", "capacity", "check_overflow", "efficient_nms",
    "flatnonzero", "get_op", "hashtable", "impl_mode", "list_ops", "masked_select", "nms",
    "non_max_suppression", "nonzero", "refresh", "register_op", "unique",
    "unique_consecutive", "use_backend",
]
