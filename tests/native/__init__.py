"""Tests of jaxops/native: the C++ XLA FFI kernels and hash walks against xla and numpy."""
