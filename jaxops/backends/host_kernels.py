"""The ``host`` backend: numpy kernels of the built-in operators.

Each function takes numpy inputs and the operator's attrs and returns every output at its
exact shape, as if capacity were unlimited; :func:`jaxops.backends.callback.host_kernel`
lays them into the ``xla`` kernel's max-shape structure and reaches them from jit through
``jax.pure_callback``. Each kernel registers itself by operator name with
:func:`~jaxops.backends.callback.host_kernel_for` next to its definition (in
:mod:`~jaxops.backends.host_index` and :mod:`~jaxops.backends.host_nms`); importing this
module (``import jaxops`` does) imports them.

>>> import jax.numpy as jnp, jaxops
>>> out = jaxops.get_op("BatchedNMS")(jnp.array([[0, 0, 2, 2], [0, 0, 2, 2.1]]),
...                                   jnp.array([0.9, 0.8]), jnp.array([0, 0]),
...                                   iou_threshold=0.5, backend="host")
>>> jaxops.refresh(out[0]).tolist()
[0]
"""

from __future__ import annotations

from jaxops.backends import host_index, host_nms  # noqa: F401  (their decorators register)
from jaxops.backends.callback import HOST_KERNELS

#: operator name -> numpy function
KERNELS = HOST_KERNELS

__all__ = ["KERNELS"]
