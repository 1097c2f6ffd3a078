"""The exceptions jaxops raises.

Every error that comes from a user's input names the operator, the argument, what was
expected and what was given, and where it can, what to do about it. The classes subclass the
matching builtin (ValueError, TypeError, KeyError, RuntimeError) so existing ``except``
clauses keep working.
"""

from __future__ import annotations

__all__ = [
    "AclError", "BackendUnavailableError", "CapacityOverflowError",
    "CapacityOverflowWarning", "CheckpointError", "DuplicateBackendError", "DuplicateOpError",
    "JaxopsError", "KernelNotFoundError", "LibraryLoadError", "MissingInputError",
    "OpArgumentError", "OpDTypeError", "OutshapeError", "ResourceRequestError",
    "RouteOverflowError", "UnknownAttrError", "UnknownOpError",
    "UnsupportedDTypeError", "UsageError", "describe",
]


class JaxopsError(Exception):
    """Base class of every jaxops error."""


def describe(op: str, arg: str | None, expected: str, given: object, hint: str = "") -> str:
    """Formats the one message shape all jaxops input errors share.

    >>> describe("NonZero", "x", "a bool or numeric array", "str")
    "NonZero: argument 'x': expected a bool or numeric array, got str."
    """
    where = f"{op}: argument '{arg}'" if arg else op
    msg = f"{where}: expected {expected}, got {given}."
    return f"{msg} {hint}" if hint else msg


class OpArgumentError(JaxopsError, ValueError):
    """A bad value for an operator's input or attribute."""

    def __init__(self, op: str, arg: str | None, expected: str, given: object, hint: str = ""):
        self.op, self.arg, self.expected, self.given, self.hint = op, arg, expected, given, hint
        super().__init__(describe(op, arg, expected, given, hint))


class MissingInputError(OpArgumentError):
    """A required input was not given."""


class ResourceRequestError(OpArgumentError, MemoryError):
    """A request (a ``size=``, a table's capacity, a golden case's shape) needing more
    memory than the device has available, refused before anything is allocated."""


class UnknownAttrError(OpArgumentError):
    """An attribute the operator does not declare."""


class OpDTypeError(JaxopsError, TypeError):
    """An input whose dtype is outside the operator's allowed set."""

    def __init__(self, op: str, arg: str, expected: str, given: object, hint: str = ""):
        self.op, self.arg, self.expected, self.given, self.hint = op, arg, expected, given, hint
        super().__init__(describe(op, arg, expected, given, hint))


class UnknownOpError(JaxopsError, KeyError):
    """``get_op`` was asked for a name nobody registered."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable.
        return str(self.args[0])


class DuplicateOpError(JaxopsError, ValueError):
    """An operator name was registered twice."""


class DuplicateBackendError(JaxopsError, ValueError):
    """A backend name was registered twice."""


class UnsupportedDTypeError(JaxopsError, TypeError):
    """A CANN DataType with no numpy equivalent, or a dtype with no CANN code."""


class OutshapeError(JaxopsError, ValueError):
    """A malformed OP_OUTSHAPE tensor or refresh request."""


class CapacityOverflowError(JaxopsError, RuntimeError):
    """A data-dependent output did not fit the capacity it was given."""

    def __init__(self, op: str, capacity: int, true_size: int, hint: str = "",
                 lost: int | None = None, lost_results: int | None = None):
        self.op, self.capacity, self.true_size = op, capacity, true_size
        # in results along the capacity axis (rows of an [n, 3] output), like capacity and
        # true_size; and in elements, as DynArray.lost() counts them
        self.lost_results = true_size - capacity if lost_results is None else lost_results
        self.lost = self.lost_results if lost is None else lost
        msg = (f"{op}: output of {true_size} results does not fit capacity {capacity}: "
               f"{self.lost_results} results would be lost ({self.lost} elements, as "
               "DynArray.lost() counts them).")
        super().__init__(f"{msg} {hint}" if hint else msg)


class RouteOverflowError(CapacityOverflowError):
    """Keys of a hash-table call on a mesh did not fit a routing buffer (``route_capacity``):
    counted in keys, the unit the buffers hold."""

    def __init__(self, op: str, capacity: int, needed: int, lost: int):
        super().__init__(op, capacity, needed, lost=lost, lost_results=lost)
        self.args = (f"{op}: a routing buffer of {capacity} keys would need {needed}: {lost} "
                     "keys were not routed to their shard (not served). Pass a larger "
                     "route_capacity, or overflow='expand'.",)


class CapacityOverflowWarning(UserWarning):
    """A truncated data-dependent output: policy ``truncate``, ``check_overflow(policy="warn")``
    or :func:`~jaxops.refresh` of an overflowed DynArray."""


class BackendUnavailableError(JaxopsError, RuntimeError):
    """An explicitly requested backend cannot run here; the message says why."""


class KernelNotFoundError(JaxopsError, LookupError):
    """No kernel is registered for an operator on a backend."""


class AclError(JaxopsError, RuntimeError):
    """A CANN runtime call returned a non-zero aclError code."""

    def __init__(self, call: str, code: int):
        self.call, self.code = call, code
        super().__init__(f"{call} failed with aclError {code}")


class UsageError(JaxopsError, ValueError):
    """A mistake on the ``jaxops`` command line: one line on stderr, exit status 2."""


class CheckpointError(JaxopsError, ValueError):
    """A table file that is not one, is of an unknown version, truncated or corrupt."""


class LibraryLoadError(JaxopsError, OSError):
    """A toolkit library that is missing or does not export what the shim needs."""
