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

import jaxops.ops  # noqa: E402,F401  (registers every operator)
import jaxops.backends.host_kernels  # noqa: E402,F401  (host kernels of those operators)
import jaxops.backends.ascend_ops  # noqa: E402,F401  (their Ascend aclnn kernels)
from jaxops.backends import use_backend  # noqa: E402

__version__ = "0.1.0"

# Public functions that live in operator modules, resolved on first access.
_LAZY_EXPORTS = {
    "nonzero": "jaxops.ops.nonzero",
    "argwhere": "jaxops.ops.nonzero",
    "flatnonzero": "jaxops.ops.nonzero",
    "unique": "jaxops.ops.unique",
    "unique_consecutive": "jaxops.ops.unique",
    "masked_select": "jaxops.ops.masked_select",
    "non_max_suppression": "jaxops.ops.nms",
    "nms": "jaxops.ops.nms",
    "batched_nms": "jaxops.ops.nms",
    "efficient_nms": "jaxops.ops.nms",
    "check_overflow": "tracing.overflow",
}


def __getattr__(name: str):
    module = _LAZY_EXPORTS.get(name)
    if module is None:
        if name == "hashtable":
            import importlib
            return importlib.import_module("jaxops.hashtable")
        raise AttributeError(f"module 'jaxops' has no attribute {name!r}")
    import importlib
    return getattr(importlib.import_module(module), name)

__all__ = [
    "DataType", "DynArray", "Format", "OpDef", "OpExecMode", "OpImplMode", "TensorDesc",
    "get_op", "impl_mode", "list_ops", "refresh", "register_op", "use_backend",
]
