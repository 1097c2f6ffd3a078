"""Tests of jaxops/ops: the operator matrix and each operator against its references."""
