"""Tests of jaxops/hashtable: operations against the plain-Python reference, placements and
the placement matrix, the 8-device checks."""
