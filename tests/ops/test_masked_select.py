"""MaskedSelect against numpy boolean indexing, with gradients and both impl modes."""

import chex
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jaxops
from jaxops.core.errors import OpArgumentError, OpDTypeError
from jaxops.core.impl_mode import OpImplMode
from tests.helpers.cases.masked_select import ref_masked_select, ref_masked_select_grad
from tests.helpers.util import expected_truncation

SHAPES = [((), ()), ((3, 4), (4,)), ((1, 4), (3, 1)), ((2, 1, 3, 2), (1, 4, 3, 1)), ((3,), ())]


@pytest.mark.parametrize("dtype", [np.bool_, np.int32, ml_dtypes.bfloat16,
                                   np.float32], ids=lambda d: np.dtype(d).name)
def test_random_broadcasts_match_numpy(dtype):
    rng = np.random.default_rng(0)
    for xs, ms in SHAPES:
        x = np.asarray(rng.standard_normal(xs) * 4).astype(dtype)
        mask = np.asarray(rng.random(ms) < 0.5)
        chex.assert_trees_all_equal(jaxops.refresh(jaxops.masked_select(x, mask)),
                                    ref_masked_select(x, mask))


def test_large_input_blocked_path_and_uint8_mask():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((300, 100)).astype(np.float32)
    mask = rng.integers(0, 4, (300, 100)).astype(np.uint8) * (rng.random((300, 100)) < 0.3)
    got = jax.jit(lambda x, m: jaxops.masked_select(x, m, size=12000))(x, mask)
    chex.assert_trees_all_equal(jaxops.refresh(got), ref_masked_select(x, mask, 12000))


def test_none_all_empty_and_nan_values():
    x = np.array([np.nan, 1.0, -0.0], np.float32)
    chex.assert_shape(jaxops.refresh(jaxops.masked_select(x, np.zeros(3, bool))), (0,))
    got = jaxops.refresh(jaxops.masked_select(x, np.ones(3, bool)))
    np.testing.assert_array_equal(got, x)
    assert np.signbit(got[2])  # values are copied bit for bit
    chex.assert_shape(jaxops.refresh(jaxops.masked_select(np.zeros((0, 3)), np.ones(3, bool))),
                      (0,))


def test_capacity_exact_overflow_and_padding():
    x = np.arange(1, 9, dtype=np.float32)
    mask = x % 2 == 0  # 4 selected
    f = jax.jit(lambda x, m: (lambda d: (d, d.overflowed(), d.lost()))(
        jaxops.masked_select(x, m, size=4)))
    d, over, lost = f(x, mask)
    chex.assert_trees_all_equal(jaxops.refresh(d), np.array([2, 4, 6, 8], np.float32))
    assert not bool(over) and int(lost) == 0
    with expected_truncation():
        d = jaxops.masked_select(x, mask, size=3, overflow="truncate")
    chex.assert_trees_all_equal((jaxops.refresh(d, allow_truncated=True), bool(d.overflowed()),
                                 int(d.lost())),
                                (np.array([2, 4, 6], np.float32), True, 1))
    d = jaxops.masked_select(x, mask, size=6)
    chex.assert_trees_all_equal(np.asarray(d.data[4:]), np.zeros(2, np.float32))  # padding 0


@pytest.mark.parametrize("mode", ["high_precision", "high_performance"])
@pytest.mark.parametrize("xs,ms,size", [((4, 5), (4, 5), None), ((1, 5), (3, 1, 5), None),
                                        ((6,), (6,), 2)])
def test_gradient_flows_to_selected_positions(mode, xs, ms, size):
    rng = np.random.default_rng(2)
    x = rng.standard_normal(xs).astype(np.float32)
    mask = rng.random(ms) < 0.6
    with expected_truncation():
        d = jaxops.masked_select(x, mask, size=size, impl_mode=mode, overflow="truncate")
    ct = rng.standard_normal(d.shape).astype(np.float32)
    grad = jax.jit(jax.grad(lambda x: jnp.sum(ct * jaxops.masked_select(  # jitted: one program
        x, mask, size=size, impl_mode=mode).valid_data(0))))(x)
    chex.assert_trees_all_close(np.asarray(grad), ref_masked_select_grad(x, mask, ct, size)[0],
                                rtol=1e-6, atol=1e-6)


def test_high_precision_accumulates_broadcast_bf16_gradients_in_float32():
    x = jnp.zeros((1, 3), jnp.bfloat16)
    mask = jnp.ones((500, 3), bool)
    ct = jnp.full((1500,), 1.01, jnp.bfloat16)  # 1.01 rounds to 1.0078125 in bfloat16

    def grad(mode):
        return jax.jit(jax.grad(lambda x: jnp.sum(  # jitted: one program
            (ct * jaxops.masked_select(x, mask, impl_mode=mode).valid_data()).astype(
                jnp.float32))))(x)

    exact = np.float32(ml_dtypes.bfloat16(1.01)) * 500  # 503.9; bfloat16 rounds it to 504
    precise, fast = grad("high_precision"), grad("high_performance")
    chex.assert_trees_all_equal(np.asarray(precise, np.float32),
                                np.full((1, 3), np.float32(ml_dtypes.bfloat16(exact))))
    assert abs(float(fast[0, 0]) - exact) > abs(float(precise[0, 0]) - exact)
    # The forward values are identical in both modes.
    chex.assert_trees_all_equal(
        jaxops.refresh(jaxops.masked_select(x, mask, impl_mode="high_performance")),
        jaxops.refresh(jaxops.masked_select(x, mask, impl_mode="high_precision")))


def test_impl_modes_are_declared_and_default_is_high_precision():
    op = jaxops.get_op("MaskedSelect")
    assert op.select_mode(None) == OpImplMode.HIGH_PRECISION
    assert op.select_mode("high_performance") == OpImplMode.HIGH_PERFORMANCE


def test_vmap_over_masks():
    rng = np.random.default_rng(3)
    x = rng.standard_normal(8).astype(np.float32)
    masks = rng.random((4, 8)) < np.linspace(0, 1, 4)[:, None]
    out = jaxops.refresh(jax.vmap(lambda m: jaxops.masked_select(x, m, size=5))(masks),
                         allow_truncated=True)
    for got, m in zip(out, masks):
        chex.assert_trees_all_equal(got, ref_masked_select(x, m, 5))


def test_bad_inputs_name_the_operator_and_argument():
    with pytest.raises(OpArgumentError, match="MaskedSelect: argument 'mask'"):
        jaxops.masked_select(jnp.ones(3), jnp.ones(4, bool))
    with pytest.raises(OpDTypeError, match="MaskedSelect: argument 'mask'"):
        jaxops.masked_select(jnp.ones(3), jnp.ones(3))
    with pytest.raises(OpArgumentError, match="MaskedSelect: argument 'size'"):
        jaxops.masked_select(jnp.ones(3), jnp.ones(3, bool), size=-2)
    with pytest.raises(OpArgumentError, match="MaskedSelect: argument 'mask'"):
        jaxops.get_op("MaskedSelect").infer([np.ones(3), np.ones(2, bool)])
