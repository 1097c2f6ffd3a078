"""Tests of jaxops/golden."""
