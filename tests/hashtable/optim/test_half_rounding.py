"""Updates of half rows (issue 39 part 3) round stochastically: each value lands on one of the
two half values around the float32 result, up with the probability that makes the expected
row the exact one, so many updates below half a step accumulate (round-to-nearest loses them
all). References: every half value enumerated from its bits (float64), numpy optimizers in
float64."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jaxops.hashtable as ht
from jaxops import native
from jaxops.hashtable._table.row_dtype import stochastic_round
from tests.helpers.walk_paths import on_path

HALF = [jnp.bfloat16, jnp.float16]
NP = {jnp.bfloat16: ml_dtypes.bfloat16, jnp.float16: np.float16}


def _finite_values(dtype) -> np.ndarray:
    """Every finite value of the half dtype, ascending, as float64 (from all 2**16 bits)."""
    with np.errstate(invalid="ignore"):
        v = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(NP[dtype]).astype(
            np.float64)
    return np.unique(v[np.isfinite(v)])


def _samples(dtype):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(48) * 10.0 ** rng.integers(-6, 4, 48)
    # float16 subnormals and below its smallest; (bfloat16's subnormals are float32's, which
    # XLA:CPU's arithmetic flushes to zero: not sampled)
    tiny = [3e-8, -3e-8, 1e-6, -2e-5, 1e-30, 0.0]
    return np.concatenate([x, tiny]).astype(np.float32)


@pytest.mark.parametrize("dtype", HALF)
def test_stochastic_round_has_the_exact_expectation(dtype):
    x = _samples(dtype)
    grid = _finite_values(dtype)
    x64 = x.astype(np.float64)
    hi = grid[np.searchsorted(grid, x64, side="left")]  # the half values around x
    lo = grid[np.searchsorted(grid, x64, side="right") - 1]
    p_up = np.where(hi > lo, (x64 - lo) / np.where(hi > lo, hi - lo, 1), 0)
    n = 4096  # draws spread evenly over [0, 1): the fraction rounded up is exact
    bits = (np.arange(n, dtype=np.uint64) * 2**32 // n).astype(np.uint32)
    out = np.asarray(jax.jit(stochastic_round, static_argnums=1)(
        jnp.broadcast_to(jnp.asarray(x), (n, x.size)), dtype,
        jnp.broadcast_to(jnp.asarray(bits)[:, None], (n, x.size))).astype(jnp.float32),
                     np.float64)
    assert np.all((out == lo) | (out == hi))  # only the two neighbours
    up = np.mean(out == hi, axis=0)
    # the draw is 24 bits: the probability is met to within one draw in n
    np.testing.assert_allclose(up, np.where(hi > lo, p_up, up), atol=1.5 / n)
    # so the mean of the draws is x to within one draw's share of the step
    assert np.all(np.abs(out.mean(axis=0) - x64) <= 1.5 / n * (hi - lo))


@pytest.mark.parametrize("dtype", HALF)
def test_stochastic_round_keeps_exact_infinite_and_nan(dtype):
    big = {jnp.bfloat16: 3.4e38, jnp.float16: 1e30}[dtype]  # rounds to inf (past the range)
    x = jnp.asarray([1.0, -0.5, 0.0, np.inf, -np.inf, np.nan, big, -big], jnp.float32)
    for b in (0, 2**31, 2**32 - 1):
        out = stochastic_round(x, dtype, jnp.full(x.shape, b, jnp.uint32))
        with np.errstate(over="ignore"):
            want = np.asarray(x).astype(NP[dtype])
        np.testing.assert_array_equal(np.asarray(out).astype(np.float32),
                                      want.astype(np.float32))


def _sgd_run(dtype, steps, lr=1e-4):
    keys = np.arange(256, dtype=np.int64)
    t = ht.init_table(512, 4, initializer_mode="constant", constant_value=1.0, dtype=dtype)
    t, _, info = ht.lookup_or_insert(t, keys)
    opt = ht.optim.sgd(lr)
    step = jax.jit(opt.update, donate_argnums=(0, 1))
    state = opt.init(t)
    for _ in range(steps):  # the same gradient, no lookups between: only the count varies
        t, state = step(t, state, info.slots, jnp.ones((256, 4)))
    return np.asarray(ht.find(t, keys)[0], np.float64), state


@pytest.mark.parametrize("dtype", HALF)
def test_many_small_updates_accumulate_in_expectation(dtype):
    steps, lr = 100, 1e-4
    rows, state = _sgd_run(dtype, steps, lr)
    exact = 1.0 - steps * lr  # float64 reference
    # round-to-nearest loses every step: 1 - 1e-4 rounds back to 1 in both halves
    assert float(np.float32(1 - lr).astype(NP[dtype])) == 1.0
    # each step is up or down by one spacing s (bfloat16 below 1: 2**-8; float16: 2**-11)
    # with variance < s**2 / 4: the mean of 1024 values is within 5 sigma
    s = {jnp.bfloat16: 2.0**-8, jnp.float16: 2.0**-11}[dtype]
    sigma = np.sqrt(steps * s**2 / 4 / rows.size)
    assert abs(rows.mean() - exact) < 5 * sigma, (rows.mean(), exact)
    assert int(state.rounding) == steps


def test_a_step_lands_on_a_neighbour_of_the_float64_adagrad():
    dtype = jnp.bfloat16
    rng = np.random.default_rng(1)
    w0 = rng.standard_normal((64, 4)).astype(np.float32)
    g = rng.standard_normal((64, 4)).astype(np.float32)
    t = ht.init_table(128, 4, initializer_mode="constant", dtype=dtype)
    t, info = ht.import_(t, np.arange(64, dtype=np.int64), np.zeros(64, np.uint64),
                         np.ones(64, np.uint8), w0)
    opt = ht.optim.adagrad(0.5, initial_accumulator_value=0.1, eps=1e-7)
    state = opt.init(t)
    assert state.sum_of_squares.dtype == jnp.float32 and int(state.rounding) == 0
    t, state = opt.update(t, state, info.slots, jnp.asarray(g))
    w = np.asarray(w0.astype(ml_dtypes.bfloat16), np.float64)  # the rows held
    acc = 0.1 + g.astype(np.float64) ** 2
    want = w - 0.5 * g / np.sqrt(acc + 1e-7)
    grid = _finite_values(dtype)
    got = np.asarray(ht.find(t, np.arange(64, dtype=np.int64))[0], np.float64)
    lo = grid[np.searchsorted(grid, want, side="right") - 1]
    hi = grid[np.searchsorted(grid, want, side="left")]
    # float32 arithmetic may move the result past a grid point by its own rounding
    assert np.all((got >= lo - 2e-7 * np.abs(want)) & (got <= hi + 2e-7 * np.abs(want)))
    np.testing.assert_allclose(np.asarray(state.sum_of_squares)[np.asarray(info.slots)], acc,
                               rtol=1e-6)


def test_state_dtype_and_float32_tables_unchanged():
    t32 = ht.init_table(16, 2, initializer_mode="constant")
    s32 = ht.optim.adam(0.1).init(t32)
    assert s32.rounding is None and s32.mu.dtype == jnp.float32
    half = ht.init_table(16, 2, initializer_mode="constant", dtype=jnp.float16)
    s = ht.optim.adam(0.1, state_dtype=jnp.bfloat16).init(half)
    assert s.mu.dtype == s.nu.dtype == jnp.bfloat16 and s.rounding.dtype == jnp.uint32
    assert ht.optim.ftrl(0.1).init(half).linear.dtype == jnp.float32


@pytest.mark.skipif(not native.available(), reason="native kernels unavailable")
def test_native_and_xla_updates_round_alike():
    def run():
        t = ht.init_table(64, 3, initializer_mode="constant", constant_value=0.25,
                          dtype=jnp.bfloat16)
        opt = ht.optim.rowwise_adagrad(0.01)
        state = opt.init(t)

        @jax.jit
        def step(t, state, keys, g):
            t, _, info = ht.lookup_or_insert(t, keys)
            return opt.update(t, state, info.slots, g)

        keys = ht.words.as_words(np.array([1, 2, 3, 1, 9], np.int64))
        for i in range(3):
            t, state = step(t, state, keys, jnp.full((5, 3), 0.1 * (i + 1)))
        return t.values

    native_rows = on_path("native", run)
    xla_rows = on_path("xla", run)
    np.testing.assert_array_equal(np.asarray(native_rows), np.asarray(xla_rows))


def test_cann_adam_w_on_half_rows_lands_next_to_the_float64_step():
    rng = np.random.default_rng(2)
    w0 = rng.standard_normal((32, 4)).astype(np.float32)
    g = rng.standard_normal((32, 4)).astype(np.float32)
    t = ht.init_table(64, 4, initializer_mode="constant", dtype=jnp.bfloat16)
    keys = np.arange(32, dtype=np.int64)
    t, _ = ht.import_(t, keys, np.zeros(32, np.uint64), np.ones(32, np.uint8), w0)
    lr, wd, b1, b2, eps = 0.01, 0.1, 0.9, 0.999, 1e-8
    t, state = ht.apply_adam_w(t, ht.adam_w_init(t), keys, g, lr=lr, weight_decay=wd, beta1=b1,
                               beta2=b2, epsilon=eps)
    w = np.asarray(w0.astype(ml_dtypes.bfloat16), np.float64)
    g64 = g.astype(np.float64)
    want = w * (1 - lr * wd) - lr * g64 / (np.abs(g64) + eps)  # bias-corrected first step
    grid = _finite_values(jnp.bfloat16)
    got = np.asarray(ht.find(t, keys)[0], np.float64)
    lo = grid[np.searchsorted(grid, want, side="right") - 1]
    hi = grid[np.searchsorted(grid, want, side="left")]
    assert np.all((got >= lo - 1e-6 * np.abs(want)) & (got <= hi + 1e-6 * np.abs(want)))
    assert t.values.dtype == jnp.bfloat16 and state.m.dtype == jnp.float32
