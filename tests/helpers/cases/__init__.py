"""Rows of the shared operator test matrix (see ``tests/ops/test_op_matrix.py``).

Each module here defines ``CASES``: a list of :class:`tests.helpers.op_matrix.OpCase`. Adding an
operator to the generic eager / jit / vmap / grad / launch tests is adding one row.
"""
