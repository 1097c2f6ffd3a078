"""Numeric conventions shared by the operators' kernels on every backend.

The xla kernels (:mod:`jaxops.ops`) and the host kernels (:mod:`jaxops.backends`) must
compute in the same types and pad with the same values for their results to be identical;
both take them from here, so a backend never reaches up into the operators.

>>> import numpy as np
>>> compute_dtype(np.float16, np.float32)
dtype('float32')
>>> INDEX_FILL
-1
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

__all__ = ["INDEX_FILL", "compute_dtype"]

#: Padding of every index output (and of an index beyond the capacity) of the
#: data-dependent operators.
INDEX_FILL = -1


def compute_dtype(*dtypes) -> np.dtype:
    """The float type NMS arithmetic runs in: float32, or float64 for float64 inputs
    (with ``jax_enable_x64``; without it JAX has no float64 arrays).

    >>> compute_dtype(np.int32, np.float16)
    dtype('float32')
    """
    return jnp.promote_types(jnp.result_type(*dtypes), jnp.float32)
