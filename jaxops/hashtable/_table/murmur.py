"""MurmurHash3 x86_32 of 8-byte keys, vectorised with uint32 arithmetic.

CANN's hash kernels (``hashtable_common.h``) hash each int64 key's 8 little-endian bytes with
MurmurHash3 x86_32, seed 0, and take the result modulo the bucket count. Here a key is its
two little-endian 32-bit words ``(lo, hi)``, so the same code runs with ``jax_enable_x64``
off and on; uint32 multiplication wraps exactly like the C code.

>>> import numpy as np, jax.numpy as jnp
>>> lo, hi = jnp.array([0, 1], jnp.uint32), jnp.array([0, 0], jnp.uint32)
>>> [hex(int(h)) for h in murmur3_x86_32(lo, hi)]
['0x63852afc', '0x53075d44']
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

_C1 = np.uint32(0xCC9E2D51)
_C2 = np.uint32(0x1B873593)
_N = np.uint32(0xE6546B64)
_F1 = np.uint32(0x85EBCA6B)
_F2 = np.uint32(0xC2B2AE35)
_KEY_BYTES = np.uint32(8)


def _rotl(x: jax.Array, r: int) -> jax.Array:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _mix(h: jax.Array, k: jax.Array) -> jax.Array:
    k = _rotl(k * _C1, 15) * _C2
    return _rotl(h ^ k, 13) * np.uint32(5) + _N


def murmur3_x86_32(lo: jax.Array, hi: jax.Array, seed=0) -> jax.Array:
    """MurmurHash3 x86_32 of the 8 bytes ``lo`` (LE) then ``hi`` (LE); uint32, same shape.

    ``seed`` may be a traced uint32 scalar (the in-batch deduplication rehashes with it).
    """
    h = jnp.broadcast_to(jnp.asarray(seed, jnp.uint32), jnp.shape(lo))
    h = _mix(_mix(h, lo.astype(jnp.uint32)), hi.astype(jnp.uint32))
    h = h ^ _KEY_BYTES
    h = (h ^ (h >> np.uint32(16))) * _F1
    h = (h ^ (h >> np.uint32(13))) * _F2
    return h ^ (h >> np.uint32(16))


def home_slot(lo: jax.Array, hi: jax.Array, bucket_size: int) -> jax.Array:
    """A key's first slot: ``murmur3_x86_32(key) % bucket_size`` as int32 (as CANN computes it,
    on the unsigned hash)."""
    return (murmur3_x86_32(lo, hi) % np.uint32(bucket_size)).astype(jnp.int32)
