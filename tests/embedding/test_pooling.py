"""Bags and pooling against a numpy loop over ragged bags (empty bags, duplicates, weights)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxops import DynArray
from jaxops.core.errors import OpArgumentError
from jaxops.embedding import POOLINGS, Bags, pool
from jaxops.hashtable.words import to_host_int64


def _ref_pool(rows, lengths, weights, mode):
    out, start = np.zeros((len(lengths), rows.shape[1])), 0
    for b, n in enumerate(lengths):
        r = rows[start:start + n].astype(np.float64)
        w = np.ones(n) if weights is None else weights[start:start + n].astype(np.float64)
        total = (w[:, None] * r).sum(0)
        denom = {"sum": 1.0, "mean": w.sum(), "sqrtn": np.sqrt((w * w).sum())}[mode]
        out[b] = total / denom if denom != 0 else 0.0
        start += n
    return out


def _ragged(rng, bags=7, dim=3, weighted=True):
    lengths = rng.integers(0, 4, bags)
    lengths[[1, 4]] = 0  # empty bags
    # small id range: duplicates; 3 or more trailing padding ids: every case has 3 * bags + 3
    # ids, one shape for all of them (each new shape would trace and compile pool again)
    size = 3 * bags + 3
    ids = rng.integers(0, 5, size)
    rows = rng.standard_normal((size, dim)).astype(np.float32)
    weights = rng.uniform(0.1, 2.0, size).astype(np.float32) if weighted else None
    return ids, lengths, rows, weights


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("mode", POOLINGS)
def test_pool_matches_numpy_on_ragged_bags(mode, weighted):
    rng = np.random.default_rng(POOLINGS.index(mode) + 10 * weighted)
    ids, lengths, rows, weights = _ragged(rng, weighted=weighted)
    want = _ref_pool(rows, lengths, weights, mode)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    for bags in (Bags.from_lengths(ids, lengths, weights), Bags.from_offsets(ids, offsets, weights),
                 jax.jit(Bags.from_lengths)(ids, lengths, weights)):
        got = jax.jit(pool, static_argnums=2)(jnp.asarray(rows), bags, mode)
        chex.assert_shape(got, (len(lengths), rows.shape[1]))
        chex.assert_trees_all_close(np.asarray(got), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", POOLINGS)
def test_gradient_wrt_rows_matches_the_analytic_one(mode):
    """d Σ_b c_b·pooled_b / d row_i = c_{bag(i)} · w_i / denom_{bag(i)}; padding gets 0."""
    rng = np.random.default_rng(20)
    ids, lengths, rows, weights = _ragged(rng)
    coef = rng.standard_normal((len(lengths), rows.shape[1]))
    bags = Bags.from_lengths(ids, lengths, weights)
    grad = jax.grad(lambda r: jnp.sum(pool(r, bags, mode) * coef))(jnp.asarray(rows))
    want, start = np.zeros(rows.shape), 0
    for b, n in enumerate(lengths):
        w = weights[start:start + n].astype(np.float64)
        denom = {"sum": 1.0, "mean": w.sum(), "sqrtn": np.sqrt((w * w).sum())}[mode]
        want[start:start + n] = coef[b] * (w / denom)[:, None]
        start += n
    chex.assert_trees_all_close(np.asarray(grad), want, rtol=1e-5, atol=1e-6)


def test_dense_with_mask_and_dynarray_inputs():
    rng = np.random.default_rng(30)
    ids = rng.integers(0, 9, (4, 3))
    mask = np.array([[1, 1, 0], [0, 0, 0], [1, 1, 1], [1, 0, 0]], bool)
    rows = rng.standard_normal((12, 2)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, (4, 3)).astype(np.float32)
    got = pool(jnp.asarray(rows), Bags.from_dense(ids, mask=mask, weights=w), "mean")
    want = np.stack([(w[b, mask[b], None] * rows.reshape(4, 3, 2)[b, mask[b]]).sum(0)
                     / max(w[b, mask[b]].sum(), 1e-30) for b in range(4)])
    chex.assert_trees_all_close(np.asarray(got), want, rtol=1e-5, atol=1e-6)
    # A 2-D DynArray: the leading block [:3, :2] is valid.
    dyn = Bags.from_dense(DynArray(jnp.asarray(ids, jnp.int32), [3, 2]))
    assert dyn.segment.tolist() == [0, 0, 4, 1, 1, 4, 2, 2, 4, 4, 4, 4]
    # A 1-D DynArray with lengths: ids past its actual length are padding as well.
    flat = Bags.from_lengths(DynArray(jnp.arange(6, dtype=jnp.int32), [4]), np.array([2, 3]))
    assert flat.segment.tolist() == [0, 0, 1, 1, 2, 2]
    assert flat.lengths().tolist() == [2, 2]


def test_ids_keep_64_bits_with_x64_off():
    big = np.array([2**40 + 3, -5, 2**63 - 1], np.int64)
    bags = Bags.from_lengths(big, np.array([3]))
    chex.assert_trees_all_equal(to_host_int64(bags.ids), big)


def test_bad_arguments_are_named():
    bags = Bags.from_lengths(np.arange(3), np.array([3]))
    with pytest.raises(OpArgumentError) as e:
        pool(jnp.ones((3, 2)), bags, "max")
    assert e.value.arg == "pooling"
    with pytest.raises(OpArgumentError) as e:
        pool(jnp.ones((4, 2)), bags)
    assert e.value.arg == "rows"
    with pytest.raises(OpArgumentError) as e:
        Bags.from_lengths(np.arange(3), np.ones((1, 3), int))
    assert e.value.arg == "lengths"
    with pytest.raises(OpArgumentError) as e:
        Bags.from_dense(np.arange(3))
    assert e.value.arg == "ids"
    with pytest.raises(OpArgumentError) as e:
        Bags.from_lengths(np.arange(3), np.array([3]), weights=np.ones(2))
    assert e.value.arg == "weights"


@pytest.mark.parametrize("lengths", [[2, 3], [-1, 2], [4, 1]])
def test_bags_that_do_not_fit_the_ids_are_refused(lengths):
    """Outside jit the sizes are checked: 4 ids cannot hold bags of 5, nor negative bags."""
    with pytest.raises(OpArgumentError) as e:
        Bags.from_lengths(np.arange(4), np.array(lengths))
    assert e.value.arg == "lengths"
    with pytest.raises(OpArgumentError) as e:
        Bags.from_offsets(np.arange(4), np.concatenate([[0], np.cumsum(lengths)]))
    assert e.value.arg == "offsets"
