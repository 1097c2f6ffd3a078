"""Doctest collection skips the optional framework layers whose framework is not installed;
compiles are cheaper in the test session (see :func:`_cheaper_compiles`), and the cyclic
garbage collector runs less often (``GC_THRESHOLDS``); xdist workers end
their session quickly enough not to be interrupted (see below)."""

import atexit
import gc
import importlib.util
import os
import shutil
import sys
import tempfile

import pytest

from tests.helpers.eight_devices import GC_THRESHOLDS

# XLA flags that cut the CPU compile of a test-sized program about 5x (2.6 s -> 0.5 s for
# four operator kernels): LLVM at -O0, and XLA:CPU's older elemental emitters for fusions
# instead of the MLIR fusion emitters. The HLO, its passes and IEEE float semantics are
# the same (no fast-math either way); only machine code differs, slower, which test-sized
# inputs do not notice. CI runs the operator matrix at XLA's defaults as well (.ci/run).
# The sharded children use them too.
FAST_COMPILE_FLAGS = ("--xla_backend_optimization_level=0",
                      "--xla_llvm_disable_expensive_passes=true",
                      "--xla_cpu_use_fusion_emitters=false")
DEFAULTS_VAR = "JAXOPS_TEST_XLA_DEFAULTS"  # =1: test with XLA's default compile settings
_OWNED_CACHE = []  # the cache directory this process made (the xdist controller's)


def _cheaper_compiles() -> None:
    """Makes the session's compiles cheaper, before anything imports jax.

    Compiling (not running) is most of the suite's time: hundreds of small programs, many
    of them the same program traced again by another test or another xdist worker. So:

    - ``FAST_COMPILE_FLAGS`` are appended to ``XLA_FLAGS`` (kept: whatever the caller set);
    - one JAX persistent compilation cache, fresh for the run and removed at its end, is
      shared by the workers and the subprocesses the tests start (environment variables,
      inherited): a program compiled once is loaded, not compiled, by the next test that
      traces it. Nothing survives the run, so every run compiles from a clean state.

    ``JAXOPS_TEST_XLA_DEFAULTS=1`` turns both off (CI runs the operator matrix that way too).
    """
    if os.environ.get(DEFAULTS_VAR) == "1":
        return
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_backend_optimization_level" not in flags:
        os.environ["XLA_FLAGS"] = " ".join([flags, *FAST_COMPILE_FLAGS]).strip()
    if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
        _OWNED_CACHE.append(tempfile.mkdtemp(prefix="jaxops-test-compile-cache-"))
        os.environ.update(JAX_COMPILATION_CACHE_DIR=_OWNED_CACHE[0],
                          JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                          JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")


_cheaper_compiles()

#: Python's cyclic GC thresholds in the test processes (default (700, 10, 10)). A worker that
#: has imported jax, onnx and the tests holds millions of objects, and tracing allocates fast:
#: at the default, a young-generation pass every 700 allocations cost ~10 % of a worker's CPU
#: (4.5 s of ~40 s over four test files, measured with gc.callbacks); at these, under 1 s.
#: Garbage is still collected (a pass every 50,000 allocations), only less often; nothing that
#: a test checks depends on when. The 8-device child sets them too: the constant lives in
#: tests/helpers/eight_devices.py (standard library only, so importing it here imports no
#: jax); the other subprocesses the tests start keep Python's defaults.
gc.set_threshold(*GC_THRESHOLDS)

#: JAXOPS_TEST_LADDER: "off" runs every operator at its full capacity (no capacity ladder,
#: jaxops/ops/ladder.py); "fine" starts the ladder at 4 slots, so the tests' small inputs
#: climb several tiers. The oracle tests pass under both, and under the default ladder:
#: the outputs are the same with and without it.
LADDER_VAR = "JAXOPS_TEST_LADDER"
_LADDER_MODES = {"off": {"enabled": False}, "fine": {"smallest": 4, "factor": 4}}


@pytest.fixture(autouse=True, scope="session")
def _ladder_mode():
    """The ladder that ``JAXOPS_TEST_LADDER`` asks for, for the whole session."""
    mode = os.environ.get(LADDER_VAR)
    if not mode:
        yield
        return
    if mode not in _LADDER_MODES:
        raise pytest.UsageError(f"{LADDER_VAR}={mode!r}: expected one of {sorted(_LADDER_MODES)}")
    from jaxops.ops.ladder import settings

    with settings(**_LADDER_MODES[mode]):
        yield


def pytest_configure(config):
    config.addinivalue_line("markers", "x64_off: a test of what happens with x64 off (JAX's "
                            "default); it runs with x64 off in a JAX_ENABLE_X64=1 session too")


@pytest.fixture(autouse=True)
def _x64_off_where_the_default_mode_is_shown(request):
    """Doctests, and tests marked ``x64_off``, show the default mode's behaviour (x64 off:
    dtypes such as ``int32`` in what they print, 64-bit ids narrowed at the jit boundary,
    word pairs): in a session started with ``JAX_ENABLE_X64=1`` they still run with x64 off
    (a marked test may switch x64 on inside to compare). Other tests keep the mode."""
    if not (isinstance(request.node, pytest.DoctestItem)
            or request.node.get_closest_marker("x64_off")):
        yield
        return
    import jax

    with jax.enable_x64(False):
        yield


collect_ignore = [path for path, module in (("jaxops/nnx.py", "flax"),
                                            ("jaxops/equinox.py", "equinox"))
                  if importlib.util.find_spec(module) is None]


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session):
    """On an xdist worker, before it reports "finished": pay now what pytest pays after it.

    Once every worker has finished, xdist tears the workers down, and execnet sends SIGINT
    to a worker still busy 5 s later. What kept workers busy was (1) pytest's end-of-run
    ``gc.collect()`` passes (unraisable-exception check, one at unconfigure and one at
    cleanup), each traversing the whole heap of a worker that ran hundreds of jitted tests
    (measured ~4-5 s each on 2 loaded cores, in jax's ``_xla_gc_callback``, hence the
    ``KeyboardInterrupt`` traceback from it at the end of ``make test``), and (2) in runs
    that collected no hypothesis test, hypothesis' terminal-summary hook importing
    hypothesis. Freezing the heap makes those passes skip the objects that exist now
    (garbage made later, e.g. at teardown, is still collected and checked). (3) jax's exit
    hook (``jax._src.api.clean_up``, registered with ``atexit``) clears every cache and
    backend of the worker one by one: ~5 s per worker in a profile of ``make test``, spent
    freeing what the process's exit frees anyway, so a worker drops it (the workers start
    no ``jax.distributed`` run, which the hook would also shut down).
    """
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if importlib.util.find_spec("hypothesis") is not None:
        import hypothesis.internal.observability  # noqa: F401
    gc.collect()
    gc.freeze()
    api = sys.modules.get("jax._src.api")
    if api is not None and hasattr(api, "clean_up"):
        atexit.unregister(api.clean_up)


def pytest_unconfigure(config):
    """The process that made the run's compilation cache removes it."""
    for path in _OWNED_CACHE:
        shutil.rmtree(path, ignore_errors=True)
