"""The ``native`` backend: C++ kernels called from XLA through the typed FFI (CPU only).

``pip install`` compiles ``jaxops/native/src/*.cc`` against the XLA FFI headers jaxlib
ships (``setup.py``) into a plain shared library. Importing this package loads it with
``ctypes`` and registers each handler with :func:`jax.ffi.register_ffi_target` for the CPU
platform; a kernel is then one :func:`jax.ffi.ffi_call` inside the jitted computation, with
no Python on the call path. The kernels decide exactly as the ``xla`` kernels do (those
stay the reference and the fallback): the tests compare them bit for bit.

The backend is chosen automatically on CPU for the operators it has a kernel for, unless
``JAXOPS_NATIVE=0``; when the library is not built or does not load, the ``xla`` kernels run
and :func:`why_unavailable` (and ``jaxops.backends.explain``) says why.

>>> import jaxops
>>> from jaxops import native
>>> isinstance(native.available(), bool), isinstance(native.why_unavailable(), str)
(True, True)
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os

import jax

from jaxops.core.backend_table import BackendEntry, register_backend
from jaxops.native import hash_walks as _hash_walks
from jaxops.native import kernels as _kernels

__all__ = ["ENV_VAR", "TARGETS", "available", "library_path", "release_scratch", "status",
           "why_unavailable"]

#: ``JAXOPS_NATIVE=0`` forces the xla kernels (the native backend reports itself unavailable).
ENV_VAR = "JAXOPS_NATIVE"

#: FFI target name -> exported handler symbol of the library.
TARGETS = {
    "jaxops_nonzero": "JaxopsNonZero",
    "jaxops_masked_select": "JaxopsMaskedSelect",
    "jaxops_onnx_nms": "JaxopsOnnxNms",
    "jaxops_batched_nms": "JaxopsBatchedNms",
    "jaxops_efficient_nms": "JaxopsEfficientNms",
    "jaxops_unique": "JaxopsUnique",
    "jaxops_unique_values": "JaxopsUniqueValues",
    "jaxops_hash_find": "JaxopsHashFind",
    "jaxops_hash_first": "JaxopsHashFirst",
    "jaxops_hash_place": "JaxopsHashPlace",
    "jaxops_hash_rows": "JaxopsHashRows",
    "jaxops_hash_find_rows": "JaxopsHashFindRows",
    "jaxops_take_rows": "JaxopsTakeRows",
    "jaxops_put_rows": "JaxopsPutRows",
    "jaxops_fill_huge": "JaxopsFillHuge",
    # the aclnn two-phase dispatch of the ascend backend (jaxops/backends/aclnn_call.py)
    "jaxops_aclnn": "JaxopsAclnn",
}


def library_path() -> str | None:
    """The built library next to this file, or ``None`` when it was not built."""
    found = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "_jaxops_native*.so")))
    return found[0] if found else None


@functools.lru_cache(maxsize=None)
def _library() -> ctypes.CDLL:
    """The built library, loaded once per process (OSError when absent or unloadable)."""
    path = library_path()
    if path is None:
        raise OSError("the native library is not built")
    return ctypes.cdll.LoadLibrary(path)


@functools.lru_cache(maxsize=None)
def _load() -> tuple[bool, str]:
    """Loads the library and registers its FFI targets once per process."""
    path = library_path()
    if path is None:
        return False, ("the native library is not built (pip install found no C++ compiler "
                       "or no jaxlib headers; reinstall with them to build it)")
    try:
        lib = _library()
        for target, symbol in TARGETS.items():
            jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, symbol)),
                                        platform="cpu")
    except (OSError, AttributeError, RuntimeError, ValueError) as e:
        return False, f"the native library {os.path.basename(path)} did not load: {e}"
    return True, f"C++ kernels through the XLA FFI ({os.path.basename(path)})"


def status() -> tuple[bool, str]:
    """Whether the native kernels run here, and why (or why not).

    Unavailable when ``JAXOPS_NATIVE=0``, when JAX's default backend is not the CPU (the
    kernels are CPU-only), or when the library is not built or does not load.
    """
    if os.environ.get(ENV_VAR, "").strip() == "0":
        return False, f"{ENV_VAR}=0 forces the xla kernels"
    platform = jax.default_backend()
    if platform != "cpu":
        return False, f"the native kernels run on the CPU; the default device is {platform!r}"
    return _load()


def available() -> bool:
    """Whether the native kernels run here (see :func:`status`)."""
    return status()[0]


def why_unavailable() -> str:
    """Why the native kernels do not run here; ``""`` when they do."""
    ok, reason = status()
    return "" if ok else reason


def release_scratch() -> int:
    """Frees the scratch memory the native kernels keep between calls; returns its bytes.

    A kernel's scratch blocks of 1 MB or more are kept when it returns (up to 256 MB in
    all, oldest freed first) and reused by the next call that needs about as much, so
    that repeated calls do not fault in fresh pages each time (a 4 KB page fault costs
    microseconds; ``find`` of 1M keys uses 20 MB of scratch). Call this to give them back
    to the allocator, e.g. after a phase of large calls. 0 when nothing is kept or the
    library is not loaded.

    >>> from jaxops import native
    >>> native.release_scratch() >= 0
    True
    """
    if _library.cache_info().currsize == 0:  # never loaded: no kernel ran, nothing kept
        return 0
    release = _library().jaxops_native_release_scratch
    release.restype = ctypes.c_size_t
    return int(release())


# Tried after ascend (priority 100), before the xla default; each kernel says which calls
# it serves (kernels.supports), so explain() names native only where it runs.
register_backend(BackendEntry("native", status, supports=_kernels.supports, auto_priority=50,
                              auto_reason="its C++ FFI kernel is built and serves the call"))
_kernels.register()
_hash_walks.register()
