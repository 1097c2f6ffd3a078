"""The Ascend shim against the C double of the CANN runtime: detection, the aclnn two-phase
dispatch, the output-shape refresh, runtime errors and resource release.

The double (tests/helpers/ascend_double) is compiled here with the system C compiler; without one
these tests skip, saying so.
"""

import os

import numpy as np
import pytest

from jaxops.backends import acl, ascend
from jaxops.backends.ascend import In, Out, Scalar
from jaxops.core.errors import AclError
from tests.helpers.ascend_double.fixtures import CLEAN, double, toolkit  # noqa: F401  (fixtures)
from tests.helpers.ascend_double.fixtures import live_resources as _live_resources
from tracing.outshape import UINT64_FLAG, decode


def nonzero_args(x):
    return [In(x), Out((x.size, x.ndim), np.dtype(np.int64))]


# -- detection ------------------------------------------------------------------------------
def test_unset_environment_fails_at_the_first_step(monkeypatch):
    for var in ascend.HOME_VARS:
        monkeypatch.delenv(var, raising=False)
    d = ascend.diagnose()
    assert not d.available
    assert [(s.name, s.ok) for s in d.steps[:3]] == [
        ("environment", False), ("libraries", None), ("runtime", None)]
    assert "ASCEND_HOME_PATH" in str(d.steps[0]) and "FAILED" in str(d)
    assert all(s.ok is None for s in d.steps[3:])  # per-operator steps not tried


def test_toolkit_without_libraries_fails_at_the_second_step(tmp_path, monkeypatch):
    monkeypatch.setenv("ASCEND_HOME_PATH", str(tmp_path))
    # No fallback to the loader's search: once a test in this process has loaded the
    # double, the loader finds a library of the same soname already loaded.
    monkeypatch.setattr(acl, "_find", lambda name, lib_dirs: os.path.join(lib_dirs[0], name))
    d = ascend.diagnose()
    assert [(s.name, s.ok) for s in d.steps[:3]] == [
        ("environment", True), ("libraries", False), ("runtime", None)]
    assert "libascendcl.so" in d.steps[1].detail
    ascend.detect(refresh=True)


def test_double_passes_every_step(double, toolkit):
    d = ascend.diagnose()
    assert d.available, str(d)
    assert d.steps[1].detail.startswith(f"{toolkit}/lib64/libascendcl.so")
    assert "1 device(s)" in d.steps[2].detail
    op_steps = {s.name: s for s in d.steps[3:]}
    assert op_steps and all(s.ok for s in op_steps.values())


def test_no_device_fails_at_the_runtime_step(double, monkeypatch):
    monkeypatch.setenv("JAXOPS_DOUBLE_DEVICES", "0")
    d = ascend.diagnose()
    assert (d.steps[2].name, d.steps[2].ok) == ("runtime", False)
    assert "0 devices" in d.steps[2].detail


def test_runtime_error_during_detection_is_reported(double, monkeypatch):
    monkeypatch.setenv("JAXOPS_DOUBLE_FAIL", "aclrtGetDeviceCount=100000")
    d = ascend.diagnose()
    assert not d.available
    assert "aclrtGetDeviceCount failed with aclError 100000" in d.steps[2].detail


# -- dispatch and output-shape refresh ------------------------------------------------------
def test_nonzero_dispatch_refreshes_the_output_shape(double):
    x = np.array([[0, 3, 0], [5, 0, 7]], np.float32)
    (out,) = ascend.runtime().dispatch("Nonzero", nonzero_args(x))
    np.testing.assert_array_equal(out, np.argwhere(x))
    words = double.last_outshape()
    # the arch35 kernel's rank word, and our decoder reads it as the refreshed shape
    assert int(words[0]) == UINT64_FLAG | 2 == 0x80000002
    assert decode(words.astype(np.int64)) == [out.shape] == [(3, 2)]
    assert _live_resources(double) == CLEAN


@pytest.mark.parametrize("dtype", ["float32", "float16", "int8", "uint8", "int64", "bool"])
def test_nonzero_dispatch_on_random_inputs(double, dtype):
    rng = np.random.default_rng(0)
    x = (rng.integers(-2, 3, size=(4, 3, 5)) * rng.integers(0, 2, size=(4, 3, 5))).astype(dtype)
    (out,) = ascend.runtime().dispatch("Nonzero", nonzero_args(x))
    np.testing.assert_array_equal(out, np.argwhere(x))


def test_masked_select_and_unique2_dispatch(double):
    rng = np.random.default_rng(1)
    x = rng.integers(0, 6, size=(3, 4)).astype(np.int32)
    mask = rng.random((1, 4)) > 0.5  # broadcast along the first axis
    (sel,) = ascend.runtime().dispatch("MaskedSelect", [In(x), In(mask), Out((x.size,), x.dtype)])
    np.testing.assert_array_equal(sel, x[np.broadcast_to(mask, x.shape)])
    i64 = np.dtype(np.int64)
    values, inverse, counts = ascend.runtime().dispatch("Unique2", [
        In(x), Scalar("bool", True), Scalar("bool", True), Scalar("bool", True),
        Out((x.size,), x.dtype), Out(x.shape, i64), Out((x.size,), i64)])
    want = np.unique(x, return_inverse=True, return_counts=True)
    np.testing.assert_array_equal(values, want[0])
    np.testing.assert_array_equal(inverse, want[1].reshape(x.shape))
    np.testing.assert_array_equal(counts, want[2])
    assert _live_resources(double) == CLEAN


def test_empty_and_all_zero_inputs(double):
    for x in (np.zeros((0, 3), np.float32), np.zeros((2, 2), np.int32)):
        (out,) = ascend.runtime().dispatch("Nonzero", nonzero_args(x))
        assert out.shape == (0, 2)
    assert _live_resources(double) == CLEAN


def test_invalid_arguments_surface_as_aclnn_status(double):
    x = np.ones(3, np.float32)
    with pytest.raises(AclError, match="aclnnNonzeroGetWorkspaceSize failed with aclError "
                                       "161002: aclnnNonzero") as info:
        ascend.runtime().dispatch("Nonzero", [In(x), Out((3, 1), np.dtype(np.int32))])
    assert (info.value.call, info.value.code) == ("aclnnNonzeroGetWorkspaceSize", 161002)
    assert _live_resources(double) == CLEAN


# -- runtime errors and resource release ----------------------------------------------------
FAILURES = [
    ("aclrtSetDevice", 107000),
    ("aclrtCreateStream", 107000),
    ("aclrtMalloc@2", 207001),  # the output buffer, after the input's
    ("aclrtMemcpy", 100000),
    ("aclnnNonzeroGetWorkspaceSize", 561103),
    ("aclSetAclOpExecutorRepeatable", 561103),
    ("aclrtMalloc@3", 207001),  # the workspace
    ("aclnnNonzero", 361001),
    ("aclrtSynchronizeStream", 507015),
    ("aclGetViewShape", 161001),
]


@pytest.mark.parametrize("call,code", FAILURES, ids=[c for c, _ in FAILURES])
def test_runtime_error_names_call_and_code_and_releases_everything(double, monkeypatch, call,
                                                                   code):
    x = np.array([1.0, 0.0, 2.0], np.float32)
    ascend.runtime().dispatch("Nonzero", nonzero_args(x))  # the device is held from here on
    before = double.live()
    monkeypatch.setenv("JAXOPS_DOUBLE_FAIL", f"{call}={code}")
    with pytest.raises(AclError) as info:
        ascend.runtime().dispatch("Nonzero", nonzero_args(x))
    assert (info.value.call, info.value.code) == (call.split("@")[0], code)
    assert "injected failure" in str(info.value)  # aclGetRecentErrMsg is appended
    assert double.live() == before
    assert _live_resources(double) == CLEAN


def test_null_tensor_is_an_error_and_releases(double, monkeypatch):
    monkeypatch.setenv("JAXOPS_DOUBLE_FAIL", "aclCreateTensor@2=1")
    with pytest.raises(AclError, match="aclCreateTensor returned NULL"):
        ascend.runtime().dispatch("Nonzero", nonzero_args(np.ones(2, np.float32)))
    assert _live_resources(double) == CLEAN


def test_failed_release_after_success_raises(double, monkeypatch):
    monkeypatch.setenv("JAXOPS_DOUBLE_FAIL", "aclDestroyAclOpExecutor=561103")
    with pytest.raises(AclError, match="aclDestroyAclOpExecutor failed with aclError 561103"):
        ascend.runtime().dispatch("Nonzero", nonzero_args(np.ones(2, np.float32)))
    live = _live_resources(double)
    assert live == {**CLEAN, "executors": live["executors"]}  # only the executor stayed


def test_failed_release_after_an_error_keeps_the_first_error(double, monkeypatch):
    before = double.live()
    monkeypatch.setenv("JAXOPS_DOUBLE_FAIL", "aclnnNonzero=361001,aclrtDestroyStream=107000")
    with pytest.raises(AclError) as info:
        ascend.runtime().dispatch("Nonzero", nonzero_args(np.ones(2, np.float32)))
    assert info.value.call == "aclnnNonzero"
    assert any("aclrtDestroyStream failed" in note for note in info.value.__notes__)
    after = double.live()
    assert after["streams"] == before["streams"] + 1  # the stream the runtime refused to free
    assert {k: after[k] for k in ("allocations", "tensors", "executors")} == \
        {k: before[k] for k in ("allocations", "tensors", "executors")}


# -- the ascend backend end to end: detection -> dispatch -> refresh -> DynArray --------------
import chex  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jaxops  # noqa: E402
import tracing  # noqa: E402
from jaxops.backends import BackendUnavailableError, aclnn_call, explain  # noqa: E402


def _random(rng, shape, dtype):
    v = (rng.integers(-2, 3, size=shape) * (rng.random(shape) < 0.6)).astype(dtype)
    if np.issubdtype(v.dtype, np.floating):
        v[rng.random(shape) < 0.1] = np.nan
        v[rng.random(shape) < 0.1] = -0.0
    return v


CALLS = [
    ("NonZero", lambda x, b: jaxops.nonzero(x, backend=b)),
    ("NonZero", lambda x, b: jaxops.argwhere(x, size=5, backend=b)),
    ("MaskedSelect", lambda x, b: jaxops.masked_select(x, x[..., :1] > 0, size=6, backend=b)),
    ("Unique", lambda x, b: jaxops.get_op("Unique")(x, backend=b)),
    ("Unique", lambda x, b: jaxops.get_op("Unique")(x, size=2, backend=b)),
]


@pytest.mark.parametrize("dtype", ["float32", "int32", "bool"])
def test_ascend_backend_matches_xla(double, dtype):
    rng = np.random.default_rng(3)
    for name, call in CALLS:
        for shape in [(3, 4), (2, 1, 5), (0, 2)]:
            x = _random(rng, shape, dtype)
            chex.assert_trees_all_equal(call(x, "ascend"), call(x, "xla"))
    assert _live_resources(double) == CLEAN


def test_automatic_selection_picks_ascend_for_mapped_operators(double):
    x = _random(np.random.default_rng(4), (4, 4), "float32")
    s = explain("NonZero")
    assert (s.backend, s.source) == ("ascend", "automatic")
    jaxpr = str(jax.make_jaxpr(lambda x: jaxops.nonzero(x))(x))
    if aclnn_call.route(ascend.SPECS["NonZero"])[0]:  # the custom call where native is built
        assert "jaxops_aclnn" in jaxpr and "pure_callback" not in jaxpr
    else:
        assert "pure_callback" in jaxpr
    chex.assert_trees_all_equal(jaxops.nonzero(x), jaxops.nonzero(x, backend="xla"))
    statuses = {b.name: b for b in jaxops.backends.available()}
    assert statuses["ascend"].available
    assert set(statuses["ascend"].operators) == {"NonZero", "MaskedSelect", "Unique"}


def test_unmapped_operators_and_configurations_fall_back_with_the_reason(double):
    s = explain("UniqueConsecutive")
    assert s.backend == "xla"
    assert s.passed_over[0] == ("ascend", "UniqueConsecutive has no 'ascend' kernel "
                                          "(kernels: xla, host)")
    assert [name for name, _ in s.passed_over] == ["ascend", "native"]
    x = np.array([[3, 1], [3, 1], [0, 2]], np.int32)
    s = explain("Unique", inputs=[x], attrs={"size": None, "sorted": True, "axis": 0})
    # nor does native's (it serves axis None only): xla, whether native is built or not
    assert s.backend == "xla" and "aclnnUnique2 has no axis" in str(s)
    chex.assert_trees_all_equal(jaxops.get_op("Unique")(x, axis=0),
                                jaxops.get_op("Unique")(x, axis=0, backend="xla"))
    with pytest.raises(BackendUnavailableError, match="aclnnUnique2 has no axis"):
        jaxops.get_op("Unique")(x, axis=0, backend="ascend")
    f = np.array([np.nan, 1.0, np.nan], np.float32)
    s = explain("Unique", inputs=[f], attrs={"size": None, "sorted": True, "axis": None,
                                            "equal_nan": False})
    assert s.backend in ("native", "xla") and "aclnnUnique2 has no equal_nan" in str(s)
    u16 = np.arange(4, dtype=np.uint16)
    s = explain("NonZero", inputs=[u16])  # falls back to native where built, else xla
    assert s.backend in ("native", "xla") and "aclnnNonzero does not take dtype uint16" in str(s)
    with pytest.raises(BackendUnavailableError, match="aclnnNonzero does not take dtype uint16"):
        jaxops.nonzero(u16, backend="ascend")


def test_ascend_under_jit_vmap_grad_and_launch(double):
    rng = np.random.default_rng(5)
    xs = _random(rng, (3, 2, 4), "float32")
    f = lambda b: jax.jit(jax.vmap(lambda x: jaxops.nonzero(x, size=4, backend=b)))
    chex.assert_trees_all_equal(f("ascend")(xs), f("xla")(xs))
    x = np.abs(rng.standard_normal((2, 3))).astype(np.float32)
    mask = np.array([True, False, True])

    def loss(b):
        return lambda x: jnp.sum(jaxops.masked_select(x, mask, backend=b).valid_data() ** 3)
    chex.assert_trees_all_close(jax.grad(loss("ascend"))(x), jax.grad(loss("xla"))(x))
    t = np.zeros(9, np.int64)
    res = tracing.launch("NonZero", tracing.OP_INPUT(xs[0]), tracing.OP_ATTR(transpose=True),
                         tracing.OP_OUTSHAPE(t, 0), backend="ascend")
    assert res.backend == "ascend"
    np.testing.assert_array_equal(res.outputs[0], np.argwhere(xs[0]))
    assert t[:3].tolist() == [2, *np.argwhere(xs[0]).shape]
    assert _live_resources(double) == CLEAN


def test_runtime_error_inside_jit_names_call_and_code(double, monkeypatch):
    x = np.array([1.0, 0.0, 2.0], np.float32)
    monkeypatch.setenv("JAXOPS_DOUBLE_FAIL", "aclnnNonzero=361001")
    with pytest.raises(jax.errors.JaxRuntimeError,
                       match="AclError: aclnnNonzero failed with aclError 361001"):
        jax.block_until_ready(jaxops.nonzero(x, backend="ascend"))
    with pytest.raises(AclError, match="aclnnNonzero failed with aclError 361001"):
        ascend.run("NonZero", x)  # eagerly the AclError itself
    assert _live_resources(double) == CLEAN
