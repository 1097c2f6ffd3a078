"""Doctest collection skips the optional framework layers whose framework is not installed;
xdist workers end their session quickly enough not to be interrupted (see below)."""

import gc
import importlib.util
import os

import pytest

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
    (garbage made later, e.g. at teardown, is still collected and checked).
    """
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if importlib.util.find_spec("hypothesis") is not None:
        import hypothesis.internal.observability  # noqa: F401
    gc.collect()
    gc.freeze()
