"""Tests of jaxops/embedding and the optional layers (jaxops.nnx, jaxops.equinox)."""
