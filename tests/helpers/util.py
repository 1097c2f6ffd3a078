"""Small helpers shared by the tests."""

from __future__ import annotations

import contextlib
import os
import warnings
import zlib

import jax

from jaxops.errors import CapacityOverflowWarning

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
#: The checkout (what the processes the tests start put on ``sys.path``).
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class CompileCounter:
    """Counts XLA backend compilations while active (``with CompileCounter() as c: ...``)."""

    def __init__(self):
        self.count = 0

    def _listener(self, event: str, duration: float, **kwargs) -> None:
        if event == BACKEND_COMPILE_EVENT:
            self.count += 1

    def __enter__(self) -> "CompileCounter":
        jax.monitoring.register_event_duration_secs_listener(self._listener)
        return self

    def __exit__(self, *exc) -> None:
        jax.monitoring.unregister_event_duration_listener(self._listener)


@contextlib.contextmanager
def expected_truncation():
    """Silences CapacityOverflowWarning, for calls that truncate on purpose (the warning's
    wording and once-per-call-site rule are asserted in tests/capacity/test_overflow_policies.py;
    once per site means a ``pytest.warns`` in a loop or a parametrized test would depend on
    the test order)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CapacityOverflowWarning)
        yield


def seed_of(*parts) -> int:
    """A generator seed from a test's parameters, the same in every process (Python's
    ``hash`` of a str, or of None on 3.11, changes from one process to the next).

    >>> seed_of("adam", False) == seed_of("adam", False)
    True
    """
    return zlib.crc32(repr(parts).encode())
