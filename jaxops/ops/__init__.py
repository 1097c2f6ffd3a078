"""Operator kernels, one module per operator family.

Importing this package imports every module in it, and each module registers its OpDefs,
so an operator cannot be forgotten: adding one is a kernel file, a test file and the
registration inside the kernel file.
"""

import importlib
import pkgutil

__all__: list[str] = []

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
