"""The ``host`` backend: numpy kernels of the built-in operators.

Each function takes numpy inputs and the operator's attrs and returns every output at its
exact shape, as if capacity were unlimited; :func:`jaxops.backends.callback.host_kernel`
lays them into the ``xla`` kernel's max-shape structure and reaches them from jit through
``jax.pure_callback``. Importing this module (``import jaxops`` does) registers a
``host`` kernel on every operator listed in :data:`KERNELS` that is registered.

>>> import jax.numpy as jnp, jaxops
>>> out = jaxops.get_op("BatchedNMS")(jnp.array([[0, 0, 2, 2], [0, 0, 2, 2.1]]),
...                                   jnp.array([0.9, 0.8]), jnp.array([0, 0]),
...                                   iou_threshold=0.5, backend="host")
>>> jaxops.refresh(out[0]).tolist()
[0]
"""

from __future__ import annotations

from jaxops.backends import host_index, host_nms
from jaxops.backends.callback import host_kernel
from jaxops.core.registry import get_op, list_ops

#: operator name -> numpy function
KERNELS = {
    **host_index.KERNELS,
    **host_nms.KERNELS,
}


def register() -> list[str]:
    """Registers the host kernels of the operators that exist; returns their names."""
    done = []
    for name, fn in KERNELS.items():
        if name in list_ops() and not get_op(name).has_kernel("host"):
            op = get_op(name)
            op.kernel("host")(host_kernel(op, fn))
            done.append(name)
    return done


register()
