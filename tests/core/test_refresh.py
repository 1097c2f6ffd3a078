"""jaxops.refresh: exact shapes, one transfer, no per-size compiles, batched DynArrays."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxops.core.refresh as refresh_module
from jaxops import DynArray, refresh
from tests.helpers.util import CompileCounter


@jax.jit
def keep_positive(x):
    keep = x > 0
    order = jnp.argsort(~keep, stable=True)
    return DynArray(x[order], [jnp.sum(keep)], fill_value=0)


@pytest.mark.x64_off
def test_tree_with_mixed_leaves():
    x = jnp.array([3, -1, 2, 0])
    tree = {"a": keep_positive(x), "b": [keep_positive(-x), 5], "c": jnp.ones(2), "d": None}
    out = refresh(tree)
    np.testing.assert_array_equal(out["a"], [3, 2])
    assert isinstance(out["a"], np.ndarray) and out["a"].dtype == np.int32
    assert out["b"][0].tolist() == [1] and out["b"][1] == 5
    assert out["c"] is tree["c"] and out["d"] is None


def test_one_transfer_and_no_compile_per_size():
    rng = np.random.default_rng(0)
    xs = [jnp.asarray(rng.integers(-5, 5, 64)) for _ in range(12)]
    outs = [keep_positive(x) for x in xs]  # compiles once, before counting
    jax.block_until_ready(outs)
    with CompileCounter() as compiles, pytest.MonkeyPatch.context() as mp:
        calls = []
        real = jax.device_get
        mp.setattr(refresh_module.jax, "device_get", lambda t: calls.append(t) or real(t))
        with jax.transfer_guard_device_to_host("disallow"):
            exact = refresh(outs)  # 12 DynArrays with about 12 distinct sizes
    assert len(calls) == 1
    assert compiles.count == 0
    assert len({e.shape for e in exact}) > 3
    for x, e in zip(xs, exact):
        np.testing.assert_array_equal(e, np.asarray(x)[np.asarray(x) > 0])


def test_batched_refresh_gives_one_array_per_example():
    xs = jnp.array([[1, -1, 1], [-1, -1, -1], [2, 3, 4]])
    out = refresh(jax.vmap(keep_positive)(xs))
    assert isinstance(out, list) and [o.tolist() for o in out] == [[1, 1], [], [2, 3, 4]]


def test_doubly_batched_refresh_nests_lists():
    xs = jnp.arange(12).reshape(2, 3, 2) - 5
    out = refresh(jax.vmap(jax.vmap(keep_positive))(xs))
    assert len(out) == 2 and len(out[0]) == 3
    assert [o.tolist() for o in out[1]] == [[1, 2], [3, 4], [5, 6]]


def test_multi_dim_leading_block():
    d = DynArray(jnp.arange(12).reshape(3, 4), [2, 3])
    np.testing.assert_array_equal(refresh(d), np.arange(12).reshape(3, 4)[:2, :3])
