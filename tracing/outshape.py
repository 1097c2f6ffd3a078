"""CANN's OP_OUTSHAPE wire format: the actual shapes of several outputs in one tensor.

Slot ``k`` of the 1-D tensor is 9 words ``[rank, d0, …, d7]`` (unused words 0). The tensor's
dtype is float32, int32 or int64. A kernel writing 64-bit shape data sets bit 31 of the
rank word (``0x80000000``); the decoder masks it off.

>>> import numpy as np
>>> buf = encode([(2, 3), (5,)], dtype=np.int64)
>>> np.asarray(buf).reshape(2, 9)[:, :3].tolist()
[[2, 2, 3], [1, 5, 0]]
>>> decode(buf)
[(2, 3), (5,)]

**x64 off.** JAX cannot hold int64 when ``jax_enable_x64`` is off. There, ``encode(...,
dtype=int64)`` returns the same word values in a ``uint32`` array (every word is
non-negative and below 2**32, so nothing changes); :func:`to_host_words` turns it into the
int64 tensor a CANN kernel writes, on the host side of the boundary, and :func:`decode`
accepts that uint32 carrier as int64 words.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.core.errors import OutshapeError

MAX_RANK = 8
SLOT_WORDS = 1 + MAX_RANK
UINT64_FLAG = 0x80000000
_RANK_MASK_64 = 0xFFFFFFFF7FFFFFFF
_INDIVIDUAL_RANK_MASK = 0x7F
_DTYPES = (np.dtype(np.float32), np.dtype(np.int32), np.dtype(np.int64))


def _check_dtype(dtype) -> np.dtype:
    dt = np.dtype(dtype)
    if dt not in _DTYPES:
        raise OutshapeError(f"Unsupported outshape dtype {dt}: expected float32, int32 or int64")
    return dt


def _x64() -> bool:
    return bool(jax.config.jax_enable_x64)


def encode(shapes: Sequence, dtype=np.int64, uint64_flag: bool = False) -> jax.Array:
    """Packs ``shapes`` into one OP_OUTSHAPE tensor of ``9 * len(shapes)`` words (jittable).

    Each shape is a sequence of dims or a 1-D int array (traced values allowed; the rank is
    its static length). Rank above 8 raises. With ``uint64_flag`` the rank word carries bit
    31. With x64 off an int64 request gives uint32 words (see the module docstring).
    """
    dt = _check_dtype(dtype)
    if uint64_flag and dt != np.int64:
        raise OutshapeError(f"encode: the uint64 rank flag needs an int64 tensor, got {dt}")
    word_dtype = {np.dtype(np.float32): jnp.float32, np.dtype(np.int32): jnp.int32}.get(
        dt, jnp.int64 if _x64() else jnp.uint32)
    slots = []
    for k, shape in enumerate(shapes):
        dims = list(shape) if isinstance(shape, (list, tuple)) else \
            [shape[i] for i in range(jnp.shape(shape)[0])]
        if len(dims) > MAX_RANK:
            raise OutshapeError(f"encode: shape {k} has rank {len(dims)}; OP_OUTSHAPE holds at "
                                f"most {MAX_RANK} dims")
        rank = len(dims) | (UINT64_FLAG if uint64_flag else 0)
        words = [jnp.asarray(rank, word_dtype)] + [jnp.asarray(d).astype(word_dtype) for d in dims]
        words += [jnp.zeros((), word_dtype)] * (MAX_RANK - len(dims))
        slots.append(jnp.stack(words))
    if not slots:
        return jnp.zeros((0,), word_dtype)
    return jnp.concatenate(slots)


def to_host_words(buffer, dtype=np.int64) -> np.ndarray:
    """The shape tensor as a numpy array of ``dtype`` (widens uint32 words from x64-off
    encoding to int64 exactly)."""
    dt = _check_dtype(dtype)
    host = np.asarray(jax.device_get(buffer))
    if host.dtype == np.uint32 and dt == np.int64:
        return host.astype(np.int64)
    return host.astype(dt, copy=False)


def decode(buffer, count: int | None = None, *, individual: bool = False) -> list[tuple[int, ...]]:
    """Reads the shapes out of an OP_OUTSHAPE tensor (host side).

    ``count`` limits the number of slots (default: all ``len // 9``). A rank word ≤ 0 gives a
    scalar shape and a warning; for int64 tensors the uint64 flag (bit 31) is masked off.
    ``individual=True`` reads the single-op-kernel variant: uint64 words, rank = word & 0x7F.
    """
    buf = np.asarray(jax.device_get(buffer))
    if buf.ndim != 1:
        raise OutshapeError(f"decode: expected a 1-D shape tensor, got shape {buf.shape}")
    if individual:
        if buf.dtype not in (np.dtype(np.int64), np.dtype(np.uint64)):
            raise OutshapeError(f"Unsupported outshape dtype {buf.dtype} for the individual "
                                "(uint64) variant: expected int64 or uint64")
        words = buf.view(np.uint64)
    else:
        if buf.dtype == np.uint32:  # int64 words carried as uint32 with x64 off (see encode)
            buf = buf.astype(np.int64)
        _check_dtype(buf.dtype)
        words = buf
    slots = len(words) // SLOT_WORDS if count is None else int(count)
    if slots * SLOT_WORDS > len(words) or slots < 0:
        raise OutshapeError(f"decode: {slots} slots need {slots * SLOT_WORDS} words, the tensor "
                            f"has {len(words)}")
    shapes = []
    for k in range(slots):
        slot = words[k * SLOT_WORDS:(k + 1) * SLOT_WORDS]
        if individual:
            rank = int(slot[0]) & _INDIVIDUAL_RANK_MASK
        else:
            rank = int(slot[0])
            if rank <= 0:
                warnings.warn(f"OP_OUTSHAPE slot {k} has rank word {rank}; decoding it as a "
                              "scalar shape", stacklevel=2)
                shapes.append(())
                continue
            if buf.dtype == np.int64:
                rank &= _RANK_MASK_64
        if rank > MAX_RANK:
            raise OutshapeError(f"decode: slot {k} has rank {rank}; OP_OUTSHAPE holds at most "
                                f"{MAX_RANK} dims")
        shapes.append(tuple(int(d) for d in slot[1:1 + rank]))
    return shapes


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
