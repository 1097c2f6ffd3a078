"""The host backend equals xla: every built-in operator has a host kernel, and on random
inputs (the op-matrix rows plus the random and stress inputs below) its outputs — padding,
actual and true shapes included — are identical to the xla kernel's, eagerly (which runs
the kernel jitted) and under vmap; gradients through it come from xla."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxops
from jaxops.backends import explain, host_kernels, use_backend
from jaxops.core.dynarray import DynArray
from tests.helpers.op_matrix import all_cases
from tests.helpers.util import seed_of


def _builtin(name: str) -> bool:
    """A jaxops operator (its xla kernel lives in jaxops.ops), not a test's nor a hash-table
    op's (stateful tables, jaxops.hashtable: no host kernels)."""
    op = jaxops.get_op(name)
    module = op.get_kernel("xla", op.select_mode(None)).__module__
    return module.startswith("jaxops.ops.")


BUILTIN = [n for n in jaxops.list_ops() if _builtin(n)]
CASES = [c for c in all_cases() if _builtin(c.op)]


def _same(got, want, rtol=0.0):
    if rtol:
        chex.assert_trees_all_close(got, want, rtol=rtol, atol=rtol)
    else:
        chex.assert_trees_all_equal(got, want)


@pytest.mark.parametrize("name", BUILTIN)
def test_every_builtin_operator_has_a_host_kernel(name):
    assert name in host_kernels.KERNELS and jaxops.get_op(name).has_kernel("host")


def _run(case, backend, fn, *args):
    with use_backend(backend):
        if backend == "host":
            assert explain(case.op).backend == "host"
        return fn(*args)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_host_equals_xla_eagerly(case):
    inputs = case.make_inputs(np.random.default_rng(100))
    fn = functools.partial(case.fn, **case.attrs)
    _same(_run(case, "host", fn, *inputs), _run(case, "xla", fn, *inputs), case.rtol)


@pytest.mark.parametrize("case", [c for c in CASES if c.vmap], ids=str)
def test_host_equals_xla_under_vmap(case):
    # (eager OpDef calls already run their kernel jitted: the eager test covers jit)
    fn = functools.partial(case.fn, **case.attrs)
    batch = [np.stack(col) for col in zip(*(case.make_inputs(np.random.default_rng(20 + i))
                                             for i in range(3)))]
    _same(_run(case, "host", jax.jit(jax.vmap(fn)), *batch),
          _run(case, "xla", jax.jit(jax.vmap(fn)), *batch), case.rtol)


@pytest.mark.parametrize("case", [c for c in CASES if c.grad_argnums], ids=str)
def test_gradient_through_host_comes_from_xla(case):
    inputs = case.make_inputs(np.random.default_rng(4))

    def loss(*args):
        out = case.fn(*args, **case.attrs)
        data = out.valid_data(0) if isinstance(out, DynArray) else out
        return jnp.sum(jnp.sin(data))

    grads = {b: _run(case, b, jax.grad(loss, argnums=case.grad_argnums), *inputs)
             for b in ("host", "xla")}
    chex.assert_trees_all_close(grads["host"], grads["xla"], rtol=1e-6)


# -- stress inputs: heavy overlap, tied and NaN scores ---------------------------------------
def _crowded_boxes(rng, n):
    lo = rng.uniform(0, 10, (n, 2))
    boxes = np.concatenate([lo, lo + rng.uniform(0.5, 6, (n, 2))], axis=1)
    flip = rng.random(n) < 0.2  # flipped corners are accepted
    boxes[flip] = boxes[flip][:, [2, 3, 0, 1]]
    return boxes.astype(np.float32)


def _tied_scores(rng, shape):
    s = np.round(rng.random(shape), 1).astype(np.float32)  # many exact ties
    s[rng.random(shape) < 0.05] = np.nan
    return s


@pytest.mark.parametrize("seed", [0])
def test_nms_family_on_crowded_boxes(seed):
    rng = np.random.default_rng(seed)
    boxes, scores = _crowded_boxes(rng, 120), _tied_scores(rng, 120)
    idxs = rng.integers(0, 3, 120).astype(np.int32)
    t = float(rng.choice([0.0, 0.3, 0.5, 0.9]))
    calls = [
        lambda: jaxops.nms(boxes, scores, t),
        lambda: jaxops.batched_nms(boxes, scores, idxs, t, max_output_size=40,
                                   score_threshold=0.2),
        lambda: jaxops.non_max_suppression(boxes[None], np.stack([scores, scores[::-1]])[None],
                                           30, t, 0.1, size=25),
        lambda: jaxops.efficient_nms(
            boxes[None], np.stack([scores, scores[::-1]], axis=-1)[None], max_output_boxes=50,
            iou_threshold=t, score_threshold=0.3, pre_nms_top_k=100),
    ]
    for call in calls:
        with use_backend("host"):
            got = call()
        _same(got, call())


# -- index operators on random inputs: NaN, -0.0, ties, broadcasting, capacity --------------
def _values(rng, shape, dtype):
    v = rng.integers(-2, 3, size=shape)
    if np.issubdtype(np.dtype(dtype), np.floating):
        v = v.astype(np.float32)
        v[rng.random(shape) < 0.1] = np.nan
        v[rng.random(shape) < 0.1] = -0.0
    return v.astype(dtype)


INDEX_CALLS = {
    "NonZero": [dict(), dict(size=3, transpose=True), dict(size=0)],
    "MaskedSelect": [dict(), dict(size=4)],
    "Unique": [dict(size=2), dict(sorted=False), dict(axis=1), dict(axis=0, size=1, sorted=False)],
    "UniqueConsecutive": [dict(size=2), dict(axis=1)],
}


@pytest.mark.parametrize("name", list(INDEX_CALLS))
@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_index_operators_host_equals_xla(name, dtype):
    op = jaxops.get_op(name)
    rng = np.random.default_rng(seed_of(name, dtype))
    for attrs in INDEX_CALLS[name]:
        for shape in [(3, 1, 4), (0, 3)]:
            x = _values(rng, shape, dtype)
            args = (x, rng.random(shape[-1:]) < 0.5) if name == "MaskedSelect" else (x,)
            # (an eager OpDef call runs its kernel jitted: this is the jit path too)
            _same(op(*args, backend="host", **attrs), op(*args, backend="xla", **attrs))


def test_small_float_dtypes_bool_and_scalar():
    rng = np.random.default_rng(5)
    for dtype in ("float16", "bool"):
        x = _values(rng, (4, 5), dtype)
        for name, attrs in (("NonZero", {}), ("Unique", {"sorted": False})):
            op = jaxops.get_op(name)
            _same(op(x, backend="host", **attrs), op(x, backend="xla", **attrs))
    x = np.float32(2.5)
    _same(jaxops.get_op("NonZero")(x, backend="host"), jaxops.get_op("NonZero")(x))


def test_masked_select_gradient_through_host():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    mask = np.array([True, False, True])

    def loss(backend):
        return lambda x: jnp.sum(jaxops.masked_select(x, mask, backend=backend).valid_data() ** 2)
    chex.assert_trees_all_close(jax.grad(loss("host"))(x), jax.grad(loss("xla"))(x))
    chex.assert_trees_all_close(jax.grad(loss("host"))(x), 2 * x * mask)


def test_host_backward_runs_the_xla_kernel_of_the_calls_impl_mode():
    from jaxops.backends.callback import host_kernel
    from jaxops.core.dtypes import FLOATING
    from jaxops.core.impl_mode import OpImplMode
    from jaxops.core.registry import Input, OpDef, Output
    op = OpDef("TestModeScale", [Input("x", FLOATING)], [Output("y", FLOATING)],
               impl_modes=OpImplMode.HIGH_PRECISION | OpImplMode.HIGH_PERFORMANCE)
    op.kernel("xla")(lambda x: (2 * x,))
    op.kernel("xla", modes=OpImplMode.HIGH_PERFORMANCE)(lambda x: (3 * x,))  # tells them apart
    op.kernel("host")(host_kernel(op, lambda x: (2 * np.asarray(x),)))

    def grad(mode):
        return jax.grad(lambda x: op(x, backend="host", impl_mode=mode)[0].sum())(jnp.ones(2))
    assert grad("high_precision").tolist() == [2.0, 2.0]
    assert grad("high_performance").tolist() == [3.0, 3.0]
    assert grad("high_precision").tolist() == [2.0, 2.0]  # per-mode kernels, cached apart
