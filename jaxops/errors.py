"""Public home of jaxops' exception classes (defined in :mod:`jaxops.core.errors`)."""

from jaxops.core.errors import (
    AclError, BackendUnavailableError, CapacityOverflowError, CapacityOverflowWarning,
    DuplicateBackendError, DuplicateOpError, JaxopsError, KernelNotFoundError, LibraryLoadError,
    MissingInputError, OpArgumentError, OpDTypeError, OutshapeError, UnknownAttrError,
    UnknownOpError, UnsupportedDTypeError, describe,
)

__all__ = [
    "AclError", "BackendUnavailableError", "CapacityOverflowError", "CapacityOverflowWarning",
    "DuplicateBackendError", "DuplicateOpError", "JaxopsError", "KernelNotFoundError",
    "LibraryLoadError", "MissingInputError", "OpArgumentError", "OpDTypeError", "OutshapeError",
    "UnknownAttrError", "UnknownOpError", "UnsupportedDTypeError", "describe",
]
