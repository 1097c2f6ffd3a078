"""OP_OUTSHAPE in a launch: CANN's RefreshOutputShape over the wire format.

The format itself (encode, decode, host words; slot ``k`` = 9 words ``[rank, d0, …, d7]``)
lives in :mod:`jaxops.core.outshape_format` and is re-exported here, so
``tracing.outshape.encode`` and friends keep working.

>>> import numpy as np
>>> buf = encode([(2, 3), (5,)], dtype=np.int64)
>>> decode(buf)
[(2, 3), (5,)]
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np

from jaxops.core.errors import OutshapeError
from jaxops.core.outshape_format import (MAX_RANK, SLOT_WORDS, UINT64_FLAG, decode, encode,
                                         host_words, to_host_words)

__all__ = ["MAX_RANK", "SLOT_WORDS", "UINT64_FLAG", "decode", "encode", "host_words",
           "refresh_outputs", "to_host_words"]


def refresh_outputs(outputs: Sequence, outshape_args: Sequence[tuple]) -> list:
    """CANN's RefreshOutputShape: give outputs the shapes their kernel wrote.

    ``outshape_args`` are ``(shape_tensor, output_index)`` pairs sharing one tensor; pair
    ``k`` reads slot ``k`` and refreshes ``outputs[output_index]``: the buffer stays, its
    first ``numel`` elements (row-major, the wire layout) become the output. An index
    outside the outputs raises (CANN skips it silently). Returns a new list.

    >>> import numpy as np
    >>> t = encode([(2,), (1, 2), (3,)], dtype=np.int64)   # 27 words
    >>> outs = [np.arange(4), None, None, np.arange(6), np.arange(5)]
    >>> [o.tolist() for o in refresh_outputs(outs, [(t, 0), (t, 3), (t, 4)]) if o is not None]
    [[0, 1], [[0, 1]], [0, 1, 2]]
    """
    if not outshape_args:
        return list(outputs)
    tensor = outshape_args[0][0]
    if any(t is not tensor for t, _ in outshape_args):
        raise OutshapeError("refresh_outputs: every OP_OUTSHAPE pair must share one shape tensor")
    shapes = decode(tensor, count=len(outshape_args))
    result = list(outputs)
    for k, ((_, index), shape) in enumerate(zip(outshape_args, shapes)):
        if not 0 <= int(index) < len(outputs):
            raise OutshapeError(f"refresh_outputs: pair {k} names output {index}, but there are "
                                f"{len(outputs)} outputs")
        flat = np.asarray(jax.device_get(outputs[index])).reshape(-1)
        numel = int(np.prod(shape, dtype=np.int64))
        if numel > flat.size:
            raise OutshapeError(f"refresh_outputs: output {index} has {flat.size} elements, its "
                                f"refreshed shape {shape} needs {numel}")
        result[index] = flat[:numel].reshape(shape)
    return result
