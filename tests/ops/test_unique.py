"""Unique and UniqueConsecutive against plain references, numpy and ONNX Runtime."""

import chex
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jaxops
from jaxops.core.errors import OpArgumentError, OpDTypeError
from jaxops.ops import grouping
from jaxops.ops.order_keys import sortable_keys
from jaxops.ops.sorted_search import lower_bound
from tests.helpers.util import expected_truncation
from tests.helpers.cases.unique import (floats_with_ties, ref_unique, ref_unique_consecutive,
                                        unique_all, unique_consecutive_all)


def assert_same(got, want):
    """Exact comparison (NaN == NaN), including the sign of float zeros."""
    got = [np.asarray(g) for g in got]
    chex.assert_trees_all_equal([g.astype(np.float64) if g.dtype.kind == "V" else g for g in got],
                                [np.asarray(w).astype(g.dtype) for w, g in zip(want, got)])
    if got[0].dtype.kind in "fV":
        np.testing.assert_array_equal(np.signbit(got[0].astype(np.float32)),
                                      np.signbit(np.asarray(want[0]).astype(np.float32)))


def random_input(rng, shape, dtype, spread):
    if np.dtype(dtype).kind == "f" or dtype is ml_dtypes.bfloat16:
        return floats_with_ties(rng, shape, spread).astype(dtype)
    if dtype is np.bool_:
        return rng.random(shape) < 0.5
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -spread), min(info.max, spread), shape).astype(dtype)


@pytest.mark.parametrize("dtype", [np.bool_, np.int8, np.uint8, np.int32, np.float16,
                                   ml_dtypes.bfloat16, np.float32], ids=lambda d: np.dtype(d).name)
def test_random_inputs_of_every_dtype_match_the_reference(dtype):
    rng = np.random.default_rng(0)
    for trial, spread in enumerate([2, 5, 100]):  # one shape: one compilation per dtype
        x = random_input(rng, (4, 6), dtype, spread)
        assert_same(jaxops.refresh(unique_all(x)), ref_unique(x))


@pytest.mark.parametrize("sorted_", [True, False])
def test_ranks_0_to_4_in_both_orders(sorted_):
    rng = np.random.default_rng(1)
    for shape, dtype in [((), np.float32), ((9,), np.int32), ((2, 3, 4), np.float32),
                         ((2, 1, 3, 5), np.int32)]:
        x = random_input(rng, shape, dtype, 4)
        assert_same(jaxops.refresh(unique_all(x, sorted=sorted_)), ref_unique(x, sorted=sorted_))


@pytest.mark.parametrize("spread,sorted_", [(50, False), (2**31 - 1, True)],
                         ids=["counting", "sorting"])
def test_large_inputs_on_both_grouping_strategies(spread, sorted_):
    rng = np.random.default_rng(1)
    x = rng.integers(-spread, spread, 30000).astype(np.int32)
    x[:500] = x[500]  # a long tie
    got = jax.jit(lambda x: unique_all(x, sorted=sorted_))(x)
    y, idx, inv, cnt = np.unique(x, return_index=True, return_inverse=True, return_counts=True)
    if not sorted_:
        order = np.argsort(idx)
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        y, idx, inv, cnt = y[order], idx[order], rank[inv], cnt[order]
    assert_same(jaxops.refresh(got), (y, idx, inv, cnt))


def test_grouping_strategies_agree_where_both_apply():
    rng = np.random.default_rng(2)
    keys = jnp.asarray(rng.integers(1000, 1000 + 300, 2000).astype(np.uint32))
    edge = jnp.asarray(np.array([5, 5 + 2999] + [7] * 2998, np.uint32))  # range = n - 1

    @jax.jit  # every strategy in one program
    def strategies(keys, edge):
        return (grouping._by_counting(keys, jnp.min(keys)), grouping._by_sorting(keys),
                grouping._by_sorting(keys, search=False),
                grouping._by_sorting(edge), grouping._by_counting(edge, jnp.min(edge)))

    by_counting, by_sorting, by_sorting_scan, edge_sorting, edge_counting = strategies(keys, edge)
    chex.assert_trees_all_equal(by_sorting, by_counting)
    chex.assert_trees_all_equal(by_sorting_scan, by_counting)
    chex.assert_trees_all_equal(edge_sorting, edge_counting)


@pytest.mark.parametrize("n", [0, 1, 3000])
def test_dense_rank_grouping_equals_grouping_the_ranks(n):
    rng = np.random.default_rng(n)
    values = rng.integers(0, max(n // 3, 1), n)
    rank = jnp.asarray(np.unique(values, return_inverse=True)[1].reshape(-1).astype(np.int32))
    got, want = jax.jit(lambda r: (grouping.group_dense_ranks(r),
                                   grouping.group_keys(sortable_keys(r))))(rank)
    chex.assert_trees_all_equal(got._replace(unique_keys=None), want._replace(unique_keys=None))
    k = int(got.n_unique)  # its keys are the ranks themselves, padded with the largest
    assert got.unique_keys.tolist() == list(range(k)) + [max(k - 1, 0)] * (n - k)


def test_unique_slices_of_a_large_input():
    """Past the counting threshold (16K slices), against numpy."""
    x = np.random.default_rng(4).integers(0, 3, (20_000, 3)).astype(np.int32)
    want = np.unique(x, axis=0, return_index=True, return_inverse=True, return_counts=True)
    assert_same(jaxops.refresh(unique_all(x, axis=0)),
                (want[0], want[1], want[2].reshape(-1), want[3]))


def test_nan_and_signed_zero_rules():
    x = np.array([2.0, np.nan, -0.0, 0.0, -np.nan, np.inf, 0.0], np.float32)
    y, idx, inv, cnt = jaxops.refresh(unique_all(x))
    assert_same((y,), ([-0.0, 2.0, np.inf, np.nan],))  # NaNs collapse, last; -0.0 came first
    chex.assert_trees_all_equal((idx, inv, cnt), (np.array([2, 0, 5, 1]),
                                                  np.array([1, 3, 0, 0, 3, 2, 0]),
                                                  np.array([3, 1, 1, 2])))
    want = np.unique(x, equal_nan=True, return_counts=True)
    chex.assert_trees_all_equal(cnt, want[1])
    y = jaxops.refresh(jaxops.unique(np.array([0.0, -0.0], np.float32), sorted=False))
    assert not np.signbit(y[0])  # first occurrence is +0.0


def test_empty_all_equal_and_all_distinct():
    for got, want in [(unique_all(np.zeros((0,), np.float32)), ref_unique(np.zeros(0, np.float32))),
                      (unique_all(np.full(7, 3, np.int32)), ref_unique(np.full(7, 3))),
                      (unique_all(np.arange(9, 0, -1)), ref_unique(np.arange(9, 0, -1))),
                      (unique_all(np.zeros((3, 0)), axis=0), ref_unique(np.zeros((3, 0)), axis=0)),
                      (unique_all(np.zeros((0, 3)), axis=0), ref_unique(np.zeros((0, 3)), axis=0)),
                      (unique_all(np.zeros((3, 0)), axis=1), ref_unique(np.zeros((3, 0)), axis=1)),
                      (unique_all(np.zeros((0, 3)), axis=1), ref_unique(np.zeros((0, 3)), axis=1))]:
        assert_same(jaxops.refresh(got), want)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_unique_slices(axis):
    rng = np.random.default_rng(3)
    x = rng.integers(0, 2, (4, 3, 2)).astype(np.float32)
    x[0, 0, 0] = x[1, 0, 0] = np.nan
    for sorted_ in (True, False):
        assert_same(jaxops.refresh(unique_all(x, axis=axis, sorted=sorted_)),
                    ref_unique(x, axis=axis, sorted=sorted_))
    x = np.nan_to_num(x)
    want = np.unique(x, axis=axis, return_index=True, return_inverse=True, return_counts=True)
    assert_same(jaxops.refresh(unique_all(x, axis=axis)),
                (want[0], want[1], want[2].reshape(-1), want[3]))


def test_capacity_exact_and_overflow_inside_jit():
    x = np.array([4, 1, 4, 2, 9, 1], np.int32)  # 4 unique
    configs = [(sorted_, size) for sorted_ in (True, False) for size in (4, 2, 6)]
    outs = jax.jit(lambda x: [(lambda o: (o, o[0].overflowed(), o[0].lost()))(  # one program
        unique_all(x, size=size, sorted=sorted_)) for sorted_, size in configs])(x)
    for (sorted_, size), (out, over, lost) in zip(configs, outs):
        assert_same(jaxops.refresh(out, allow_truncated=True),
                    ref_unique(x, size=size, sorted=sorted_))
        assert bool(over) == (size < 4) and int(lost) == max(4 - size, 0)
    y, idx, inv, cnt = unique_all(x, size=6)
    chex.assert_trees_all_equal((np.asarray(y.data)[4:], np.asarray(idx.data)[4:],
                                 np.asarray(cnt.data)[4:]), (np.zeros(2), np.full(2, -1),
                                                             np.zeros(2)))


def test_onnxruntime_agrees_without_nan():
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper
    rng = np.random.default_rng(4)

    def run_ort(x, sorted_, axis):
        attrs = {"sorted": int(sorted_)} | ({} if axis is None else {"axis": axis})
        names = ["Y", "indices", "inverse_indices", "counts"]
        graph = helper.make_graph(
            [helper.make_node("Unique", ["X"], names, **attrs)], "u",
            [helper.make_tensor_value_info("X", TensorProto.FLOAT, None)],
            [helper.make_tensor_value_info(n, TensorProto.FLOAT if n == "Y" else TensorProto.INT64,
                                           None) for n in names])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return sess.run(None, {"X": x})

    for shape, axis, sorted_ in [((20,), None, True), ((3, 5), None, False), ((6, 3), 0, True),
                                 ((2, 5), 1, False), ((0,), None, True)]:
        for _ in range(3):
            x = rng.integers(0, 3, shape).astype(np.float32)
            assert_same(jaxops.refresh(unique_all(x, sorted=sorted_, axis=axis)),
                        run_ort(x, sorted_, axis))


def test_x64_inputs_and_index_dtype():
    x = np.array([3, -2**40, 3, 2**40], np.int64)
    with jax.enable_x64(True):
        y, idx, inv, cnt = unique_all(x)
        assert idx.dtype == jnp.int64 and inv.dtype == jnp.int64
        assert_same(jaxops.refresh((y, idx, inv, cnt)), ref_unique(x))
        f = np.array([0.5, np.nan, -0.0, 0.5], np.float64)
        assert_same(jaxops.refresh(unique_all(f)), ref_unique(f))
    with jax.enable_x64(False):
        assert unique_all(np.array([1, 2], np.int32))[1].dtype == jnp.int32


@pytest.mark.parametrize("spread", [300, 2**40], ids=["counting", "sorting"])
def test_x64_large_inputs(spread):
    x = np.random.default_rng(10).integers(-spread, spread, 20000)
    with jax.enable_x64(True):
        got = jaxops.refresh(unique_all(x, sorted=spread > 300))
    assert_same(got, ref_unique(x, sorted=spread > 300))


def test_agrees_with_jnp_unique():
    x = np.random.default_rng(5).integers(0, 20, 100).astype(np.int32)
    want = jax.jit(lambda x: jnp.unique(x, size=30, fill_value=0, return_counts=True))(x)
    y, cnt = jaxops.unique(x, size=30, return_counts=True)
    n = int(y.actual_shape[0])
    chex.assert_trees_all_equal((np.asarray(y.data)[:n], np.asarray(cnt.data)[:n]),
                                (np.asarray(want[0][:n]), np.asarray(want[1][:n])))


def test_vmap_over_inputs():
    rng = np.random.default_rng(6)
    xs = rng.integers(0, 5, (4, 12)).astype(np.int32)
    out = jaxops.refresh(jax.vmap(lambda x: unique_all(x, size=3))(xs), allow_truncated=True)
    for i, x in enumerate(xs):
        assert_same([out[0][i], out[1][i], np.asarray(out[2])[i], out[3][i]], ref_unique(x, size=3))


@pytest.mark.parametrize("axis", [None, 0, 1])
def test_unique_consecutive(axis):
    rng = np.random.default_rng(7)
    for trial in range(3):
        x = floats_with_ties(rng, (8, 3), values=1)
        x[2] = x[1]  # a repeated row
        for size in (None, 2):
            with expected_truncation():
                cut = unique_consecutive_all(x, axis=axis, size=size, overflow="truncate")
            assert_same(jaxops.refresh(cut, allow_truncated=True),
                        ref_unique_consecutive(x, size=size, axis=axis))
    x = np.random.default_rng(8).integers(0, 2, 20000).astype(np.int8)  # blocked compaction
    assert_same(jaxops.refresh(unique_consecutive_all(x)), ref_unique_consecutive(x))


def test_sortable_keys_order_and_lower_bound():
    rng = np.random.default_rng(9)
    x = np.concatenate([rng.standard_normal(50), [np.inf, -np.inf, 0.0, -0.0, np.nan]]).astype(
        np.float32)
    keys = np.asarray(jax.jit(sortable_keys)(x))
    finite = ~np.isnan(x)
    order = np.argsort(keys[finite], kind="stable")
    np.testing.assert_array_equal(np.sort(x[finite]), x[finite][order])
    assert (keys[~finite] > keys[finite].max()).all()
    ints = np.array([-128, -1, 0, 5, 127], np.int8)
    assert (np.diff(np.asarray(jax.jit(sortable_keys)(ints)).astype(np.int64)) > 0).all()
    for trial in range(20):
        table = np.sort(rng.integers(0, [4, 2**32][trial % 2], 300, dtype=np.uint64)).astype(np.uint32)
        nv = int(rng.integers(0, 301))
        q = np.concatenate([table[rng.integers(0, 300, 50)],
                            rng.integers(0, 2**32, 50, dtype=np.uint64).astype(np.uint32)])
        np.testing.assert_array_equal(
            np.asarray(jax.jit(lower_bound)(table, jnp.int32(nv), q)),
            np.searchsorted(table[:nv], q, side="left"))


def test_bad_inputs_name_the_operator_and_argument():
    with pytest.raises(OpArgumentError, match="Unique: argument 'axis'"):
        jaxops.unique(jnp.ones((2, 3)), axis=2)
    with pytest.raises(OpArgumentError, match="UniqueConsecutive: argument 'axis'"):
        jaxops.unique_consecutive(jnp.float32(1), axis=0)
    with pytest.raises(OpDTypeError, match="Unique: argument 'x'"):
        jaxops.unique(jnp.ones(3, jnp.complex64))
    with pytest.raises(OpArgumentError, match="Unique: argument 'size'"):
        jaxops.unique(jnp.ones(3), size=-1)
    with pytest.raises(OpArgumentError, match="Unique: argument 'sorted'"):
        jaxops.unique(jnp.ones(3), sorted=2)
