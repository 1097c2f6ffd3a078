"""Helper modules of the tests: references, the operator matrix and its rows, the children
that tests start. No tests here."""
