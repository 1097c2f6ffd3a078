"""Checksums of saved arrays, computed where the arrays are (on the device) and additive over
pieces, so that a checkpoint can be checked chunk by chunk on restore.

An array is a sequence of 32-bit **words**: its elements in row-major order, each element's
bits zero-extended to 32 (bool, 8 and 16-bit types), as they are (32-bit types), or as two
words, low first (64-bit types; complex numbers as their real and imaginary parts; PRNG keys
by their key data). Word ``k`` (its position, modulo 2**32) contributes
``h = fmix32(w ^ (k * 0x9E3779B9))`` (MurmurHash3's finaliser) to two sums modulo 2**32:
``sum(h)`` and ``sum(h * (k | 1))``. The pair, as 16 hex digits, is the checksum. It
changes with any changed word (a flipped bit), with words that moved (rows swapped, a file
from another checkpoint) and with words missing or zero-filled (a truncated file), except by
a chance of about 2**-64; it is not a defence against a forger who recomputes it.

Because both sums are sums over words, the checksum of an array is the sum of its pieces'
checksums, each piece computed with the position of its first word (``base``): that is how
a restore checks a table read chunk by chunk. Costs one pass over the data, fused (no
temporary): 20-45 ms per 256 MiB on this 2-core XLA:CPU machine.

>>> import numpy as np, jax.numpy as jnp
>>> x = np.arange(12, dtype=np.float32).reshape(3, 4)
>>> whole = host_sums(x)
>>> pieces = (np.asarray(chunk_sums(jnp.asarray(x[:1]), 0))
...           + np.asarray(chunk_sums(jnp.asarray(x[1:]), 4))).astype(np.uint32)
>>> hex_sums(whole) == hex_sums(pieces) == hex_sums(np.asarray(array_sums([jnp.asarray(x)])[0]))
True
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = ["add_sums", "array_sums", "chunk_sums", "hex_sums", "host_sums", "shard_sums",
           "words_per_element"]

_GOLDEN = 0x9E3779B9


def words_per_element(dtype) -> int:
    """Words per element of a numeric ``dtype`` (see the module docstring).

    >>> words_per_element(np.uint8), words_per_element(np.float64), words_per_element(np.complex64)
    (1, 2, 2)
    """
    return max(1, np.dtype(dtype).itemsize // 4)


def _fmix(h):
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def _words(x: jax.Array) -> jax.Array:
    """The words of ``x`` (uint32), one trailing axis of 2 for 64-bit elements."""
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        x = jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1)
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint32)
    bits = x.dtype.itemsize * 8
    if bits < 32:
        return lax.bitcast_convert_type(x, jnp.dtype(f"uint{bits}")).astype(jnp.uint32)
    return lax.bitcast_convert_type(x, jnp.uint32)


def _position(shape: tuple[int, ...], base) -> jax.Array:
    """The word position (uint32, wrapping) of every word of an array of ``shape``."""
    pos = jnp.asarray(base, jnp.uint32)
    stride = 1
    for axis in range(len(shape) - 1, -1, -1):
        pos = pos + lax.broadcasted_iota(jnp.uint32, shape, axis) * jnp.uint32(stride % 2**32)
        stride *= shape[axis]
    return pos


def _sums(x: jax.Array, base, axes, skip=None) -> jax.Array:
    w = _words(x)
    k = _position(w.shape, base)
    h = _fmix(w ^ (k * jnp.uint32(_GOLDEN)))
    if skip is not None:  # leave out the first ``skip`` words (they were summed before)
        h = jnp.where(k - jnp.asarray(base, jnp.uint32) >= jnp.asarray(skip, jnp.uint32), h,
                      jnp.uint32(0))
    axes = tuple(range(w.ndim)) if axes is None else axes
    zero = jnp.uint32(0)
    # One variadic reduction: XLA fuses the words' hashing into it (nothing of the array's
    # size is materialised; two separate sums kept ``h``: +1x the array, 8x slower).
    a, b = lax.reduce((h, h * (k | jnp.uint32(1))), (zero, zero),
                      lambda p, q: (p[0] + q[0], p[1] + q[1]), axes)
    return jnp.stack([a, b], axis=-1)


@jax.jit
def chunk_sums(x: jax.Array, base: jax.Array | int, skip: jax.Array | int = 0) -> jax.Array:
    """uint32 ``[2]``: the checksum of ``x`` but its first ``skip`` words, ``x`` a piece
    starting at word ``base``."""
    return _sums(x, base, None, skip)


def _many(arrays: tuple, zero: jax.Array) -> tuple:
    # ``zero`` is an argument, not a constant, so that no position array is ever folded.
    return tuple(_sums(x, zero, None) for x in arrays)


def array_sums(arrays: Sequence[jax.Array]) -> list[jax.Array]:
    """The checksum (uint32 ``[2]``) of each array, in one jitted call (the arrays share
    their devices), replicated on them so that every process can read it; dispatched, not
    waited for."""
    if not arrays:
        return []
    return list(_whole(_devices(arrays[0]))(tuple(arrays), np.uint32(0)))


def shard_sums(arrays: Sequence[jax.Array], mesh: jax.sharding.Mesh, axis: str
               ) -> list[jax.Array]:
    """For arrays with a leading axis laid along ``mesh``'s ``axis`` (a sharded table's):
    uint32 ``[shards, 2]``, the checksum of each shard's slice positioned in the whole
    array (their sum is the whole's checksum). Each device sums its own slices."""
    if not arrays:
        return []
    return list(_per_shard(mesh, axis)(tuple(arrays)))


def _devices(x: jax.Array) -> tuple:
    return tuple(sorted(x.sharding.device_set, key=lambda d: d.id))


def _replicated_on(mesh: jax.sharding.Mesh):
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())


@functools.lru_cache(maxsize=32)
def _whole(devices: tuple):
    if len(devices) == 1:
        return jax.jit(_many)
    return jax.jit(_many, out_shardings=_replicated_on(jax.sharding.Mesh(np.array(devices),
                                                                         ("all",))))


@functools.lru_cache(maxsize=32)
def _per_shard(mesh: jax.sharding.Mesh, axis: str):
    spec = jax.sharding.PartitionSpec(axis)

    def local(arrays):
        # A full reduction per leading row (one row per device, usually): XLA fuses those;
        # a reduction that keeps an axis materialised the hashed words (+1x the array).
        out = []
        for x in arrays:
            rows = x.shape[0]
            stride = int(np.prod(x.shape[1:])) * words_per_element(x.dtype)
            first = jax.lax.axis_index(axis) * rows
            out.append(jnp.stack([
                _sums(x[j], ((first + j) * stride).astype(jnp.uint32), None)
                for j in range(rows)]))
        return tuple(out)

    mapped = jax.shard_map(local, mesh=mesh, in_specs=(spec,), out_specs=spec)
    return jax.jit(mapped, out_shardings=_replicated_on(mesh))


def host_sums(x: np.ndarray, base: int = 0) -> np.ndarray:
    """:func:`chunk_sums` of a host array in numpy (numpy leaves, scalars, small pieces)."""
    x = np.asarray(x)
    if np.iscomplexobj(x):
        x = np.stack([x.real, x.imag], axis=-1)
    if x.dtype == np.bool_:
        w = x.astype(np.uint32)
    elif x.dtype.itemsize < 4:
        w = x.view(f"uint{x.dtype.itemsize * 8}").astype(np.uint32)
    else:
        w = np.ascontiguousarray(x).view(np.uint32)
    w = w.reshape(-1)
    k = (np.arange(w.size, dtype=np.uint64) + np.uint64(base)).astype(np.uint32)
    with np.errstate(over="ignore"):
        h = w ^ (k * np.uint32(_GOLDEN))
        h ^= h >> np.uint32(16)
        h *= np.uint32(0x85EBCA6B)
        h ^= h >> np.uint32(13)
        h *= np.uint32(0xC2B2AE35)
        h ^= h >> np.uint32(16)
        return np.array([h.sum(dtype=np.uint32), (h * (k | np.uint32(1))).sum(dtype=np.uint32)],
                        np.uint32)


def add_sums(*sums) -> np.ndarray:
    """The checksum of pieces given their checksums (uint32 ``[..., 2]`` each, summed over
    every leading axis)."""
    total = np.zeros(2, np.uint64)
    for s in sums:
        total += np.asarray(s, np.uint64).reshape(-1, 2).sum(axis=0)
    return (total % 2**32).astype(np.uint32)


def hex_sums(sums) -> str:
    """A checksum (uint32 ``[2]``) as 16 hex digits."""
    a, b = (int(v) for v in np.asarray(sums, np.uint32).reshape(2))
    return f"{a:08x}{b:08x}"
