"""CANN's OP_OUTSHAPE wire format: the actual shapes of several outputs in one tensor.

Slot ``k`` of the 1-D tensor is 9 words ``[rank, d0, …, d7]`` (unused words 0). The tensor's
dtype is float32, int32 or int64. A kernel writing 64-bit shape data sets bit 31 of the
rank word (``0x80000000``); the decoder masks it off. This module is the format alone
(encode, decode, host words); launching and refreshing outputs live in :mod:`tracing`.

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

__all__ = ["MAX_RANK", "SLOT_WORDS", "UINT64_FLAG", "decode", "encode", "host_words",
           "to_host_words"]

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

    Args:
      shapes: one shape per output slot.
      dtype: the shape tensor's dtype (float32, int32 or int64).
      uint64_flag: set bit 31 of each rank word (int64 only).

    Returns:
      The 1-D shape tensor.

    Examples:
      >>> import numpy as np
      >>> hex(int(encode([(4,)], np.int64, uint64_flag=True)[0]))
      '0x80000001'
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


def host_words(shapes: Sequence, dtype=np.int64, uint64_flag: bool = False) -> np.ndarray:
    """:func:`encode` on the host: the same words as a numpy array of ``dtype``, for
    shapes known on the host (golden files), without a JAX computation.

    Examples:
      >>> import numpy as np
      >>> host_words([(2, 3)], np.int64, uint64_flag=True)[:3].tolist()
      [2147483650, 2, 3]
      >>> bool((host_words([(2, 3)]) == to_host_words(encode([(2, 3)]))).all())
      True
    """
    dt = _check_dtype(dtype)
    if uint64_flag and dt != np.int64:
        raise OutshapeError(f"host_words: the uint64 rank flag needs an int64 tensor, got {dt}")
    words = np.zeros(SLOT_WORDS * len(shapes), dt)
    for k, shape in enumerate(shapes):
        dims = [int(d) for d in shape]
        if len(dims) > MAX_RANK:
            raise OutshapeError(f"host_words: shape {k} has rank {len(dims)}; OP_OUTSHAPE holds "
                                f"at most {MAX_RANK} dims")
        words[k * SLOT_WORDS] = len(dims) | (UINT64_FLAG if uint64_flag else 0)
        words[k * SLOT_WORDS + 1:k * SLOT_WORDS + 1 + len(dims)] = dims
    return words


def to_host_words(buffer, dtype=np.int64) -> np.ndarray:
    """The shape tensor as a numpy array of ``dtype``.

    Widens the uint32 words of x64-off encoding to int64 exactly.

    Args:
      buffer: a shape tensor from :func:`encode` (device or host).
      dtype: the host dtype (float32, int32 or int64).

    Returns:
      A numpy array of ``dtype``.

    Examples:
      >>> import numpy as np
      >>> to_host_words(encode([(3,)]), np.int64)[:2].tolist()
      [1, 3]
    """
    dt = _check_dtype(dtype)
    host = np.asarray(jax.device_get(buffer))
    if host.dtype == np.uint32 and dt == np.int64:
        return host.astype(np.int64)
    return host.astype(dt, copy=False)


def decode(buffer, count: int | None = None, *, individual: bool = False) -> list[tuple[int, ...]]:
    """Reads the shapes out of an OP_OUTSHAPE tensor (host side).

    A rank word ≤ 0 gives a scalar shape and a warning; for int64 tensors the uint64 flag
    (bit 31) is masked off (uint64 tensors are read as int64, as opbase does). The last slot
    may stop after its dims (``1 + rank`` words: A2's NonZero writes 3 int32 words).

    Args:
      buffer: the shape tensor.
      count: the number of slots to read (default: every slot begun, ``ceil(len / 9)``).
      individual: read the single-op-kernel variant: uint64 words, rank = word & 0x7F.

    Returns:
      One shape tuple per slot.

    Examples:
      >>> import numpy as np
      >>> decode(np.array([0x80000002, 2, 3, 0, 0, 0, 0, 0, 0], np.int64))
      [(2, 3)]
      >>> decode(np.array([2, 5, 3], np.int32))   # the short variant of A2's NonZero
      [(5, 3)]
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
        elif buf.dtype == np.uint64:  # opbase reads uint64 shape words as int64
            buf = buf.view(np.int64)
        _check_dtype(buf.dtype)
        words = buf
    slots = -(-len(words) // SLOT_WORDS) if count is None else int(count)
    if (slots - 1) * SLOT_WORDS >= len(words) and slots > 0 or slots < 0:
        raise OutshapeError(f"decode: {slots} slots need at least {(slots - 1) * SLOT_WORDS + 1} "
                            f"words, the tensor has {len(words)}")
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
        if len(slot) < 1 + rank:
            raise OutshapeError(f"decode: slot {k} has rank {rank} but {len(slot) - 1} dim words")
        shapes.append(tuple(int(d) for d in slot[1:1 + rank]))
    return shapes
