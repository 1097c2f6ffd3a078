"""Tests of jaxops/core: types, the op registry, DynArray, refresh, impl modes, resource checks."""
