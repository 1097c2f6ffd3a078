"""Tests of jaxops/capacity: statistics and overflow policies."""
