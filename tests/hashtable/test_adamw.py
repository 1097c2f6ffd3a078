"""In-table AdamW against optax.adamw (row by row) and the sequential Ascend-formula reference."""

import chex
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxops.hashtable as ht
from tests.helpers.hashtable_reference import RefAdamW, RefTable, assert_same_table

STEPS, SIZE, DIM = 12, 24, 3  # the differential tests' shapes: kernels compile once


def _filled_table(keys, rng):
    init = rng.standard_normal((SIZE, DIM)).astype(np.float32)
    t = ht.init_table(SIZE, DIM, sampled_values=init)
    t, _, _ = ht.lookup_or_insert(t, keys)
    ref = RefTable(init)
    ref.lookup_or_insert(keys)
    return t, ref


@pytest.mark.parametrize("lr,wd", [(0.05, 0.01), (1e-3, 0.0)])
def test_touched_rows_follow_optax_adamw(lr, wd):
    rng = np.random.default_rng(0)
    keys = np.array([11, -3, 2**40, 7, 8], np.int64)
    t, _ = _filled_table(keys, rng)
    slots = np.asarray(ht.locate(t, keys))
    params, before = t.values[slots], np.asarray(t.values)
    opt = optax.adamw(lr, b1=0.9, b2=0.999, eps=1e-8, weight_decay=wd)
    opt_state = opt.init(params)
    state = ht.adam_w_init(t)
    for _ in range(STEPS):
        grads = jnp.asarray(rng.standard_normal((len(keys), DIM)).astype(np.float32))
        updates, opt_state = opt.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        t, state = ht.apply_adam_w(t, state, keys, grads, lr=lr, weight_decay=wd)
    chex.assert_trees_all_close(np.asarray(t.values[slots]), np.asarray(params),
                                rtol=2e-5, atol=1e-6)
    chex.assert_trees_all_close(np.asarray(state.m[slots]), np.asarray(opt_state[0].mu),
                                rtol=1e-5, atol=1e-7)
    untouched = np.setdiff1d(np.arange(SIZE), slots)
    chex.assert_trees_all_equal(np.asarray(t.values[untouched]), before[untouched])


@pytest.mark.parametrize("amsgrad,maximize", [(True, False), (False, True)])
def test_matches_the_sequential_reference(amsgrad, maximize):
    rng = np.random.default_rng(1)
    keys = rng.integers(0, 20, 15)
    t, ref = _filled_table(keys, rng)
    t = ht.evict(t, keys[:2])
    ref.evict(keys[:2])
    state, ref_state = ht.adam_w_init(t, amsgrad=amsgrad), RefAdamW(ref, amsgrad=amsgrad)
    for _ in range(5):
        batch = np.concatenate([rng.choice(keys, 6), [-1, 999]])  # duplicates, unused, absent
        grads = rng.standard_normal((8, DIM)).astype(np.float32)
        t, state = ht.apply_adam_w(t, state, batch, grads, lr=0.1, weight_decay=0.05,
                                   amsgrad=amsgrad, maximize=maximize)
        ref_state.apply(ref, batch, grads, lr=0.1, weight_decay=0.05, maximize=maximize)
    assert int(state.skipped) == ref_state.skipped >= 10
    assert_same_table(t, ref, rtol=1e-5)
    chex.assert_trees_all_close(np.asarray(state.v), ref_state.v, rtol=1e-5, atol=1e-8)
    if amsgrad:
        chex.assert_trees_all_close(np.asarray(state.max_v), ref_state.max_v, rtol=1e-5, atol=1e-8)
    assert np.isclose(float(state.beta1_power), 0.9 ** 5, rtol=1e-6)


def test_duplicate_gradients_are_summed():
    rng = np.random.default_rng(2)
    t, _ = _filled_table(np.array([4], np.int64), rng)
    g = rng.standard_normal((3, DIM)).astype(np.float32)
    once, _ = ht.apply_adam_w(t, ht.adam_w_init(t), np.array([4]), g.sum(0, keepdims=True),
                              lr=0.1, weight_decay=0.0)
    split, _ = ht.apply_adam_w(t, ht.adam_w_init(t), np.array([4, 4, 4]), g,
                               lr=0.1, weight_decay=0.0)
    chex.assert_trees_all_close(np.asarray(once.values), np.asarray(split.values), rtol=1e-6)


def test_amsgrad_needs_an_amsgrad_state():
    t = ht.init_table(4, 1, initializer_mode="constant")
    with pytest.raises(ValueError, match="EmbeddingHashTableApplyAdamW: argument 'state'"):
        ht.apply_adam_w(t, ht.adam_w_init(t), np.array([1]), np.zeros((1, 1)), lr=0.1,
                        weight_decay=0.0, amsgrad=True)
