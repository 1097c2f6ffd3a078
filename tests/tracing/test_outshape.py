"""OP_OUTSHAPE: encode/decode round trips, the uint64 rank flag, dtype and rank rules,
RefreshOutputShape."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxops.core.errors import OutshapeError
from tracing import outshape
from tracing.outshape import decode, encode, refresh_outputs, to_host_words


def _random_shapes(rng, n):
    return [tuple(int(d) for d in rng.integers(0, 1000, rng.integers(1, 9))) for _ in range(n)]


def _np_encode(shapes, dtype, flag=False):
    out = np.zeros(9 * len(shapes), np.int64)
    for k, s in enumerate(shapes):
        out[9 * k] = len(s) | (0x80000000 if flag else 0)
        out[9 * k + 1:9 * k + 1 + len(s)] = s
    return out.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64])
def test_round_trip_all_dtypes(dtype):
    rng = np.random.default_rng(0)
    for n in (1, 2, 5):
        shapes = _random_shapes(rng, n)
        buf = encode(shapes, dtype)
        host = to_host_words(buf, dtype)
        assert host.dtype == np.dtype(dtype) and host.shape == (9 * n,)
        np.testing.assert_array_equal(host, _np_encode(shapes, dtype))
        assert decode(host) == shapes
        assert decode(buf) == shapes


def test_round_trip_with_x64_on():
    with jax.enable_x64(True):
        buf = encode([(3, 4)], np.int64, uint64_flag=True)
        assert buf.dtype == jnp.int64
        assert int(buf[0]) == 0x80000002
        assert decode(buf) == [(3, 4)]


@pytest.mark.x64_off
def test_x64_off_int64_is_carried_in_uint32():
    buf = encode([(7,)], np.int64, uint64_flag=True)
    assert buf.dtype == jnp.uint32  # x64 is off in the test suite by default
    host = to_host_words(buf)
    assert host.dtype == np.int64 and host[0] == 0x80000001
    assert decode(host) == [(7,)]


def test_traced_dims_inside_jit():
    @jax.jit
    def f(n):
        return encode([jnp.stack([n, n + 1]), (5,)], np.int32)
    assert decode(f(3)) == [(3, 4), (5,)]


def test_uint64_flag_is_masked_for_every_rank():
    for rank in range(1, 9):
        shape = tuple(range(2, 2 + rank))
        words = _np_encode([shape], np.int64, flag=True)
        assert words[0] == 0x80000000 | rank
        assert decode(words) == [shape]


def test_uint64_flag_needs_int64():
    with pytest.raises(OutshapeError, match="int64"):
        encode([(1,)], np.int32, uint64_flag=True)


@pytest.mark.parametrize("dtype", [np.int16, np.float64, np.uint8, np.float16])
def test_unsupported_dtype(dtype):
    with pytest.raises(OutshapeError, match="Unsupported outshape dtype"):
        decode(np.zeros(9, dtype))
    with pytest.raises(OutshapeError, match="Unsupported outshape dtype"):
        encode([(1,)], dtype)


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.float32])
def test_rank_zero_or_negative_decodes_as_scalar_with_warning(dtype):
    words = np.zeros(18, dtype)
    words[9] = -3
    with pytest.warns(UserWarning, match="scalar"):
        assert decode(words) == [(), ()]


def test_rank_above_8():
    with pytest.raises(OutshapeError, match="at most 8"):
        encode([tuple(range(9))])
    words = np.zeros(9, np.int64)
    words[0] = 9
    with pytest.raises(OutshapeError, match="rank 9"):
        decode(words)


def test_individual_uint64_variant():
    words = np.zeros(9, np.uint64)
    words[0] = 0x80 | 0x02  # high bits beyond 0x7F are not rank
    words[1:3] = [4, 5]
    assert decode(words, individual=True) == [(4, 5)]
    words[0] = 9
    with pytest.raises(OutshapeError, match="rank 9"):
        decode(words, individual=True)
    with pytest.raises(OutshapeError, match="Unsupported outshape dtype"):
        decode(np.zeros(9, np.float32), individual=True)


def test_count_and_short_buffers():
    words = _np_encode([(1,), (2,), (3,)], np.int64)
    assert decode(words, count=2) == [(1,), (2,)]
    with pytest.raises(OutshapeError, match="4 slots"):
        decode(words, count=4)
    with pytest.raises(OutshapeError, match="1-D"):
        decode(words.reshape(3, 9))


def test_refresh_outputs_27_words_three_outputs():
    t = _np_encode([(2, 3), (4,), (1, 1, 2)], np.int64)
    assert t.size == 27
    outs = [np.arange(12), np.arange(5), np.arange(5), np.arange(10), np.arange(8)]
    new = refresh_outputs(outs, [(t, 0), (t, 3), (t, 4)])
    np.testing.assert_array_equal(new[0], np.arange(6).reshape(2, 3))
    np.testing.assert_array_equal(new[3], np.arange(4))
    np.testing.assert_array_equal(new[4], np.arange(2).reshape(1, 1, 2))
    assert new[1] is outs[1] and new[2] is outs[2]


def test_refresh_outputs_errors():
    t = _np_encode([(2,)], np.int64)
    with pytest.raises(OutshapeError, match="names output 5"):
        refresh_outputs([np.zeros(4)], [(t, 5)])
    with pytest.raises(OutshapeError, match="share one shape tensor"):
        refresh_outputs([np.zeros(4)] * 2, [(t, 0), (t.copy(), 1)])
    big = _np_encode([(9,)], np.int64)
    with pytest.raises(OutshapeError, match="needs 9"):
        refresh_outputs([np.zeros(4)], [(big, 0)])


def test_module_exports_constants():
    assert outshape.SLOT_WORDS == 9 and outshape.MAX_RANK == 8 and outshape.UINT64_FLAG == 0x80000000
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert decode(np.zeros(0, np.int64)) == []
