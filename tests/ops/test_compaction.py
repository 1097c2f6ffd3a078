"""The shared compaction primitive against numpy, on both of its formulations."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxops.ops import compaction
from jaxops.ops.compaction import compact_indices, compact_map, gather_valid

# jitted (one program a call; eagerly each jnp operation inside is lowered on its own)
compact = jax.jit(compact_indices, static_argnums=1, static_argnames="fill_value")


def ref_compact(mask, size, fill=-1):
    pos = np.flatnonzero(np.asarray(mask).reshape(-1))
    out = np.full(size, fill, np.int64)
    out[:min(size, pos.size)] = pos[:size]
    return out, pos.size


def patterns(rng, n):
    """Masks that stress the blocked path: densities, empty stretches, unit boundaries."""
    sparse = np.zeros(n, bool)
    sparse[::997] = True  # most units and many chunks hold nothing
    blocks = np.zeros(n, bool)
    blocks[(np.arange(n) // 128) % 3 == 1] = True  # whole units on and off
    edges = np.zeros(n, bool)
    edges[[i for i in (0, 127, 128, n - 1) if i < n]] = True
    return {"none": np.zeros(n, bool), "all": np.ones(n, bool), "sparse": sparse,
            "units": blocks, "edges": edges, "p=0.01": rng.random(n) < 0.01,
            "p=0.5": rng.random(n) < 0.5, "p=0.97": rng.random(n) < 0.97}


@pytest.mark.parametrize("n", [1, 33, 5000, 70003])
def test_random_and_structured_masks_match_numpy(n):
    rng = np.random.default_rng(n)
    masks = patterns(rng, n)
    half = int(masks["p=0.5"].sum())
    # Tiny, one short of the p=0.5 count (overflow), above the theoretical maximum; small
    # inputs (cheap to compile) also exactly the p=0.5 count.
    sizes = sorted({40, max(half - 1, 0), n + 70} | ({half} if n <= 5000 else set()))
    run = jax.jit(lambda ms: [jax.vmap(lambda m: compact_indices(m, size))(ms)  # one program
                              for size in sizes])
    for size, (idx, count) in zip(sizes, run(np.stack(list(masks.values())))):
        for k, m in enumerate(masks.values()):
            want, want_count = ref_compact(m, size)
            chex.assert_trees_all_equal((np.asarray(idx[k]), int(count[k])), (want, want_count))


@pytest.mark.parametrize("n,size", [(300, 170), (5000, 4097), (129, 1)])
def test_blocked_and_scatter_paths_agree(n, size):
    rng = np.random.default_rng(size)
    masks = np.stack([rng.random(n) < dens for dens in (0.0, 0.3, 1.0)])
    fn = lambda i: (i, i * 2)
    blocked, plain = jax.jit(lambda ms: (  # both paths in one program
        jax.vmap(lambda m: compaction._compact_blocked(m, size, fn, (-1, -7)))(ms),
        jax.vmap(lambda m: compaction._compact_scatter(m, size, fn, (-1, -7)))(ms)))(masks)
    chex.assert_trees_all_equal(blocked, plain)
    for k, mask in enumerate(masks):
        want, count = ref_compact(mask, size)
        chex.assert_trees_all_equal((np.asarray(blocked[0][0][k]), int(blocked[1][k])),
                                    (want, count))


def test_capacity_zero_and_empty_mask():
    idx, count = compact(np.array([True, False, True]), 0)
    chex.assert_shape(idx, (0,))
    assert int(count) == 2
    idx, count = compact(np.zeros((0,), bool), 3, fill_value=9)
    chex.assert_trees_all_equal((np.asarray(idx), int(count)), (np.full(3, 9, np.int32), 0))


def test_non_bool_masks_count_non_zero_including_nan():
    x = np.array([[0.0, np.nan], [-0.0, 2.0]], np.float32)
    idx, count = compact(x, 4)
    chex.assert_trees_all_equal((np.asarray(idx), int(count)), (np.array([1, 3, -1, -1]), 2))


def test_compact_map_epilogue_and_fills_on_the_blocked_path():
    rng = np.random.default_rng(0)
    mask = rng.random((200, 150)) < 0.2
    values = jnp.asarray(rng.standard_normal(mask.size).astype(np.float32))
    (rows, vals), count = jax.jit(lambda m: compact_map(
        m, 6100, lambda i: (i // 150, values[i]), (-1, np.float32(np.nan))))(mask)
    pos = np.flatnonzero(mask)
    k = min(pos.size, 6100)
    chex.assert_trees_all_equal(np.asarray(rows[:k]), pos[:k] // 150)
    chex.assert_trees_all_equal(np.asarray(vals[:k]), np.asarray(values)[pos[:k]])
    assert (np.asarray(rows[k:]) == -1).all() and np.isnan(np.asarray(vals[k:])).all()
    assert int(count) == pos.size


def test_gather_valid_pads_and_routes_gradients():
    @jax.jit  # one program
    def run(values):
        idx, count = compact_indices(values > 2, 4)
        return (gather_valid(values, idx, count, -1.0),
                jax.grad(lambda v: gather_valid(v, idx, count, 0.0).sum())(values))

    out, grad = run(jnp.arange(5.0))
    chex.assert_trees_all_equal(np.asarray(out), np.array([3.0, 4.0, -1.0, -1.0], np.float32))
    chex.assert_trees_all_equal(np.asarray(grad), np.array([0, 0, 0, 1, 1], np.float32))


def test_bad_capacity_raises():
    with pytest.raises(ValueError, match="size"):
        compact_indices(jnp.ones(3, bool), -1)


def test_blocked_path_with_x64_on():
    mask = np.random.default_rng(4).random((350, 200)) < 0.3
    with jax.enable_x64(True):
        idx, count = compact(mask, 30000)
    want, want_count = ref_compact(mask, 30000)
    assert idx.dtype == np.int32 and count.dtype == np.int32
    chex.assert_trees_all_equal((np.asarray(idx), int(count)), (want, want_count))
