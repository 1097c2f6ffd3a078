"""Builds jaxops' native kernels (C++ against the XLA FFI headers jaxlib ships).

The kernels are an optimisation: when jaxlib's headers or a C++ compiler are missing the
extension is skipped (``optional=True``) and the install still succeeds; jaxops then runs
its xla kernels and ``jaxops.backends.explain()`` says why. Everything else about the
package is in ``pyproject.toml``.
"""

import os

from setuptools import Extension, setup


def _ffi_include_dir() -> str | None:
    """jaxlib's header directory (``jax.ffi.include_dir()`` without importing jax)."""
    try:
        import jaxlib
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(jaxlib.__file__), "include")
    return path if os.path.exists(os.path.join(path, "xla", "ffi", "api", "ffi.h")) else None


def _extensions() -> list[Extension]:
    include = _ffi_include_dir()
    if include is None or os.environ.get("JAXOPS_BUILD_NATIVE", "1") == "0":
        print("jaxops: jaxlib's XLA FFI headers not found; native kernels not built")
        return []
    src = os.path.join("jaxops", "native", "src")
    return [Extension(
        "jaxops.native._jaxops_native",
        sources=[os.path.join(src, f) for f in (
            "aclnn.cc", "compaction.cc", "hash.cc", "nms.cc", "rows.cc", "scratch.cc",
            "unique.cc")],
        depends=[os.path.join(src, h) for h in ("common.h", "nms_walk.h", "parallel.h",
                                                  "radix_sort.h")],
        include_dirs=[src],
        libraries=["dl"],  # aclnn.cc resolves the CANN runtime at run time (dlopen)
        # -isystem: jaxlib's headers warn under -Wall; -ffp-contract=off: no fused
        # multiply-adds, so every float op rounds as XLA's does.
        extra_compile_args=["-std=c++17", "-O3", "-ffp-contract=off", "-isystem", include],
        language="c++",
        optional=True,  # a failed compile warns; the package installs without it
    )]


setup(ext_modules=_extensions())
