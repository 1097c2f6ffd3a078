"""Public home of jaxops' exception classes (defined in :mod:`jaxops.core.errors`).

Every error of the library subclasses :class:`JaxopsError`, so ``except JaxopsError``
catches them all (the CLI does, and prints one line).

>>> issubclass(UsageError, JaxopsError) and issubclass(OpArgumentError, ValueError)
True
"""

from jaxops.core.errors import (
    AclError, BackendUnavailableError, BenchmarksNotFound, CapacityOverflowError,
    CapacityOverflowWarning, CheckpointError, DuplicateBackendError, DuplicateOpError,
    JaxopsError, KernelNotFoundError, LibraryLoadError, MissingInputError, OpArgumentError,
    OpDTypeError, OutshapeError, UnknownAttrError, UnknownOpError, UnsupportedDTypeError,
    UsageError, describe,
)

__all__ = [
    "AclError", "BackendUnavailableError", "BenchmarksNotFound", "CapacityOverflowError",
    "CapacityOverflowWarning", "CheckpointError", "DuplicateBackendError", "DuplicateOpError",
    "JaxopsError", "KernelNotFoundError", "LibraryLoadError", "MissingInputError",
    "OpArgumentError", "OpDTypeError", "OutshapeError", "UnknownAttrError", "UnknownOpError",
    "UnsupportedDTypeError", "UsageError", "describe",
]
