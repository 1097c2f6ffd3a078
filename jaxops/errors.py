"""Public home of jaxops' exception classes (defined in :mod:`jaxops.core.errors`).

Every error of the library subclasses :class:`JaxopsError`, so ``except JaxopsError``
catches them all (the CLI does, and prints one line).

>>> issubclass(UsageError, JaxopsError) and issubclass(OpArgumentError, ValueError)
True
"""

from jaxops.core import errors as _errors
from jaxops.core.errors import *  # noqa: F401,F403  (the names of core.errors.__all__)

# One list: a class added to the core's __all__ is public here too.
__all__ = list(_errors.__all__)
