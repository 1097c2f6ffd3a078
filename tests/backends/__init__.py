"""Tests of jaxops/backends: backend selection, the host kernels, the Ascend shim on the
CANN double."""
