"""jaxops: data-dependent-shape operators and embedding hash tables for JAX, CANN-style.

``import jaxops`` is cheap: the library loads on the first use of a public name (every
operator, backend and kernel, then the check that no kernel was registered for a misspelt
operator), and a part imported directly (``jaxops.golden`` for ``jaxops golden``) loads
only what it needs (:mod:`jaxops.core.loading`).

>>> import jax.numpy as jnp, jaxops
>>> jaxops.refresh(jaxops.DynArray(jnp.arange(4), [2])).tolist()
[0, 1]
>>> jaxops.refresh(jaxops.nonzero(jnp.array([0, 7, 0, 9]))).tolist()
[[1, 3]]
"""

import importlib as _importlib

from jaxops.core import loading as _loading
from jaxops.core.version import VERSION as __version__

__all__ = [
    "DataType", "DynArray", "Format", "OpDef", "OpExecMode", "OpImplMode", "TensorDesc",
    "argwhere", "backends", "batched_nms", "capacity", "check_overflow", "efficient_nms",
    "flatnonzero", "get_op", "hashtable", "impl_mode", "list_ops", "masked_select", "nms",
    "non_max_suppression", "nonzero", "refresh", "register_op", "unique",
    "unique_consecutive", "use_backend",
]

#: Where each public name lives (the modules load with the library).
_HOMES = {
    "DataType": "jaxops.core.dtypes", "DynArray": "jaxops.core.dynarray",
    "Format": "jaxops.core.formats", "OpExecMode": "jaxops.core.impl_mode",
    "OpImplMode": "jaxops.core.impl_mode", "impl_mode": "jaxops.core.impl_mode",
    "refresh": "jaxops.core.refresh", "OpDef": "jaxops.core.registry",
    "get_op": "jaxops.core.registry", "list_ops": "jaxops.core.registry",
    "register_op": "jaxops.core.registry", "TensorDesc": "jaxops.core.tensor_desc",
    "use_backend": "jaxops.backends", "masked_select": "jaxops.ops.masked_select",
    "batched_nms": "jaxops.ops.nms", "efficient_nms": "jaxops.ops.nms", "nms": "jaxops.ops.nms",
    "non_max_suppression": "jaxops.ops.nms", "argwhere": "jaxops.ops.nonzero",
    "flatnonzero": "jaxops.ops.nonzero", "nonzero": "jaxops.ops.nonzero",
    "unique": "jaxops.ops.unique", "unique_consecutive": "jaxops.ops.unique",
    "check_overflow": "jaxops.capacity",
}
_SUBPACKAGES = ("backends", "capacity", "hashtable")


def _load() -> None:
    """Imports every operator, its host, Ascend and native kernels and the hash tables,
    binds the public names, then checks that no kernel named a misspelt operator."""
    for module in ("jaxops.ops", "jaxops.backends.host_kernels", "jaxops.backends.ascend_ops",
                   "jaxops.native"):
        _importlib.import_module(module)
    names = {name: getattr(_importlib.import_module(home), name) for name, home in _HOMES.items()}
    names.update({name: _importlib.import_module(f"{__name__}.{name}") for name in _SUBPACKAGES})
    globals().update(names)
    from jaxops.core.registry import check_pending
    check_pending()  # a kernel registered for a misspelt operator name fails the load


_loading.set_loader(_load)


# A public name loads the library on first use; another submodule (jaxops.golden,
# jaxops.cli) is imported alone.
__getattr__, __dir__ = _loading.lazy_attributes(
    __name__, {**_HOMES, **{n: f"{__name__}.{n}" for n in _SUBPACKAGES}}, globals(),
    before=_loading.load_all)
