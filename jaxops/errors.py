"""Public home of jaxops' exception classes (defined in :mod:`jaxops.core.errors`)."""

from jaxops.core.errors import (  # noqa: F401
    AclError, BackendUnavailableError, CapacityOverflowError, CapacityOverflowWarning,
    DuplicateOpError, JaxopsError,
    KernelNotFoundError, MissingInputError, OpArgumentError, OpDTypeError, OutshapeError,
    UnknownAttrError, UnknownOpError, UnsupportedDTypeError, describe,
)
