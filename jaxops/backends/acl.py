"""The CANN runtime ABI through ctypes: libascendcl, libnnopbase, libopapi.

Signatures follow the public headers: ``acl/acl_base.h`` and ``acl/acl_rt.h`` (aclInit,
aclrtSetDevice, aclrtGetDeviceCount, aclrtCreateStream, aclrtMalloc, aclrtMemcpy,
aclrtSynchronizeStream, …), ``aclnn/acl_meta.h`` (aclCreateTensor, aclDestroyTensor,
aclGetViewShape, aclSetAclOpExecutorRepeatable, aclDestroyAclOpExecutor) and each
operator's ``aclnnop/aclnn_<op>.h`` (the two-phase ``aclnn<Op>GetWorkspaceSize`` /
``aclnn<Op>``). Every call that returns an aclError/aclnnStatus goes through
:meth:`AclLibraries.call`, which raises :class:`~jaxops.errors.AclError` naming the call
and the code (plus ``aclGetRecentErrMsg`` when the runtime has one).
"""

from __future__ import annotations

import ctypes
import os
from ctypes import POINTER, c_bool, c_char_p, c_int, c_int32, c_int64, c_size_t, c_uint32, \
    c_uint64, c_void_p

from jaxops.core.errors import AclError, LibraryLoadError

__all__ = [
    "ACL_ERROR_REPEAT_INITIALIZE", "ACL_FORMAT_ND", "ACL_MEMCPY_DEVICE_TO_HOST",
    "ACL_MEMCPY_HOST_TO_DEVICE", "ACL_MEM_MALLOC_HUGE_FIRST", "ACL_SUCCESS", "AclLibraries",
    "LIBRARIES", "SCALAR_TYPES",
]

ACL_SUCCESS = 0
ACL_ERROR_REPEAT_INITIALIZE = 100002
ACL_FORMAT_ND = 2
ACL_MEM_MALLOC_HUGE_FIRST = 0
ACL_MEMCPY_HOST_TO_DEVICE = 1
ACL_MEMCPY_DEVICE_TO_HOST = 2

#: The toolkit libraries, in load order (later ones link against earlier ones).
LIBRARIES = ("libascendcl.so", "libnnopbase.so", "libopapi.so")

_I64P = POINTER(c_int64)
_SIGNATURES: dict[str, dict[str, tuple]] = {
    "libascendcl.so": {
        "aclInit": (c_int, [c_char_p]),
        "aclFinalize": (c_int, []),
        "aclrtGetDeviceCount": (c_int, [POINTER(c_uint32)]),
        "aclrtSetDevice": (c_int, [c_int32]),
        "aclrtResetDevice": (c_int, [c_int32]),
        "aclrtCreateStream": (c_int, [POINTER(c_void_p)]),
        "aclrtDestroyStream": (c_int, [c_void_p]),
        "aclrtSynchronizeStream": (c_int, [c_void_p]),
        "aclrtMalloc": (c_int, [POINTER(c_void_p), c_size_t, c_int]),
        "aclrtFree": (c_int, [c_void_p]),
        "aclrtMemcpy": (c_int, [c_void_p, c_size_t, c_void_p, c_size_t, c_int]),
    },
    "libnnopbase.so": {
        # aclTensor *aclCreateTensor(const int64_t *viewDims, uint64_t viewDimsNum,
        #     aclDataType dataType, const int64_t *stride, int64_t offset, aclFormat format,
        #     const int64_t *storageDims, uint64_t storageDimsNum, void *tensorData)
        "aclCreateTensor": (c_void_p, [_I64P, c_uint64, c_int, _I64P, c_int64, c_int, _I64P,
                                       c_uint64, c_void_p]),
        "aclDestroyTensor": (c_int, [c_void_p]),
        "aclGetViewShape": (c_int, [c_void_p, POINTER(_I64P), POINTER(c_uint64)]),
        "aclSetAclOpExecutorRepeatable": (c_int, [c_void_p]),
        "aclDestroyAclOpExecutor": (c_int, [c_void_p]),
    },
}
_OPTIONAL = {"libascendcl.so": {"aclGetRecentErrMsg": (c_char_p, [])}}

#: ctypes types of the scalar arguments aclnn GetWorkspaceSize functions take.
SCALAR_TYPES = {"tensor": c_void_p, "bool": c_bool, "int64": c_int64, "double": ctypes.c_double}

# aclnn<Op>(void *workspace, uint64_t workspaceSize, aclOpExecutor *executor, aclrtStream)
_PHASE2 = (c_int, [c_void_p, c_uint64, c_void_p, c_void_p])


def _find(name: str, lib_dirs: list[str]) -> str:
    for d in lib_dirs:
        path = os.path.join(d, name)
        if os.path.exists(path):
            return path
    return name  # let the dynamic loader search the library path (LD_LIBRARY_PATH)


class AclLibraries:
    """The three runtime libraries, loaded and typed. ``lib_dirs`` are searched first."""

    def __init__(self, lib_dirs: list[str]):
        self.paths: dict[str, str] = {}
        self._libs: dict[str, ctypes.CDLL] = {}
        self._functions: dict[str, ctypes._CFuncPtr] = {}
        for name in LIBRARIES:
            path = _find(name, lib_dirs)
            try:
                # RTLD_GLOBAL: libopapi resolves libnnopbase/libascendcl symbols from these.
                self._libs[name] = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            except OSError as e:
                raise LibraryLoadError(f"{name}: cannot load ({e})") from None
            self.paths[name] = path
            for symbol, signature in _SIGNATURES.get(name, {}).items():
                self._bind(name, symbol, signature, required=True)
            for symbol, signature in _OPTIONAL.get(name, {}).items():
                self._bind(name, symbol, signature, required=False)
        self._libc = ctypes.CDLL(None)
        self._libc.free.argtypes, self._libc.free.restype = [c_void_p], None

    def _bind(self, lib: str, symbol: str, signature: tuple, required: bool) -> bool:
        try:
            fn = getattr(self._libs[lib], symbol)
        except AttributeError:
            if required:
                raise LibraryLoadError(f"{lib} does not export {symbol}") from None
            return False
        fn.restype, fn.argtypes = signature
        self._functions[symbol] = fn
        return True

    def has(self, symbol: str) -> bool:
        """Whether libopapi (or an already bound library) exports ``symbol``."""
        return symbol in self._functions or hasattr(self._libs["libopapi.so"], symbol)

    def bind_aclnn(self, op: str, scalar_kinds: tuple[str, ...]) -> None:
        """Types ``aclnn<op>GetWorkspaceSize`` (``scalar_kinds`` then the workspace-size
        and executor out-pointers) and ``aclnn<op>``."""
        phase1 = (c_int, [SCALAR_TYPES[k] for k in scalar_kinds]
                  + [POINTER(c_uint64), POINTER(c_void_p)])
        for symbol, signature in ((f"aclnn{op}GetWorkspaceSize", phase1), (f"aclnn{op}", _PHASE2)):
            if symbol not in self._functions:
                self._bind("libopapi.so", symbol, signature, required=True)

    def raw(self, symbol: str):
        """The typed ctypes function (for calls that do not return an aclError)."""
        return self._functions[symbol]

    def call(self, symbol: str, *args) -> None:
        """Calls ``symbol``; a non-zero status raises AclError naming call and code."""
        code = self._functions[symbol](*args)
        if code != ACL_SUCCESS:
            raise self.error(symbol, code)

    def error(self, symbol: str, code: int) -> AclError:
        err = AclError(symbol, int(code))
        recent = self._functions.get("aclGetRecentErrMsg")
        message = recent() if recent is not None else None
        if message:
            err.args = (f"{err.args[0]}: {message.decode(errors='replace')}",)
        return err

    def free_host(self, pointer) -> None:
        """Releases an array the runtime allocated for the caller (aclGetViewShape's dims).

        The headers say ``delete[]``; for trivially destructible elements libstdc++'s
        ``operator new[]`` is ``malloc``, so libc ``free`` is the matching release.
        """
        self._libc.free(ctypes.cast(pointer, c_void_p))
