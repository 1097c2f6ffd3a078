"""Generic eager / jit / vmap / grad / launch tests over every row of the op matrix."""

import functools
from contextlib import nullcontext

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxops
import tracing
from jaxops.core.dynarray import DynArray
from tests.helpers.op_matrix import all_cases
from tests.helpers.util import expected_truncation

CASES = all_cases()
SEEDS = (0, 1)


def _assert_same(actual, expected, rtol):
    actual = jax.tree_util.tree_map(np.asarray, actual)
    expected = jax.tree_util.tree_map(np.asarray, expected)
    if rtol:
        chex.assert_trees_all_close(actual, expected, rtol=rtol, atol=rtol)
    else:
        chex.assert_trees_all_equal(actual, expected)


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("seed", SEEDS)
def test_eager(case, seed):
    inputs = case.make_inputs(np.random.default_rng(seed))
    _assert_same(jaxops.refresh(case.fn(*inputs, **case.attrs), allow_truncated=True),
                 case.reference(*inputs, **case.attrs), case.rtol)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_jit(case):
    inputs = case.make_inputs(np.random.default_rng(2))
    f = jax.jit(functools.partial(case.fn, **case.attrs))
    _assert_same(jaxops.refresh(f(*inputs), allow_truncated=True), case.reference(*inputs, **case.attrs), case.rtol)


@pytest.mark.parametrize("case", [c for c in CASES if c.vmap], ids=str)
def test_vmap(case):
    batch = [case.make_inputs(np.random.default_rng(10 + i)) for i in range(3)]
    stacked = [np.stack(col) for col in zip(*batch)]
    out = jaxops.refresh(jax.jit(jax.vmap(functools.partial(case.fn, **case.attrs)))(*stacked),
                         allow_truncated=True)  # capacity rows truncate on purpose
    leaves, treedef = jax.tree_util.tree_flatten(out, is_leaf=lambda x: isinstance(x, list))
    for i, inputs in enumerate(batch):
        got = jax.tree_util.tree_unflatten(
            treedef, [leaf[i] if isinstance(leaf, list) else np.asarray(leaf)[i] for leaf in leaves])
        _assert_same(got, case.reference(*inputs, **case.attrs), case.rtol)


@pytest.mark.parametrize("case", [c for c in CASES if c.launch_outputs], ids=str)
def test_launch_matches_functional(case):
    op = jaxops.get_op(case.op)
    inputs = case.make_inputs(np.random.default_rng(3))
    n_out = len(op.outputs)
    t = np.zeros(9 * n_out, np.int64)
    pairs = [tracing.OP_OUTSHAPE(t, i) for i in range(n_out)] if op.data_dependent else []
    with expected_truncation() if getattr(case.fn, "truncates", False) else nullcontext():
        res = tracing.launch(case.op, tracing.OP_INPUT(*inputs), tracing.OP_ATTR(**case.attrs),
                             *pairs)
    _assert_same(case.launch_outputs(res.outputs), case.reference(*inputs, **case.attrs), case.rtol)


@pytest.mark.parametrize("case", [c for c in CASES if c.grad_argnums], ids=str)
def test_grad(case):
    rng = np.random.default_rng(4)
    inputs = case.make_inputs(rng)

    def loss(*args):
        out = case.fn(*args, **case.attrs)
        data = out.valid_data(0) if isinstance(out, DynArray) else out
        ct = jnp.asarray(np.random.default_rng(5).standard_normal(data.shape), data.dtype)
        return jnp.sum(ct * data)

    out = jax.eval_shape(lambda *a: case.fn(*a, **case.attrs), *inputs)
    data_shape = (out.data if isinstance(out, DynArray) else out).shape
    ct = np.random.default_rng(5).standard_normal(data_shape).astype(np.float32)
    # jitted: one program (eagerly the loss around the operator runs op by op)
    grads = jax.jit(jax.grad(loss, argnums=case.grad_argnums))(*inputs)
    want = case.grad_reference(*inputs, ct, **case.attrs)
    chex.assert_trees_all_close([np.asarray(g) for g in grads], [np.asarray(w) for w in want],
                                rtol=1e-5, atol=1e-5)
