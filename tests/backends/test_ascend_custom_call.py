"""The ascend kernels as an XLA custom call: the aclnn two-phase dispatch in the native
library's FFI handler (``jaxops_aclnn``), on the C double of the CANN runtime, inside jit.

Skips where the native library is not built (the callback route, tested in
test_ascend.py, then serves) or no C compiler builds the double.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxops
from jaxops import native
from jaxops.backends import aclnn, aclnn_call, ascend
from jaxops.backends.aclnn import In, Out, Scalar
from tests.helpers.ascend_double.fixtures import CLEAN, double, toolkit  # noqa: F401  (fixtures)
from tests.helpers.ascend_double.fixtures import live_resources
from tests.backends.test_ascend import FAILURES

pytestmark = pytest.mark.skipif(not native.available(), reason=native.why_unavailable())


def _ops(backend):
    """NonZero (both layouts), MaskedSelect and Unique (with a capacity cut) in one program."""
    def f(x):
        return (jaxops.nonzero(x, backend=backend), jaxops.argwhere(x, size=3, backend=backend),
                jaxops.masked_select(x, x > 0, size=4, backend=backend),
                jaxops.get_op("Unique")(x, backend=backend),
                jaxops.get_op("Unique")(x, size=2, backend=backend))
    return jax.jit(f)


ASCEND, XLA = _ops("ascend"), _ops("xla")
NONZERO = jax.jit(lambda x: jaxops.nonzero(x, backend="ascend"))
# The XLA status of a failed custom call: JaxRuntimeError on a jitted function's first
# call, ValueError on the later ones (jit's C++ fast path; measured with jax 0.10.2).
FAILED = (jax.errors.JaxRuntimeError, ValueError)
X = np.array([[0.0, 3.0, -1.0], [np.nan, 0.0, -0.0], [2.0, 3.0, 0.0]], np.float32)


@pytest.fixture
def no_python_dispatch(monkeypatch):
    """Counts the ctypes dispatches (the callback route's call path)."""
    calls = []
    real = aclnn.Runtime.dispatch
    monkeypatch.setattr(aclnn.Runtime, "dispatch",
                        lambda self, *a: calls.append(a[0]) or real(self, *a))
    return calls


def test_jit_runs_the_custom_call_and_matches_xla(double, no_python_dispatch):
    text = ASCEND.lower(X).as_text()
    assert aclnn_call.TARGET in native.TARGETS  # the handler the native library registers
    assert text.count("custom_call @jaxops_aclnn") == 5
    op_step = next(s for s in ascend.diagnose().steps if s.name == "operator NonZero")
    assert op_step.detail.endswith("jit through the XLA custom call jaxops_aclnn")
    assert "callback" not in text  # no pure_callback: no Python on the call path
    rng = np.random.default_rng(0)
    for x in (X, rng.integers(-1, 2, size=(3, 3)).astype(np.float32), np.zeros((3, 3), np.float32)):
        chex.assert_trees_all_equal(ASCEND(x), XLA(x))
    assert no_python_dispatch == []
    assert live_resources(double) == CLEAN


def test_output_shape_comes_from_the_runtime_refresh(double):
    out = NONZERO(X)
    words = double.last_outshape()  # what the kernel wrote; the runtime decoded it
    assert (int(words[0]), int(words[1]), int(words[2])) == (0x80000002, 5, 2)
    assert out.actual_shape.tolist() == [2, 5]
    # a view shape the runtime cannot give fails the call instead of inventing one
    with pytest.raises(FAILED, match="aclGetViewShape failed"):
        with pytest.MonkeyPatch.context() as m:
            m.setenv("JAXOPS_DOUBLE_FAIL", "aclGetViewShape=161001")
            jax.block_until_ready(NONZERO(X))


def test_vmap_grad_and_x64_through_the_custom_call(double, no_python_dispatch):
    xs = np.stack([X, -X, np.zeros_like(X)])
    batched = jax.jit(jax.vmap(lambda x: jaxops.nonzero(x, size=4, backend="ascend")))
    assert "callback" not in batched.lower(xs).as_text()
    chex.assert_trees_all_equal(batched(xs), jax.vmap(lambda x: jaxops.nonzero(x, size=4))(xs))
    w = np.abs(X[0])

    def loss(b):
        return lambda w: jnp.sum(jaxops.masked_select(w, w > 0, backend=b).valid_data() ** 3)
    chex.assert_trees_all_close(jax.jit(jax.grad(loss("ascend")))(w), jax.grad(loss("xla"))(w))
    with jax.enable_x64(True):  # int64 index outputs copied as they are, not narrowed
        x = X[:2]
        got, want = jaxops.nonzero(x, backend="ascend"), jaxops.nonzero(x, backend="xla")
        assert got.data.dtype == jnp.int64
        chex.assert_trees_all_equal(got, want)
    assert no_python_dispatch == []


def test_callback_route_where_the_native_library_is_off(double, monkeypatch, no_python_dispatch):
    monkeypatch.setenv(native.ENV_VAR, "0")
    assert aclnn_call.route(ascend.SPECS["NonZero"]) == (False, "the native library does not serve it "
                                    f"({native.ENV_VAR}=0 forces the xla kernels)")
    assert "jit through jax.pure_callback (the native library does not serve it" in \
        str(ascend.diagnose())
    x = X[:, :2]  # a shape of its own: the route is chosen when a call is traced
    f = jax.jit(lambda x: jaxops.nonzero(x, backend="ascend"))
    assert "callback" in f.lower(x).as_text() and "jaxops_aclnn" not in f.lower(x).as_text()
    chex.assert_trees_all_equal(f(x), jaxops.nonzero(x, backend="xla"))
    assert no_python_dispatch == ["Nonzero"]


@pytest.mark.parametrize("call,code", FAILURES, ids=[c for c, _ in FAILURES])
def test_runtime_error_names_call_and_code_and_releases_everything(double, monkeypatch, call,
                                                                   code):
    x = X[0]
    jax.block_until_ready(NONZERO(x))  # compiled, device held
    before = double.live()
    monkeypatch.setenv("JAXOPS_DOUBLE_FAIL", f"{call}={code}")
    with pytest.raises(FAILED,
                       match=rf"AclError: {call.split('@')[0]} failed with aclError {code}: "
                             r".*injected failure"):
        jax.block_until_ready(NONZERO(x))
    assert double.live() == before
    assert live_resources(double) == CLEAN


def test_failed_releases_are_reported_after_the_first_error(double, monkeypatch):
    x = X[0]
    jax.block_until_ready(NONZERO(x))
    monkeypatch.setenv("JAXOPS_DOUBLE_FAIL", "aclCreateTensor@2=1")
    with pytest.raises(FAILED, match="aclCreateTensor returned NULL"):
        jax.block_until_ready(NONZERO(x))
    assert live_resources(double) == CLEAN
    monkeypatch.setenv("JAXOPS_DOUBLE_FAIL", "aclnnNonzero=361001,aclrtDestroyStream=107000")
    with pytest.raises(FAILED,
                       match=r"aclnnNonzero failed with aclError 361001.*while releasing resources"
                             r" after this error: AclError: aclrtDestroyStream failed"):
        jax.block_until_ready(NONZERO(x))
    monkeypatch.setenv("JAXOPS_DOUBLE_FAIL", "aclDestroyAclOpExecutor=561103")
    with pytest.raises(FAILED, match="aclDestroyAclOpExecutor failed"):
        jax.block_until_ready(NONZERO(x))  # a release failing after success is the error


def test_route_names_what_the_custom_call_cannot_take():
    spec = ascend.SPECS["Unique"]
    x = In(np.zeros(2, np.float32))
    assert aclnn_call.route(spec, [x, Scalar("bool", True), Out((2,), np.float32)])[0]
    assert aclnn_call.route(spec, [x, Scalar("double", 0.5)]) == (
        False, "aclnnUnique2 takes a double scalar (integer-class only)")
    assert aclnn_call.route(spec, [x] * 15) == (
        False, "aclnnUnique2 takes 15 arguments (at most 14)")
