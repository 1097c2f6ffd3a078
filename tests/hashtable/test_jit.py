"""Tables inside jit, lax.scan (a small training loop) and vmap, with x64 off and on."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxops
from jaxops.core.errors import OpArgumentError
import jaxops.hashtable as ht
from tests.helpers.hashtable_reference import RefTable, assert_same_table, table_snapshot

SIZE, DIM, N, STEPS = 64, 4, 8, 6


def _train_step(carry, keys):
    table, state = carry
    table, rows, info = ht.lookup_or_insert(table, keys, filter_mode="counter", filter_freq=2)
    grads = jax.grad(lambda r: jnp.sum((r - 1.0) ** 2))(rows)
    table, state = ht.apply_adam_w(table, state, keys, grads, lr=0.05, weight_decay=0.01)
    return (table, state), jnp.sum((rows - 1.0) ** 2)


def _batches(dtype):
    rng = np.random.default_rng(0)
    return jnp.asarray(rng.integers(-20, 20, (STEPS, N)), dtype)


@pytest.mark.parametrize("x64", [False, True])
def test_scan_training_loop_equals_step_by_step(x64):
    with jax.enable_x64(x64):
        batches = _batches(jnp.int64 if x64 else jnp.int32)
        # JAX int32 ids into a jitted step: the table says its ids are 32-bit (a 64-bit
        # table refuses them with x64 off: they may be narrowed 64-bit ids).
        table = ht.init_table(SIZE, DIM, key=jax.random.key(0),
                              key_dtype=np.int64 if x64 else np.int32)
        carry = (table, ht.adam_w_init(table))
        (scanned, scanned_state), losses = jax.jit(lambda c, b: jax.lax.scan(_train_step, c, b))(
            carry, batches)
        step = jax.jit(_train_step)
        for k in range(STEPS):
            carry, loss = step(carry, batches[k])
            np.testing.assert_allclose(float(loss), float(losses[k]), rtol=1e-5)
        got, want = table_snapshot(scanned), table_snapshot(carry[0])
        chex.assert_trees_all_close(got.pop("values"), want.pop("values"), rtol=1e-5, atol=1e-6)
        chex.assert_trees_all_equal(got, want)
        assert int(scanned_state.skipped) == int(carry[1].skipped)
        assert float(losses[-1]) < float(losses[1])  # the loop learns


@pytest.mark.parametrize("x64", [False, True])
def test_jitted_ops_match_reference(x64):
    with jax.enable_x64(x64):
        rng = np.random.default_rng(1)
        init = rng.standard_normal((SIZE, DIM)).astype(np.float32)
        ref = RefTable(init)
        keys = rng.integers(-2**62, 2**62, 40)
        words = ht.words.as_words(keys, "test", "keys")  # jit arguments: words work in both modes
        ops = jax.jit(lambda t, k: ht.evict(ht.lookup_or_insert(t, k)[0], ht.words.Words64(k.lo[:5], k.hi[:5])))
        table = ops(ht.init_table(SIZE, DIM, sampled_values=init), words)
        ref.lookup_or_insert(keys)
        ref.evict(keys[:5])
        assert_same_table(table, ref)
        table, keys_out, *_ = jax.jit(lambda t: ht.export(t, export_mode="new"))(table)
        assert sorted(ht.words.to_host_int64(jaxops.refresh(keys_out)).tolist()) == \
            sorted(ref.export("new")["keys"].tolist())
        assert int(table.not_exported) == ref.not_exported == 0
        found = jax.jit(lambda t, k: ht.find(t, k)[1])(table, ht.words.as_words(keys[3:7]))
        assert found.tolist() == [False, False, True, True]  # keys 0-4 were evicted


def test_lookup_or_insert_does_not_retrace():
    table = ht.init_table(SIZE, DIM, initializer_mode="constant", key_dtype=np.int32)

    @jax.jit
    @chex.assert_max_traces(n=1)
    def step(t, k):
        return ht.lookup_or_insert(t, k)[0]

    for seed in range(3):
        table = step(table, jnp.asarray(np.random.default_rng(seed).integers(0, 50, N), jnp.int32))
    assert int(table.live) > 0


def test_find_under_vmap_over_key_batches():
    table = ht.init_table(SIZE, DIM, initializer_mode="constant", constant_value=2.0,
                          key_dtype=np.int32)
    table, _, _ = ht.lookup_or_insert(table, np.arange(10, dtype=np.int64))
    batches = jnp.asarray(np.arange(24).reshape(3, 8), jnp.int32)
    rows, found = jax.vmap(lambda k: ht.find(table, k))(batches)
    chex.assert_trees_all_equal(np.asarray(found), np.arange(24).reshape(3, 8) < 10)
    assert rows.shape == (3, 8, DIM)


@pytest.mark.x64_off
def test_a_64_bit_table_refuses_ids_jax_may_have_narrowed():
    table = ht.init_table(SIZE, DIM, initializer_mode="constant")
    ids = np.array([2**40 + 5, 5], np.int64)  # two ids that narrow to the same int32
    with pytest.raises(OpArgumentError, match=r"argument 'keys'.*JAX int32 "
                                                            r"array.*narrowed.*as_words"):
        jax.jit(lambda t, k: ht.lookup_or_insert(t, k))(table, ids)
    table, _, info = jax.jit(lambda t, k: ht.lookup_or_insert(t, k))(
        table, ht.words.as_words(ids))
    assert int(info.inserted) == 2  # as word pairs both ids arrive whole
    small = ht.init_table(SIZE, DIM, initializer_mode="constant", key_dtype=np.int32)
    small, _, info = jax.jit(lambda t, k: ht.lookup_or_insert(t, k))(
        small, jnp.array([7, -7], jnp.int32))
    assert int(info.inserted) == 2 and ht.host_keys(small, jaxops.refresh(
        ht.export(small)[1])).dtype == np.int32
    with pytest.raises(OpArgumentError, match=r"int32 keys in \[-2\*\*31, 2\*\*31\) \(the "
                                              r"table's key_dtype\), got 1099511627776"):
        ht.lookup_or_insert(small, np.array([2**40], np.int64))


@pytest.mark.x64_off
def test_word_pairs_given_as_keys_are_refused_naming_host_keys():
    table = ht.init_table(SIZE, DIM, initializer_mode="constant")
    table, _, _ = ht.lookup_or_insert(table, np.array([2**40 + 5, 5], np.int64))
    _, keys, *_ = ht.export(table)
    pairs = np.asarray(jaxops.refresh(keys))  # x64 off: [2, 2] uint32 word pairs
    assert pairs.shape == (2, 2) and pairs.dtype == np.uint32
    with pytest.raises(OpArgumentError, match=r"find: argument 'keys'.*word "
                                                            r"pairs.*host_keys"):
        ht.find(table, pairs)
    assert bool(np.all(np.asarray(ht.find(table, ht.host_keys(table, pairs))[1])))
