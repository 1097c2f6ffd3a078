"""The ascend kernels on the CANN double: the XLA custom call beside the pure_callback route.

Both routes run the same aclnn dispatch on the C stand-in of the CANN runtime
(``tests/helpers/ascend_double``, built with the system C compiler); the ratio is what the custom
call saves by keeping Python off the call path. The stand-in's kernels are plain C loops,
so at large sizes the kernel itself dominates both sides. Each side is compiled ahead of
time (the route is chosen when a call is traced: ``JAXOPS_NATIVE=0`` for the callback side).
Without the native library or a C compiler the module reports nothing and says why.
"""

from __future__ import annotations

import os

import jax
import numpy as np

import jaxops
from benchmarks.common import Result, against, compare
from tests.helpers.ascend_double import build


def _compiled(fn, x, native_on: bool):
    saved = os.environ.pop("JAXOPS_NATIVE", None)
    if not native_on:
        os.environ["JAXOPS_NATIVE"] = "0"
    try:
        jax.clear_caches()  # the registry's jitted kernel would keep the route it traced
        return jax.jit(fn).lower(x).compile()
    finally:
        os.environ.pop("JAXOPS_NATIVE", None)
        if saved is not None:
            os.environ["JAXOPS_NATIVE"] = saved


def run(quick: bool) -> list[Result]:
    from jaxops import native
    from jaxops.backends import ascend

    if not native.available() or build.compiler() is None:
        print("ascend_route: needs the native library and a C compiler "
              f"({native.why_unavailable() or 'no C compiler'})")
        return []
    saved = os.environ.get("ASCEND_HOME_PATH")
    os.environ["ASCEND_HOME_PATH"] = build.build()
    try:  # the double must not stay the Ascend runtime of the benchmarks that follow
        if not ascend.detect(refresh=True).available:
            print(f"ascend_route: the double is not usable: {ascend.detect().summary()}")
            return []
        return _cases(quick)
    finally:
        os.environ.pop("ASCEND_HOME_PATH")
        if saved is not None:
            os.environ["ASCEND_HOME_PATH"] = saved
        ascend.detect(refresh=True)
        jax.clear_caches()


def _cases(quick: bool) -> list[Result]:
    rng = np.random.default_rng(0)
    results = []
    for n in (1_000, 100_000) if quick else (1_000, 100_000, 1_000_000):
        x = (rng.random(n) < 0.1).astype(np.float32)
        fn = lambda x: jaxops.nonzero(x, backend="ascend")  # noqa: E731
        ffi, callback = _compiled(fn, x, True), _compiled(fn, x, False)
        assert "jaxops_aclnn" in ffi.as_text() and "callback" in callback.as_text()
        want = np.stack(np.nonzero(x))  # both routes run the double's kernel: numpy checks
        results.append(compare(f"ascend nonzero {n:,} [custom call]", lambda: ffi(x),
                               "pure_callback route", lambda: callback(x),
                               repeats=5 if quick else 9, check=against(want, want)))
    return results
