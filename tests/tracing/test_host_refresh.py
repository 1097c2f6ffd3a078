"""tracing.host_refresh: exact arrays on the host from inside jit, scan and vmap."""

import jax
import jax.numpy as jnp
import numpy as np

from jaxops import DynArray
from tracing import host_refresh


def _positives(x):
    keep = x > 0
    order = jnp.argsort(~keep, stable=True)
    return DynArray(x[order], [jnp.sum(keep)], fill_value=0)


def test_inside_jit_with_other_leaves():
    seen = []

    @jax.jit
    def f(x):
        host_refresh({"kept": _positives(x), "total": x.sum(), "tag": "frame"}, seen.append)
        return x * 2

    np.testing.assert_array_equal(f(jnp.array([3, -1, 4])), [6, -2, 8])
    jax.effects_barrier()
    assert len(seen) == 1
    assert seen[0]["kept"].tolist() == [3, 4] and int(seen[0]["total"]) == 6
    assert seen[0]["tag"] == "frame"


def test_streams_every_step_of_a_scan_in_order():
    frames = jnp.array([[1, -1, 1, 1], [-1, -1, -1, -1], [5, 6, -7, 8]])
    seen = []

    def step(carry, frame):
        host_refresh(_positives(frame), lambda exact: seen.append(exact.tolist()))
        return carry + 1, None

    jax.jit(lambda xs: jax.lax.scan(step, 0, xs))(frames)
    jax.effects_barrier()
    assert seen == [[1, 1, 1], [], [5, 6, 8]]


def test_vmap_calls_back_once_per_example():
    seen = []

    def per_image(x):
        host_refresh(_positives(x), lambda exact: seen.append(exact.tolist()))
        return x.sum()

    jax.jit(jax.vmap(per_image))(jnp.array([[1, 0, 2], [0, 0, 0], [-3, 4, 5]]))
    jax.effects_barrier()
    assert seen == [[1, 2], [], [4, 5]]


def test_nested_vmap_and_unbatched_leaves():
    seen = []

    def f(x, bias):
        host_refresh({"d": _positives(x), "bias": bias}, lambda t: seen.append(
            (t["d"].tolist(), int(t["bias"]))))
        return x

    xs = jnp.arange(8).reshape(2, 2, 2) - 3
    jax.vmap(jax.vmap(f, in_axes=(0, None)), in_axes=(0, None))(xs, jnp.int32(7))
    jax.effects_barrier()
    assert seen == [([], 7), ([], 7), ([1, 2], 7), ([3, 4], 7)]


def test_unordered_mode_delivers_everything():
    seen = []

    @jax.jit
    def f(x):
        host_refresh(_positives(x), lambda e: seen.append(e.size), ordered=False)
        return x

    for i in range(3):
        f(jnp.arange(4) - i)
    jax.effects_barrier()
    assert sorted(seen) == [1, 2, 3]
