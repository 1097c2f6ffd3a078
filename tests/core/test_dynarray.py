"""DynArray: construction, masks, set_actual_shape / at checks, wire layout, jit/vmap/grad."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

from jaxops import DynArray, refresh


def _random_dyn(rng, rank, fill=-7, max_shape=None):
    if max_shape is None:
        max_shape = tuple(int(d) for d in rng.integers(0, 4, rank))
    actual = [int(rng.integers(0, m + 1)) for m in max_shape]
    data = rng.integers(0, 100, max_shape).astype(np.int32)
    d = DynArray(jnp.asarray(data), actual, fill_value=fill)
    return d, data, actual


def _np_wire(data, actual, fill):
    block = data[tuple(slice(0, a) for a in actual)].reshape(-1)
    out = np.full(data.size, fill, data.dtype)
    out[:block.size] = block
    return out


def _properties(d):
    """numel, valid_mask, overflowed and lost of ``d``, in one program (each eager call
    would trace and lower its own: the values are the same)."""
    return jax.jit(lambda d: (d.numel(), d.valid_mask(), d.overflowed(), d.lost()))(d)


def test_basic_properties():
    d = DynArray(jnp.zeros((4, 3), jnp.float32), [2, 3], fill_value=-1.0)
    assert d.max_shape == (4, 3) and d.ndim == 2 and d.dtype == jnp.float32
    numel, mask, _, _ = _properties(d)
    assert d.actual_shape.dtype == jnp.int32 and int(numel) == 6
    np.testing.assert_array_equal(mask, np.arange(12).reshape(4, 3) < 6)
    f = DynArray.full(jnp.ones((2, 2)))
    _, mask, overflowed, lost = _properties(f)
    assert f.actual_shape.tolist() == [2, 2] and bool(mask.all())
    assert not bool(overflowed) and int(lost) == 0


def test_constructor_checks_rank():
    with pytest.raises(ValueError, match="one entry per axis"):
        DynArray(jnp.zeros((2, 3)), [2])


@pytest.mark.parametrize("bad", [[-1], [4], np.array([7])])
def test_constructor_and_from_wire_check_host_dims(bad):
    with pytest.raises(ValueError, match=r"DynArray: argument 'actual_shape'.*\[0, max\]"):
        DynArray(jnp.arange(3), bad)
    with pytest.raises(ValueError, match=r"DynArray.from_wire: argument 'actual_shape'"):
        DynArray.from_wire(jnp.arange(3), (3,), bad)


def test_refresh_rejects_a_device_shape_outside_the_max():
    bad = DynArray(jnp.arange(3), jnp.array([-1]))  # device values are not checked eagerly
    with pytest.raises(ValueError, match=r"refresh: .*outside its max shape"):
        refresh(bad)
    batched = DynArray(jnp.zeros((2, 3)), np.array([[1], [2]]))  # host values, batched: fine
    assert [r.shape for r in refresh(batched)] == [(1,), (2,)]


def test_true_shape_reports_overflow():
    d = DynArray(jnp.zeros(4), [4], true_shape=[9])
    assert bool(d.overflowed()) and int(d.lost()) == 5
    assert not bool(DynArray(jnp.zeros(4), [3], true_shape=[3]).overflowed())


@pytest.mark.parametrize("bad", [[5, 1], [-1, 1], [1]])
def test_set_actual_shape_raises_eagerly(bad):
    d = DynArray(jnp.zeros((4, 3)), [1, 1])
    with pytest.raises(ValueError, match="set_actual_shape"):
        d.set_actual_shape(bad)


def test_set_actual_shape_in_jit_clamps_and_checkify_reports():
    d = DynArray(jnp.zeros((4, 3)), [1, 1])
    f = jax.jit(lambda d, s: d.set_actual_shape(s))
    assert f(d, jnp.array([9, -2])).actual_shape.tolist() == [4, 0]   # clamped, no error
    assert f(d, jnp.array([3, 2])).actual_shape.tolist() == [3, 2]
    err, out = checkify.checkify(f)(d, jnp.array([9, 1]))
    with pytest.raises(checkify.JaxRuntimeError, match="outside"):
        err.throw()
    err, _ = checkify.checkify(f)(d, jnp.array([2, 1]))
    assert err.get() is None


def test_at_bounds():
    d = DynArray(jnp.arange(12).reshape(4, 3), [2, 2], fill_value=-1)
    assert int(d.at((1, 1))) == 4 and int(d.at((-1, -1))) == 4
    with pytest.raises(IndexError, match="outside the actual shape"):
        d.at((2, 0))
    g = jax.jit(lambda d, i, j: d.at((i, j)))
    assert int(g(d, 1, 0)) == 3 and int(g(d, 3, 0)) == -1
    err, _ = checkify.checkify(g)(d, 3, 0)
    with pytest.raises(checkify.JaxRuntimeError):
        err.throw()


_TO_WIRE = jax.jit(lambda d: (d.to_wire(), d.valid_mask()))  # one program per max shape
_FROM_WIRE = jax.jit(lambda w, a, shape: DynArray.from_wire(w, shape, a, fill_value=-7),
                     static_argnums=2)


@pytest.mark.parametrize("rank", range(0, 9))
def test_wire_round_trip_every_rank(rank):
    """Per rank a max shape (empty axes allowed on even ranks) and three actual shapes
    (traced: one compile per max shape)."""
    rng = np.random.default_rng(rank)
    max_shape = tuple(int(d) for d in rng.integers(rank % 2 == 1, 4, rank))
    for _ in range(3):
        d, data, actual = _random_dyn(rng, rank, max_shape=max_shape)
        wire, mask = _TO_WIRE(d)
        np.testing.assert_array_equal(wire, _np_wire(data, actual, -7))
        want_mask = np.zeros(data.shape, bool)
        want_mask[tuple(slice(0, a) for a in actual)] = True
        np.testing.assert_array_equal(mask, want_mask)
        back = _FROM_WIRE(wire, d.actual_shape, data.shape)
        np.testing.assert_array_equal(back.data, np.where(want_mask, data, -7))
        np.testing.assert_array_equal(refresh(back), data[tuple(slice(0, a) for a in actual)])


def test_from_wire_checks_size():
    with pytest.raises(ValueError, match="expected 6 elements"):
        DynArray.from_wire(jnp.zeros(5), (2, 3), [1, 1])


def test_jit_passes_dynarray_through():
    @jax.jit
    def positive(x):
        keep = x > 0
        order = jnp.argsort(~keep, stable=True)
        return DynArray(x[order], [jnp.sum(keep)], fill_value=0.0)
    out = positive(jnp.array([1.0, -2.0, 3.0, -4.0]))
    assert isinstance(out, DynArray)
    np.testing.assert_array_equal(refresh(out), [1.0, 3.0])


def test_vmap_batches_actual_shape():
    def build(x):
        return DynArray(x, [jnp.sum(x[:, 0] > 0), 2], fill_value=0)
    xs = jnp.array([[[1, 1], [0, 0], [0, 0]], [[1, 1], [1, 1], [0, 0]]])
    # one program (eagerly every vmapped method traces and lowers its own)
    out, numel, mask, wire = jax.jit(lambda xs: (lambda out: (
        out, out.numel(), out.valid_mask(), out.to_wire()))(jax.vmap(build)(xs)))(xs)
    assert out.batch_shape == (2,) and out.max_shape == (3, 2)
    assert out.actual_shape.tolist() == [[1, 2], [2, 2]]
    np.testing.assert_array_equal(numel, [2, 4])
    assert [a.tolist() for a in refresh(out)] == [[[1, 1]], [[1, 1], [1, 1]]]
    assert mask.shape == (2, 3, 2)
    np.testing.assert_array_equal(mask, [[[1, 1], [0, 0], [0, 0]], [[1, 1], [1, 1], [0, 0]]])
    assert wire.shape == (2, 6)
    np.testing.assert_array_equal(wire, [[1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0]])


def test_vmap_inside_sees_unbatched():
    def inner(d):
        assert d.batch_shape == ()
        return d.set_actual_shape(jnp.stack([d.actual_shape[0] - 1]))
    def outer(x):  # one program for both vmaps
        return jax.vmap(inner)(jax.vmap(lambda x: DynArray(x, [3]))(x))
    assert jax.jit(outer)(jnp.zeros((2, 4))).actual_shape.tolist() == [[2], [2]]


def test_grad_padding_gets_zero():
    def loss(x):
        return jnp.sum(DynArray(x * 2.0, [2]).valid_data() ** 2)
    g = jax.jit(jax.grad(loss))(jnp.array([1.0, 2.0, 3.0, 4.0]))
    chex.assert_trees_all_close(g, jnp.array([8.0, 16.0, 0.0, 0.0]))


def test_repr_mentions_shapes():
    r = repr(DynArray(jnp.zeros(3), [1]))
    assert "max_shape=(3,)" in r and "actual_shape" in r


def test_nan_fill_value_does_not_retrace_and_passes_cond():
    traces = []

    @jax.jit
    def f(d):
        traces.append(1)
        return jax.lax.cond(d.actual_shape[0] > 1, lambda d: d, lambda d: d, d)

    d = DynArray(jnp.array([1.0, 2.0, jnp.nan]), [2], fill_value=float("nan"))
    for _ in range(3):
        out = f(d)
    assert len(traces) == 1 and np.isnan(out.fill_value)
    chex.assert_trees_all_equal(refresh(out), np.array([1.0, 2.0], np.float32))
