"""One aclnn call on the CANN runtime: resources, the two-phase call, the read-back.

See :mod:`jaxops.backends.ascend` for the steps; :class:`Runtime` is the initialised
runtime detection hands out, :meth:`Runtime.dispatch` one call of an aclnn kernel.
"""

from __future__ import annotations

import atexit
import ctypes
import dataclasses
import math
import os
import threading
from collections.abc import Sequence
from ctypes import byref, c_int64, c_uint64, c_void_p
from typing import Any

import numpy as np

from jaxops.backends.acl import (ACL_FORMAT_ND, ACL_MEM_MALLOC_HUGE_FIRST,
                                 ACL_MEMCPY_DEVICE_TO_HOST, ACL_MEMCPY_HOST_TO_DEVICE,
                                 AclLibraries)
from jaxops.core.dtypes import DataType

__all__ = [
    "Arg", "DEVICE_VAR", "In", "Out", "Runtime", "Scalar",
]

DEVICE_VAR = "ASCEND_DEVICE_ID"


class Runtime:
    """An initialised CANN runtime: its libraries, the device, and the dispatch lock."""

    def __init__(self, lib: AclLibraries, owns_init: bool, device_count: int):
        self.lib = lib
        self.owns_init = owns_init
        self.device_count = device_count
        self.device = int(os.environ.get(DEVICE_VAR, "0"))
        self._lock = threading.Lock()
        self._device_held = False

    def hold_device(self) -> None:
        """Takes the process's device reference once (the custom-call route asks at trace
        time): it keeps the device context alive between calls; each dispatch binds its own
        thread with a further SetDevice/ResetDevice pair."""
        if not self._device_held:
            self.lib.call("aclrtSetDevice", self.device)
            self._device_held = True
            atexit.register(self.close)

    def close(self) -> None:
        """Releases the process's device reference (and aclInit, when jaxops did it)."""
        if self._device_held:
            self._device_held = False
            self.lib.raw("aclrtResetDevice")(self.device)
        if self.owns_init:
            self.owns_init = False
            self.lib.raw("aclFinalize")()

    def dispatch(self, aclnn: str, args: Sequence["Arg"]) -> list[np.ndarray]:
        """Runs ``aclnn<aclnn>`` with ``args`` (GetWorkspaceSize order); returns the
        :class:`Out` arguments as exact-shape arrays."""
        kinds = tuple(a.kind for a in args)
        self.lib.bind_aclnn(aclnn, kinds)
        with self._lock, _Resources(self.lib) as res:
            self.hold_device()
            self.lib.call("aclrtSetDevice", self.device)
            res.release("aclrtResetDevice", self.device)
            stream = c_void_p()
            self.lib.call("aclrtCreateStream", byref(stream))
            res.release("aclrtDestroyStream", stream)
            c_args, outs = [], []
            for a in args:
                if isinstance(a, (In, Out)):
                    tensor, ptr = res.device_tensor(a)
                    c_args.append(tensor)
                    if isinstance(a, Out):
                        outs.append((tensor, ptr, a.dtype))
                else:
                    c_args.append(a.value)
            workspace_size, executor = c_uint64(0), c_void_p()
            self.lib.call(f"aclnn{aclnn}GetWorkspaceSize", *c_args, byref(workspace_size),
                          byref(executor))
            # A repeatable executor is ours to destroy, so it cannot leak when a step before
            # aclnn<Op> fails (the runtime frees a plain one only inside aclnn<Op>). The
            # release is registered first: if marking fails, destroying is still tried.
            res.release("aclDestroyAclOpExecutor", executor)
            self.lib.call("aclSetAclOpExecutorRepeatable", executor)
            workspace = res.malloc(workspace_size.value) if workspace_size.value else None
            self.lib.call(f"aclnn{aclnn}", workspace, workspace_size, executor, stream)
            self.lib.call("aclrtSynchronizeStream", stream)
            return [self._read(tensor, ptr, dtype) for tensor, ptr, dtype in outs]

    def _read(self, tensor, ptr, dtype: np.dtype) -> np.ndarray:
        dims, ndim = ctypes.POINTER(c_int64)(), c_uint64(0)
        self.lib.call("aclGetViewShape", tensor, byref(dims), byref(ndim))
        try:
            shape = tuple(int(dims[k]) for k in range(ndim.value))
        finally:
            self.lib.free_host(dims)
        host = np.empty(shape, dtype)
        if host.nbytes:
            self.lib.call("aclrtMemcpy", host.ctypes.data, host.nbytes, ptr, host.nbytes,
                          ACL_MEMCPY_DEVICE_TO_HOST)
        return host


@dataclasses.dataclass(frozen=True)
class In:
    """An input tensor (copied to the device)."""

    array: np.ndarray
    kind = "tensor"


@dataclasses.dataclass(frozen=True)
class Out:
    """An output tensor, allocated at its max shape; read back at its refreshed shape."""

    shape: tuple[int, ...]
    dtype: np.dtype
    kind = "tensor"


@dataclasses.dataclass(frozen=True)
class Scalar:
    """A scalar argument: ``kind`` is ``bool``, ``int64`` or ``double``."""

    kind: str
    value: Any


Arg = In | Out | Scalar


class _Resources:
    """Runtime resources of one dispatch, released in reverse order on every path.

    A release that fails after success raises; after an error it is attached to that
    error as a note, so the first failure stays the one reported.
    """

    def __init__(self, lib: AclLibraries):
        self.lib = lib
        self._releases: list[tuple[str, tuple]] = []

    def release(self, symbol: str, *args) -> None:
        self._releases.append((symbol, args))

    def malloc(self, nbytes: int) -> c_void_p:
        ptr = c_void_p()
        self.lib.call("aclrtMalloc", byref(ptr), max(int(nbytes), 1), ACL_MEM_MALLOC_HUGE_FIRST)
        self.release("aclrtFree", ptr)
        return ptr

    def device_tensor(self, arg: In | Out) -> tuple[c_void_p, c_void_p]:
        host = np.ascontiguousarray(arg.array) if isinstance(arg, In) else None
        shape = host.shape if host is not None else tuple(arg.shape)
        dtype = host.dtype if host is not None else np.dtype(arg.dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        ptr = self.malloc(nbytes)
        if host is not None and nbytes:
            self.lib.call("aclrtMemcpy", ptr, max(nbytes, 1), host.ctypes.data, nbytes,
                          ACL_MEMCPY_HOST_TO_DEVICE)
        rank = len(shape)
        strides = [math.prod(shape[k + 1:]) for k in range(rank)]
        dims_c, strides_c = (c_int64 * max(rank, 1))(*shape), (c_int64 * max(rank, 1))(*strides)
        tensor = self.lib.raw("aclCreateTensor")(dims_c, rank, int(DataType.from_dtype(dtype)),
                                                  strides_c, 0, ACL_FORMAT_ND, dims_c, rank, ptr)
        if not tensor:
            err = self.lib.error("aclCreateTensor", -1)
            err.args = (err.args[0].replace("failed with aclError -1", "returned NULL"),)
            raise err
        tensor = c_void_p(tensor)
        self.release("aclDestroyTensor", tensor)
        return tensor, ptr

    def __enter__(self) -> "_Resources":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        failures = []
        for symbol, args in reversed(self._releases):
            code = self.lib.raw(symbol)(*args)
            if code != 0:
                failures.append(self.lib.error(symbol, code))
        if failures and exc is None:
            raise failures[0]
        for f in failures:
            if hasattr(exc, "add_note"):
                exc.add_note(f"while releasing resources after this error: {f}")
        return False
