"""MurmurHash3 x86_32 and the accepted key forms."""

import struct

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxops.hashtable as ht
from jaxops.errors import OpDTypeError
from tests.helpers.hashtable_reference import key_hash, murmur3_32

# Published MurmurHash3_x86_32 vectors (SMHasher / the reference implementation's users).
VECTORS = [
    (b"", 0, 0x00000000), (b"", 1, 0x514E28B7), (b"", 0xFFFFFFFF, 0x81F16F39),
    (b"\x00\x00\x00\x00", 0, 0x2362F9DE), (b"\xff\xff\xff\xff", 0, 0x76293B50),
    (b"!Ce\x87", 0, 0xF55B516B), (b"!Ce\x87", 0x5082EDEE, 0x2362F9DE),
    (b"!Ce", 0, 0x7E4A8634), (b"!C", 0, 0xA0F7B07A), (b"!", 0, 0x72661CF4),
    (b"aaaa", 0x9747B28C, 0x5A97808A), (b"Hello, world!", 1234, 0xFAF6CDB3),
    (b"The quick brown fox jumps over the lazy dog", 0x9747B28C, 0x2FA826CD),
]


@pytest.mark.parametrize("data,seed,want", VECTORS)
def test_reference_murmur_matches_published_vectors(data, seed, want):
    assert murmur3_32(data, seed) == want


def test_jax_murmur_matches_reference_on_8_byte_keys():
    rng = np.random.default_rng(0)
    keys = np.concatenate([rng.integers(-2**63, 2**63 - 1, 500, dtype=np.int64),
                           [0, 1, -1, 2**63 - 1, -2**63, 2**32, 2**32 - 1]]).astype(np.int64)
    words = ht.words.as_words(keys, "test", "keys")
    got = np.asarray(ht.cann.murmur3_x86_32(words.lo, words.hi))
    chex.assert_trees_all_equal(got, np.array([key_hash(k) for k in keys], np.uint32))
    seeds = np.asarray(ht.cann.murmur3_x86_32(words.lo, words.hi, seed=np.uint32(0x9747B28C)))
    assert seeds[0] == murmur3_32(struct.pack("<q", int(keys[0])), 0x9747B28C)


def test_home_slot_is_the_unsigned_hash_modulo_bucket_size():
    keys = np.array([3, -3, 2**40 + 11], np.int64)
    words = ht.words.as_words(keys, "test", "keys")
    for size in (1, 7, 2_000_000, 2**31 - 1):
        chex.assert_trees_all_equal(np.asarray(ht.cann.home_slot(words.lo, words.hi, size)),
                                    np.array([key_hash(k) % size for k in keys], np.int32))


@pytest.mark.x64_off
def test_key_forms_agree():
    small = np.array([0, 5, -1, -2**31, 2**31 - 1], np.int64)
    want = ht.words.as_words(small, "test", "keys")
    for form in (small.astype(np.int32), jnp.asarray(small, jnp.int32), small.tolist(),
                 ht.words.Words64(want.lo, want.hi)):
        got = ht.words.as_words(form, "test", "keys")
        chex.assert_trees_all_equal(tuple(map(np.asarray, got)), tuple(map(np.asarray, want)))
    unsigned = jnp.asarray([7, 2**32 - 1], jnp.uint32)
    words = ht.words.as_words(unsigned, "test", "keys")
    assert np.asarray(words.hi).tolist() == [0, 0]
    with jax.enable_x64(True):
        big = np.array([2**40 + 3, -2**62], np.int64)
        got = ht.words.as_words(jnp.asarray(big), "test", "keys")
        chex.assert_trees_all_equal(ht.words.to_host_int64(got), big)
        assert ht.words.join_words(got).dtype == jnp.int64
    chex.assert_trees_all_equal(ht.words.to_host_int64(ht.words.as_words(big, "t", "k")), big)
    assert ht.words.join_words(ht.words.as_words(big, "t", "k")).shape == (2, 2)  # x64 off: word pairs


@pytest.mark.parametrize("bad", [np.array([1.5]), jnp.array([True]), jnp.array([1.0])])
def test_non_integer_keys_raise(bad):
    with pytest.raises(OpDTypeError, match="EmbeddingHashTableLookupOrInsert: argument 'keys'"):
        ht.lookup_or_insert(ht.init_table(4, 1, initializer_mode="constant"), bad)
