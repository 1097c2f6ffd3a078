"""Tables of bfloat16 / float16 rows (issue 39 part 3): creation, reads (float32, exact),
export / import (exact where the values allow, rounded and counted where not), CANN bytes,
checkpoints, eviction and growth keep the dtype; bad dtypes are refused by name. References
are numpy (ml_dtypes' round-to-nearest casts), never the kernels themselves."""

import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jaxops
import jaxops.hashtable as ht
from jaxops.core.errors import OpArgumentError, OpDTypeError
from jaxops.embedding import EmbeddingCollection, TableConfig
from tests.helpers.walk_paths import PATHS, on_path

HALF = [jnp.bfloat16, jnp.float16]
NP = {jnp.bfloat16: ml_dtypes.bfloat16, jnp.float16: np.float16}
KEYS = np.array([11, 5, 11, -7, 2**40], np.int64)
ADAGRAD = ht.optim.adagrad(0.1)  # one instance: the tests share its programs


def _filled(dtype, rows=32, dim=3):
    """A table of ``rows`` slots whose 4 keys hold known rows (imported, float32 values the
    dtype holds exactly)."""
    t = ht.init_table(rows, dim, initializer_mode="constant", constant_value=0.1, dtype=dtype)
    vals = np.arange(12, dtype=np.float32).reshape(4, 3) / 4 - 1  # exact in both halves
    t, info = ht.import_(t, KEYS[[0, 1, 3, 4]], np.arange(4, dtype=np.uint64),
                         np.ones(4, np.uint8), vals)
    assert int(info.rounded) == 0
    return t, vals


@pytest.mark.parametrize("dtype", HALF)
def test_init_modes_round_to_nearest_and_halve_the_rows(dtype):
    key = jax.random.key(3)
    f32 = ht.init_table(16, 4, key=key)
    half = ht.init_table(16, 4, key=key, dtype=dtype)
    assert half.values.dtype == dtype and half.values.nbytes * 2 == f32.values.nbytes
    # the same draws, rounded to nearest (numpy's cast as the reference)
    np.testing.assert_array_equal(np.asarray(half.values),
                                  np.asarray(f32.values).astype(NP[dtype]))
    const = ht.init_table(8, 2, initializer_mode="constant", constant_value=0.1, dtype=dtype)
    assert np.all(np.asarray(const.values) == np.float32(0.1).astype(NP[dtype]))
    given = np.linspace(-2, 2, 16, dtype=np.float32) + np.float32(1e-3)
    sampled = ht.init_table(8, 2, sampled_values=given, dtype=dtype)
    np.testing.assert_array_equal(np.asarray(sampled.values).ravel(), given.astype(NP[dtype]))
    assert ht.slot_bytes(16, dtype) == ht.slot_bytes(16) - 32
    assert "dtype=" in repr(half) and "dtype=" not in repr(f32)


@pytest.mark.parametrize("bad", [jnp.int32, np.float64, "float8_e4m3fn", None, "rows"])
def test_bad_row_dtypes_are_refused_by_name(bad):
    with pytest.raises(OpDTypeError, match=r"InitEmbeddingHashTable: argument 'dtype': "
                       r"expected jnp.float32, jnp.bfloat16 or jnp.float16"):
        ht.init_table(8, 2, initializer_mode="constant", dtype=bad)
    with pytest.raises(OpDTypeError, match=r"hashtable.optim.adagrad: argument 'state_dtype'"):
        ht.optim.adagrad(0.1, state_dtype=bad if bad is not None else jnp.int8)
    with pytest.raises(OpDTypeError, match=r"EmbeddingCollection: argument 't.dtype'"):
        EmbeddingCollection([TableConfig("t", 8, 2, ("a",), ht.optim.sgd(0.1), dtype=bad)])


def test_float64_refusal_says_why():
    with pytest.raises(OpDTypeError, match="got float64 .rows are floats of 32 bits or fewer"):
        ht.init_table(8, 2, initializer_mode="constant", dtype=jnp.float64)


def _reads(t):
    @jax.jit
    def go(t, keys):
        t, rows, info = ht.lookup_or_insert(t, keys, default_value=0.3)
        found, hit = ht.find(t, keys, default_value=-0.7)
        return t, rows, info.slots, found, hit, ht.gather(t, info.slots)

    return go(t, ht.words.as_words(KEYS))


def test_reads_give_float32_rows_exactly_on_both_paths(dtype=jnp.bfloat16):
    t, vals = _filled(dtype)
    want = np.concatenate([vals[:2], vals[:1], vals[2:]])  # KEYS: 11, 5, 11, -7, 2**40
    outs = []
    for path in PATHS:
        new, rows, slots, found, hit, gathered = on_path(path, lambda: _reads(t))
        assert rows.dtype == found.dtype == gathered.dtype == jnp.float32
        np.testing.assert_array_equal(np.asarray(rows), want)
        np.testing.assert_array_equal(np.asarray(found), want)
        np.testing.assert_array_equal(np.asarray(gathered), want)
        assert new.values.dtype == dtype
        outs.append(np.asarray(new.values))
    # an absent key's default row is the float32 default, not a half rounding of it
    absent, hit = ht.find(t, np.array([99], np.int64), default_value=0.3)
    assert not bool(hit[0]) and np.all(np.asarray(absent) == np.float32(0.3))
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])


@pytest.mark.parametrize("dtype", HALF)
def test_export_import_round_trip_exactly(dtype):
    t, vals = _filled(dtype)
    t, *outs = ht.export(t)
    keys, counters, flags, exported = (np.asarray(jaxops.refresh(x)) for x in outs)
    assert exported.dtype == np.float32 and exported.shape == (4, 3)
    back = ht.init_table(32, 3, initializer_mode="constant", dtype=dtype)
    back, info = ht.import_(back, ht.host_keys(t, keys), ht.words.to_host_int64(
        counters, signed=False).astype(np.uint64), flags, exported)
    assert int(info.rounded) == 0
    np.testing.assert_array_equal(np.asarray(ht.find(back, KEYS[[0, 1, 3, 4]])[0]), vals)
    chunks = list(ht.export_chunks(t, 5)[1])
    got = np.concatenate([c.values for c in chunks])
    assert got.dtype == np.float32
    np.testing.assert_array_equal(np.sort(got.ravel()), np.sort(vals.ravel()))


@pytest.mark.parametrize("dtype", HALF)
def test_import_rounds_to_nearest_and_counts(dtype):
    rng = np.random.default_rng(0)
    vals = rng.standard_normal((6, 3)).astype(np.float32)
    vals[0] = [1.0, 0.5, -2.0]  # exact
    vals[1] = [np.inf, np.nan, 70000.0]  # inf and nan stay; 70000 is past float16's range
    t = ht.init_table(32, 3, initializer_mode="constant", dtype=dtype)
    t, info = ht.import_(t, np.arange(6, dtype=np.int64), np.zeros(6, np.uint64),
                         np.ones(6, np.uint8), vals)
    with np.errstate(over="ignore"):
        want = vals.astype(NP[dtype]).astype(np.float32)
    changed = ~((want == vals) | (np.isnan(want) & np.isnan(vals)))
    assert int(info.rounded) == int(changed.sum()) and 12 <= int(changed.sum()) <= 13
    got = np.asarray(ht.find(t, np.arange(6, dtype=np.int64))[0])
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", HALF)
def test_cann_bytes_convert_exactly_both_ways(dtype):
    t, vals = _filled(dtype)
    buf = ht.cann.to_cann_bytes(t)
    # the bytes of a float32 table holding the same (widened) rows
    wide = t.replace(values=t.values.astype(jnp.float32))
    np.testing.assert_array_equal(buf, ht.cann.to_cann_bytes(wide))
    back = ht.cann.from_cann_bytes(buf, 3, dtype=dtype)
    assert back.values.dtype == dtype
    np.testing.assert_array_equal(np.asarray(back.values), np.asarray(t.values))
    np.testing.assert_array_equal(ht.cann.to_cann_bytes(back), buf)


def test_cann_bytes_not_held_by_the_half_dtype_are_refused_or_rounded():
    t = ht.init_table(8, 2, initializer_mode="constant", constant_value=0.1)
    t, _, _ = ht.lookup_or_insert(t, np.array([3], np.int64))
    buf = ht.cann.to_cann_bytes(t)
    with pytest.raises(OpArgumentError, match=r"from_cann_bytes: argument 'buffer': expected "
                       r"float32 values that bfloat16 holds exactly.*got 16 that it does not, "
                       r"the first 0.10000000149011612 in bucket 0, column 0.*inexact='round'"):
        ht.cann.from_cann_bytes(buf, 2, dtype=jnp.bfloat16)
    rounded = ht.cann.from_cann_bytes(buf, 2, dtype=jnp.bfloat16, inexact="round")
    assert np.all(np.asarray(rounded.values) == np.float32(0.1).astype(ml_dtypes.bfloat16))
    with pytest.raises(OpArgumentError, match="argument 'inexact'"):
        ht.cann.from_cann_bytes(buf, 2, dtype=jnp.bfloat16, inexact="truncate")
    with pytest.raises(OpDTypeError, match="from_cann_bytes: argument 'dtype'"):
        ht.cann.from_cann_bytes(buf, 2, dtype=np.int32)


def test_evict_resize_and_growth_keep_the_dtype():
    t, vals = _filled(jnp.bfloat16)  # every test's table: the same programs
    e = ht.evict(t, KEYS[:1])
    assert e.values.dtype == jnp.bfloat16 and int(e.live) == 3
    low = ht.evict_lowest(t, 1)
    assert low.values.dtype == jnp.bfloat16 and int(low.live) == 3
    big = ht.resize(t, 64)
    assert big.values.dtype == jnp.bfloat16 and big.bucket_size == 64
    np.testing.assert_array_equal(np.asarray(ht.find(big, KEYS[[0, 1, 3, 4]])[0]), vals)
    opt = ADAGRAD
    grown, (state,) = ht.resize(t, 64, states=[(opt.init(t), opt.init)])
    assert grown.values.dtype == jnp.bfloat16 and state.sum_of_squares.dtype == jnp.float32
    assert state.rounding is not None


def test_checkpoint_round_trip_and_wrong_dtype_target(tmp_path):
    t, vals = _filled(jnp.bfloat16)
    opt = ADAGRAD
    slots = ht.lookup_or_insert(t, KEYS)[2].slots
    t, state = opt.update(t, opt.init(t), slots, jnp.full((5, 3), 0.01))
    ht.save({"table": t, "opt": state}, os.fspath(tmp_path / "a"))
    fresh = ht.init_table(32, 3, initializer_mode="constant", dtype=jnp.bfloat16)
    back = ht.load(os.fspath(tmp_path / "a"), {"table": fresh, "opt": opt.init(fresh)})
    np.testing.assert_array_equal(np.asarray(back["table"].values), np.asarray(t.values))
    assert int(back["opt"].rounding) == 1
    np.testing.assert_array_equal(np.asarray(back["opt"].sum_of_squares),
                                  np.asarray(state.sum_of_squares))
    ht.save(t, os.fspath(tmp_path / "b"))
    lone = ht.load(os.fspath(tmp_path / "b"))  # no target: the saved dtype
    assert lone.values.dtype == jnp.bfloat16
    with pytest.raises(OpArgumentError, match="expected a table of bfloat16 rows .as saved., "
                       "got float32 rows"):
        ht.load(os.fspath(tmp_path / "b"), ht.init_table(32, 3, initializer_mode="constant"))


def test_a_table_on_a_mesh_keeps_half_rows():
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("d",))
    t = ht.init_sharded_table(32, 4, mesh, "d", initializer_mode="constant",
                              constant_value=1.0, dtype=jnp.bfloat16)
    t, rows, info = ht.lookup_or_insert(t, np.arange(8, dtype=np.int64))
    assert t.values.dtype == jnp.bfloat16 and rows.dtype == jnp.float32
    opt = ht.optim.sgd(0.25)
    t, state = opt.update(t, opt.init(t), info.slots, jnp.ones((8, 4)))
    assert np.asarray(state.rounding).tolist() == [1]  # one count per shard
    np.testing.assert_array_equal(np.asarray(ht.find(t, np.arange(8, dtype=np.int64))[0]),
                                  0.75)  # exact in bfloat16: no rounding either way
    t, info = ht.import_(t, np.array([100], np.int64), np.ones(1, np.uint64),
                         np.ones(1, np.uint8), np.full((1, 4), 0.1, np.float32))
    assert int(info.rounded) == 4 and ht.resize(t, 64).values.dtype == jnp.bfloat16
