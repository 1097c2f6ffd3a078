"""Row optimizers (jaxops.hashtable.optim) against optax applied row by row, and numpy.

Every case runs the same lazy-update loop: random batches of slots with duplicates and
absent entries (-1); the reference keeps one optimizer state per row and steps a row only
when the batch touches it, with the batch's gradients of that row summed.
"""

import warnings

import chex
import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxops.hashtable as ht
from jaxops.core.errors import OpArgumentError, OpDTypeError
from tests.helpers.util import seed_of

SIZE, DIM, ROWS, BATCH, STEPS = 61, 3, 9, 12, 6


def _optax_ref(tx):
    """Per-row optax: ``init(params [R, D])`` and ``step(params, state, g)`` vmapped."""
    update = jax.jit(jax.vmap(tx.update))
    return jax.vmap(tx.init), lambda p, s, g: _apply_updates(p, *update(g, s, p))


def _apply_updates(params, updates, state):
    return optax.apply_updates(params, updates), state


def _rowwise_adagrad_ref(lr, init=0.0, eps=1e-8):
    def step(w, acc, g):
        acc = acc + np.mean(g * g, axis=-1)
        return w - lr * g / (np.sqrt(acc) + eps)[:, None], acc
    return lambda p: np.full(p.shape[:1], init), step


def _ftrl_ref(lr, power=-0.5, init=0.1, l1=0.0, l2=0.0, shrink=0.0, beta=0.0):
    """TensorFlow's ApplyFtrlV2 (training_ops.cc) with Keras' beta folded into l2, float64."""
    def step(w, state, g):
        n, z = state
        n_new = n + g * g
        z = z + (g + 2 * shrink * w) - (n_new ** -power - n ** -power) / lr * w
        quad = n_new ** -power / lr + 2 * (l2 + beta / (2 * lr))
        w = np.where(np.abs(z) > l1, (np.sign(z) * l1 - z) / quad, 0.0)
        return w, (n_new, z)
    return lambda p: (np.full(p.shape, init), np.zeros(p.shape)), step


CASES = {
    "sgd": (lambda: ht.optim.sgd(0.3), lambda: _optax_ref(optax.sgd(0.3))),
    "adagrad": (lambda: ht.optim.adagrad(0.2, initial_accumulator_value=0.05, eps=1e-6),
                lambda: _optax_ref(optax.adagrad(0.2, initial_accumulator_value=0.05, eps=1e-6))),
    "adam": (lambda: ht.optim.adam(0.05, b1=0.8, b2=0.95, eps=1e-6),
             lambda: _optax_ref(optax.adam(0.05, b1=0.8, b2=0.95, eps=1e-6))),
    "adamw": (lambda: ht.optim.adamw(0.05, eps_root=1e-9, weight_decay=0.1),
              lambda: _optax_ref(optax.adamw(0.05, eps_root=1e-9, weight_decay=0.1))),
    "rowwise_adagrad": (lambda: ht.optim.rowwise_adagrad(0.2, initial_accumulator_value=0.1),
                        lambda: _rowwise_adagrad_ref(0.2, init=0.1)),
    "ftrl": (lambda: ht.optim.ftrl(0.5, l1=0.05, l2=0.02, l2_shrinkage=0.01, beta=0.1),
             lambda: _ftrl_ref(0.5, l1=0.05, l2=0.02, shrink=0.01, beta=0.1)),
    "ftrl_power": (lambda: ht.optim.ftrl(0.3, learning_rate_power=-0.7, l1=0.01),
                   lambda: _ftrl_ref(0.3, power=-0.7, l1=0.01)),
    "from_optax_momentum": (lambda: ht.optim.from_optax(optax.sgd(0.1, momentum=0.9)),
                            lambda: _optax_ref(optax.sgd(0.1, momentum=0.9))),
    "from_optax_rmsprop": (lambda: ht.optim.from_optax(optax.rmsprop(0.01, decay=0.8)),
                           lambda: _optax_ref(optax.rmsprop(0.01, decay=0.8))),
}


def _where_rows(mask, new, old):
    def pick(a, b):
        m = np.asarray(mask).reshape(-1, *([1] * (np.ndim(a) - 1)))
        return np.where(m, np.asarray(a), np.asarray(b))
    return jax.tree.map(pick, new, old)


def _vocab_table(rng):
    init = rng.standard_normal((SIZE, DIM)).astype(np.float32)
    t = ht.init_table(SIZE, DIM, sampled_values=init)
    keys = np.concatenate([rng.integers(-2**62, 2**62, ROWS - 1), [-1]])
    t, _, info = ht.lookup_or_insert(t, keys)
    slots = np.asarray(info.slots)
    assert (slots >= 0).all() and len(set(slots.tolist())) == ROWS
    return t, slots


def _batches(rng):
    for _ in range(STEPS):
        idx = rng.integers(-1, ROWS // 2 + 2, BATCH)  # duplicates; -1 = absent; rows unused
        idx[0] = -1  # at least one absent entry a batch, whatever the seed
        yield idx, rng.standard_normal((BATCH, DIM)).astype(np.float32)


def _run_lazy_reference(make_ref, params, batches):
    init, step = make_ref()
    state = init(params)
    for idx, g in batches:
        gsum = np.zeros(params.shape, g.dtype)
        np.add.at(gsum, idx[idx >= 0], g[idx >= 0])
        touched = np.bincount(idx[idx >= 0], minlength=ROWS) > 0
        new_params, new_state = step(params, state, gsum)
        params, state = _where_rows(touched, new_params, params), _where_rows(touched, new_state,
                                                                                state)
    return params


@pytest.mark.parametrize("name,x64", [(name, False) for name in sorted(CASES)] + [
    (name, True) for name in ("adam", "adagrad", "adamw", "ftrl", "from_optax_rmsprop",
                              "rowwise_adagrad", "sgd")])  # every named optimizer, x64 on
def test_touched_rows_follow_the_reference(name, x64):
    make, make_ref = CASES[name]
    rng = np.random.default_rng(seed_of(name))
    with jax.enable_x64(x64):
        t, slots = _vocab_table(rng)
        before = np.asarray(t.values)
        batches = list(_batches(rng))
        opt = make()
        # skipped is a 64-bit count: start it just below 2**32 so the batches' absent
        # entries carry it into the high word (an int32 or uint32 count would wrap).
        state = opt.init(t)._replace(skipped=ht.words.Counter64(jnp.uint32(2**32 - 3), jnp.uint32(0)))
        for idx, g in batches:
            t, state = opt.update(t, state, np.where(idx >= 0, slots[idx], -1), g)
        dtype = np.float64 if name.startswith("ftrl") or name == "rowwise_adagrad" else np.float32
        want = _run_lazy_reference(make_ref, before[slots].astype(dtype), batches)
        chex.assert_trees_all_close(np.asarray(t.values)[slots], np.asarray(want, np.float32),
                                    rtol=2e-5, atol=2e-6)
        untouched = np.setdiff1d(np.arange(SIZE), slots)
        chex.assert_trees_all_equal(np.asarray(t.values)[untouched], before[untouched])
        absent = sum(int((idx < 0).sum()) for idx, _ in batches)
        assert absent >= 3 and int(state.skipped) == 2**32 - 3 + absent
        assert t.values.dtype == jnp.float32


def test_adam_with_a_global_step_is_optax_with_that_count():
    """``step=`` bias-corrects with the global count (LazyAdam); it equals the wrapped optax
    adam, whose count is global, and optax.adam on a row whose count is set to the step."""
    rng = np.random.default_rng(3)
    t, slots = _vocab_table(rng)
    ours, wrapped = ht.optim.adam(0.1), ht.optim.from_optax(optax.adam(0.1))
    t1, s1, t2, s2 = t, ours.init(t), t, wrapped.init(t)
    batches = list(_batches(rng))
    for step, (idx, g) in enumerate(batches):
        at = np.where(idx >= 0, slots[idx], -1)
        t1, s1 = ours.update(t1, s1, at, g, step=step)
        t2, s2 = wrapped.update(t2, s2, at, g)
    chex.assert_trees_all_close(np.asarray(t1.values), np.asarray(t2.values), rtol=1e-6, atol=1e-7)
    # A row touched only at the last step: optax.adam from a fresh state with count = step.
    tx = optax.adam(0.1)
    row = np.asarray(t.values)[slots[0]]
    g = np.ones((1, DIM), np.float32)
    t3, s3 = ours.update(t, ours.init(t), slots[:1], g, step=STEPS)
    opt_state = tx.init(row)
    opt_state = (opt_state[0]._replace(count=jnp.int32(STEPS)),) + tuple(opt_state[1:])
    upd, _ = tx.update(g[0], opt_state, row)
    chex.assert_trees_all_close(np.asarray(t3.values)[slots[0]], row + np.asarray(upd), rtol=1e-6)
    assert int(s3.count[slots[0]]) == 1


def test_learning_rate_schedule_is_called_at_step():
    rng = np.random.default_rng(4)
    t, slots = _vocab_table(rng)
    opt = ht.optim.sgd(lambda s: 0.5 / (1.0 + s))
    g = np.ones((1, DIM), np.float32)
    new, _ = opt.update(t, opt.init(t), slots[:1], g, step=3)
    chex.assert_trees_all_close(np.asarray(new.values)[slots[0]],
                                np.asarray(t.values)[slots[0]] - 0.125, rtol=1e-6)
    with pytest.raises(OpArgumentError) as e:
        opt.update(t, opt.init(t), slots[:1], g)
    assert e.value.arg == "step" and "sgd" in e.value.op


@pytest.mark.parametrize("name", ["adam", "ftrl", "rowwise_adagrad", "from_optax_rmsprop"])
def test_jitted_donated_step_updates_in_place(name):
    rng = np.random.default_rng(5)
    t, slots = _vocab_table(rng)
    opt = CASES[name][0]()
    state = opt.init(t)
    expected, _ = opt.update(t, state, slots[:4], np.ones((4, DIM), np.float32))
    step = jax.jit(opt.update, donate_argnums=(0, 1))
    old_leaves = [x for x in jax.tree.leaves((t, state)) if isinstance(x, jax.Array)]
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*donated buffers were not usable.*")
        t, state = step(t, state, slots[:4], np.ones((4, DIM), np.float32))
    assert all(x.is_deleted() for x in old_leaves)
    chex.assert_trees_all_close(np.asarray(t.values), np.asarray(expected.values))


def _table_sized_producers(jaxpr, size):
    """Primitives that produce a ``[size, ...]`` array anywhere in ``jaxpr`` (sub-jaxprs too)."""
    found = set()
    for eqn in jaxpr.eqns:
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            found |= _table_sized_producers(sub, size)
        if any(getattr(v.aval, "shape", ())[:1] == (size,) for v in eqn.outvars):
            found.add(eqn.primitive.name)
    return found


@pytest.mark.parametrize("name", ["adam", "ftrl", "rowwise_adagrad", "from_optax_momentum"])
def test_update_makes_no_table_sized_temporaries(name):
    """O(batch): the only [bucket_size] results are the scatters into the table and state
    (on the native path ``ffi_call``: its in-place row writes, ``put_rows``)."""
    size = 1009
    t = ht.init_table(size, DIM, initializer_mode="constant", constant_value=0.0)
    opt = CASES[name][0]()
    state = opt.init(t)
    jaxpr = jax.make_jaxpr(opt.update)(t, state, jnp.zeros(7, jnp.int32), jnp.ones((7, DIM)))
    assert _table_sized_producers(jaxpr.jaxpr, size) <= {"scatter", "pjit", "jit", "ffi_call"}


def test_sum_by_slot_matches_numpy():
    rng = np.random.default_rng(6)
    slots = rng.integers(-1, 6, 40)
    g = rng.standard_normal((40, 2)).astype(np.float32)
    slot, summed, absent = jax.jit(ht.optim.sum_by_slot)(jnp.asarray(slots), jnp.asarray(g))
    distinct = np.unique(slots[slots >= 0])
    k = distinct.size
    chex.assert_trees_all_equal(np.asarray(slot), np.concatenate([distinct, -np.ones(40 - k)]))
    want = np.stack([g[slots == s].sum(0) for s in distinct])
    chex.assert_trees_all_close(np.asarray(summed)[:k], want, rtol=1e-5, atol=1e-6)
    chex.assert_trees_all_equal(np.asarray(summed)[k:], np.zeros((40 - k, 2), np.float32))
    assert int(absent) == int((slots < 0).sum())
    # Edge cases: all absent, empty batch.
    slot, summed, absent = jax.jit(ht.optim.sum_by_slot)(-jnp.ones(3, jnp.int32), jnp.ones((3, 2)))
    assert slot.tolist() == [-1, -1, -1] and int(absent) == 3 and float(summed.sum()) == 0.0
    slot, summed, absent = jax.jit(ht.optim.sum_by_slot)(jnp.zeros(0, jnp.int32), jnp.ones((0, 2)))
    assert slot.shape == (0,) and summed.shape == (0, 2) and int(absent) == 0


def test_bad_arguments_name_the_optimizer_and_argument():
    t = ht.init_table(8, 2, initializer_mode="constant", constant_value=0.0)
    opt = ht.optim.adagrad(0.1)
    state = opt.init(t)
    with pytest.raises(OpArgumentError) as e:
        opt.update(t, state, jnp.zeros(3, jnp.int32), jnp.ones((3, 4)))
    assert (e.value.op, e.value.arg) == ("hashtable.optim.adagrad", "grads")
    assert "(3, 2)" in e.value.expected and "(3, 4)" in e.value.given
    with pytest.raises(OpDTypeError) as e:
        opt.update(t, state, jnp.zeros(3), jnp.ones((3, 2)))
    assert e.value.arg == "slots"
    with pytest.raises(OpArgumentError) as e:
        opt.init(np.zeros((8, 2)))
    assert e.value.arg == "table"
    with pytest.raises(OpArgumentError) as e:
        ht.optim.from_optax(lambda x: x)
    assert e.value.arg == "tx"


def test_state_leaves_are_separate_buffers():
    t = ht.init_table(8, 2, initializer_mode="constant", constant_value=0.0)
    for name in CASES:
        leaves = jax.tree.leaves(CASES[name][0]().init(t))
        pointers = [x.unsafe_buffer_pointer() for x in leaves]
        assert len(set(pointers)) == len(pointers), name
