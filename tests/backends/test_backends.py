"""Backend selection: backend=, use_backend, JAXOPS_BACKEND, automatic; explain, available;
the host-callback kernel under jit, vmap and grad.

The test-only operators Relu (xla only) and TestSelectPositive (xla, plus a host kernel
registered here) keep these tests independent of the real operators.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxops
import tracing
from jaxops.backends import (BackendUnavailableError, available, explain, select_backend,
                             use_backend)
from jaxops.backends.callback import host_kernel
from tests.helpers.cases.positives import NAME as POSITIVE, SELECT_POSITIVE, select_positive
from tests.helpers.cases.relu import RELU, relu


def _host_select_positive(x, *, size):
    pos = np.flatnonzero(x > 0)
    return x[pos], pos


if not SELECT_POSITIVE.has_kernel("host"):
    SELECT_POSITIVE.kernel("host")(host_kernel(SELECT_POSITIVE, _host_select_positive))


@pytest.fixture(autouse=True)
def no_ascend_no_env(monkeypatch):
    """Every test starts with automatic selection and no Ascend toolkit in sight."""
    for var in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "JAXOPS_BACKEND"):
        monkeypatch.delenv(var, raising=False)


def _uses_callback(fn, *args) -> bool:
    # a fresh function each time: make_jaxpr caches traces per function object
    return "pure_callback" in str(jax.make_jaxpr(lambda *a: fn(*a))(*args))


X = np.array([0.5, -1.0, 2.0, 0.0, 3.0], np.float32)


def test_automatic_is_xla_without_ascend_and_explain_says_why():
    assert select_backend(SELECT_POSITIVE) == "xla"
    s = explain(POSITIVE)
    assert (s.backend, s.source) == ("xla", "automatic")
    assert s.passed_over[0][0] == "ascend" and "ASCEND_HOME_PATH" in s.passed_over[0][1]
    assert "runs on 'xla' (automatic)" in str(s)
    assert not _uses_callback(select_positive, X)


def test_explicit_backend_runs_that_kernel():
    assert _uses_callback(lambda x: SELECT_POSITIVE(x, backend="host"), X)
    got = jaxops.refresh(SELECT_POSITIVE(X, backend="host"))
    want = jaxops.refresh(SELECT_POSITIVE(X, backend="xla"))
    chex.assert_trees_all_equal(got, want)
    assert explain(POSITIVE, requested="host").source == "backend= argument"


def test_explicit_unknown_unavailable_or_missing_kernel_raises():
    with pytest.raises(BackendUnavailableError, match="unknown backend 'tpu'.*xla, host, ascend"):
        SELECT_POSITIVE(X, backend="tpu")
    with pytest.raises(BackendUnavailableError, match="'ascend'.*unavailable.*ASCEND_HOME_PATH"):
        SELECT_POSITIVE(X, backend="ascend")
    with pytest.raises(BackendUnavailableError, match="Relu: backend 'host'.*no 'host' kernel"):
        relu(X, backend="host")


def test_use_backend_prefers_and_falls_back_per_operator():
    with use_backend("host"):
        assert select_backend(SELECT_POSITIVE) == "host"
        s = explain(RELU)  # Relu has no host kernel: runs on xla, and says so
        assert (s.backend, s.source) == ("xla", "use_backend")
        assert s.passed_over == (("host", "Relu has no 'host' kernel (kernels: xla)"),)
        assert _uses_callback(select_positive, X)
        chex.assert_trees_all_close(relu(X, alpha=0.1), np.where(X > 0, X, 0.1 * X))
    assert select_backend(SELECT_POSITIVE) == "xla"


def test_use_backend_nests_and_call_argument_wins():
    with use_backend("host"):
        with use_backend("xla"):
            assert select_backend(SELECT_POSITIVE) == "xla"
            assert select_backend(SELECT_POSITIVE, "host") == "host"
        assert select_backend(SELECT_POSITIVE) == "host"
        assert select_backend(SELECT_POSITIVE, "xla") == "xla"


def test_use_backend_rejects_unknown_and_unavailable_on_entry():
    with pytest.raises(BackendUnavailableError, match="unknown backend 'gpu'"):
        with use_backend("gpu"):
            pass
    with pytest.raises(BackendUnavailableError, match="ascend.*diagnose"):
        with use_backend("ascend"):
            pass


def test_environment_variable(monkeypatch):
    monkeypatch.setenv("JAXOPS_BACKEND", "host")
    s = explain(SELECT_POSITIVE)
    assert (s.backend, s.source) == ("host", "JAXOPS_BACKEND")
    assert select_backend(RELU) == "xla"  # no host kernel: preference, not a requirement
    with use_backend("xla"):
        assert select_backend(SELECT_POSITIVE) == "xla"
    with use_backend("auto"):  # automatic, ignoring the variable
        assert explain(SELECT_POSITIVE).source == "automatic"
    monkeypatch.setenv("JAXOPS_BACKEND", "auto")
    assert explain(SELECT_POSITIVE).source == "automatic"
    monkeypatch.setenv("JAXOPS_BACKEND", "cuda")
    with pytest.raises(BackendUnavailableError, match="'cuda' \\(from JAXOPS_BACKEND\\)"):
        select_positive(X)


def test_selection_happens_at_trace_time():
    """The documented caveat: a jitted function keeps the backend it was traced with."""
    traced_in_scope = jax.jit(lambda x: select_positive(x))
    with use_backend("host"):
        traced_in_scope(X)
    assert "callback" in traced_in_scope.lower(X).as_text()  # still host outside the block
    assert "callback" not in jax.jit(lambda x: select_positive(x)).lower(X).as_text()


def test_available_lists_every_backend_with_status():
    statuses = {b.name: b for b in available()}
    assert list(statuses) == ["xla", "host", "ascend", "native"]
    assert "NonZero" in statuses["native"].operators and "Relu" not in statuses["native"].operators
    assert statuses["xla"].available and statuses["host"].available
    assert not statuses["ascend"].available and "ASCEND_HOME_PATH" in statuses["ascend"].reason
    assert POSITIVE in statuses["host"].operators and "Relu" not in statuses["host"].operators
    assert "Relu" in statuses["xla"].operators
    assert "unavailable" in str(statuses["ascend"])
    assert SELECT_POSITIVE.backends() == ["xla", "host"]


def test_launch_takes_backend_and_reports_it():
    t = np.zeros(18, np.int64)
    res = tracing.launch(POSITIVE, tracing.OP_INPUT(X), tracing.OP_OUTSHAPE(t, 0),
                         tracing.OP_OUTSHAPE(t, 1), backend="host")
    assert res.backend == "host"
    chex.assert_trees_all_equal([np.asarray(o) for o in res.outputs],
                                [X[X > 0], np.flatnonzero(X > 0).astype(np.int32)])
    with use_backend("host"):
        assert tracing.launch(POSITIVE, tracing.OP_INPUT(X)).backend == "host"


# -- the host-callback kernel ---------------------------------------------------------------
def test_host_kernel_keeps_structure_fill_and_overflow():
    got = SELECT_POSITIVE(X, size=2, backend="host")
    want = SELECT_POSITIVE(X, size=2, backend="xla")
    chex.assert_trees_all_equal(got, want)  # data (padding included), actual and true shapes
    assert bool(got[0].overflowed()) and int(got[0].lost()) == 1


def test_host_kernel_under_vmap_matches_xla():
    xs = np.random.default_rng(0).standard_normal((2, 3, 6)).astype(np.float32)
    f = lambda b: lambda x: SELECT_POSITIVE(x, size=4, backend=b)
    got = jax.jit(jax.vmap(jax.vmap(f("host"))))(xs)
    chex.assert_trees_all_equal(got, jax.vmap(jax.vmap(f("xla")))(xs))
    # one operand batched, the other not: the host broadcasts
    pair = jax.vmap(lambda x, y: (SELECT_POSITIVE(x, backend="host")[0].data + y), (0, None))
    chex.assert_trees_all_equal(pair(xs[0], np.float32(1)),
                                jax.vmap(lambda x: SELECT_POSITIVE(x)[0].data + 1)(xs[0]))


def test_host_kernel_gradient_comes_from_xla():
    def loss(backend):
        return lambda x: jnp.sum(SELECT_POSITIVE(x, size=2, backend=backend)[0].valid_data(0) ** 2)
    g_host = jax.grad(loss("host"))(X)
    chex.assert_trees_all_close(g_host, jax.grad(loss("xla"))(X))
    chex.assert_trees_all_close(g_host, np.array([1.0, 0, 4.0, 0, 0], np.float32))


def test_every_public_operator_takes_backend():
    import inspect

    for fn in (jaxops.nonzero, jaxops.argwhere, jaxops.flatnonzero, jaxops.unique,
               jaxops.unique_consecutive, jaxops.masked_select, jaxops.non_max_suppression,
               jaxops.nms, jaxops.batched_nms, jaxops.efficient_nms):
        assert "backend" in inspect.signature(fn).parameters, fn.__name__
    boxes = np.array([[0, 0, 1, 1], [0, 0, 1, 1.1], [3, 3, 4, 4]], np.float32)
    scores = np.array([0.9, 0.8, 0.7], np.float32)
    for backend in ("xla", "host"):
        assert jaxops.refresh(jaxops.nms(boxes, scores, 0.5, backend=backend)).tolist() == [0, 2]
        kept = jaxops.batched_nms(boxes, scores, np.array([0, 1, 0]), 0.5, backend=backend)
        assert jaxops.refresh(kept).tolist() == [0, 1, 2]
