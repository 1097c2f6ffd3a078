"""The test hooks of the built CANN double: live-resource counters and the last shape words."""

from __future__ import annotations

import ctypes
import os

import numpy as np

SLOT_WORDS = 9


class DoubleHooks:
    """Reads the double's counters; the libraries are the ones the shim loaded (dlopen
    returns the same handle for the same file)."""

    def __init__(self, root: str):
        lib64 = os.path.join(root, "lib64")
        self._cl = ctypes.CDLL(os.path.join(lib64, "libascendcl.so"), mode=ctypes.RTLD_GLOBAL)
        self._nn = ctypes.CDLL(os.path.join(lib64, "libnnopbase.so"), mode=ctypes.RTLD_GLOBAL)
        for lib, name in ((self._cl, "jaxopsDoubleLiveAllocs"), (self._cl, "jaxopsDoubleLiveStreams"),
                          (self._cl, "jaxopsDoubleDeviceRefs"), (self._nn, "jaxopsDoubleLiveTensors"),
                          (self._nn, "jaxopsDoubleLiveExecutors")):
            getattr(lib, name).restype = ctypes.c_long
        self._nn.jaxopsDoubleLastOutshape.argtypes = [ctypes.POINTER(ctypes.c_uint64)]

    def live(self) -> dict[str, int]:
        """Live allocations, streams, tensors, executors and device references."""
        return {
            "allocations": self._cl.jaxopsDoubleLiveAllocs(),
            "streams": self._cl.jaxopsDoubleLiveStreams(),
            "tensors": self._nn.jaxopsDoubleLiveTensors(),
            "executors": self._nn.jaxopsDoubleLiveExecutors(),
            "device_refs": self._cl.jaxopsDoubleDeviceRefs(),
        }

    def last_outshape(self) -> np.ndarray:
        """The 9 uint64 words of the most recent kernel shape write (one OP_OUTSHAPE slot)."""
        words = (ctypes.c_uint64 * SLOT_WORDS)()
        self._nn.jaxopsDoubleLastOutshape(words)
        return np.frombuffer(words, np.uint64).copy()
