"""Loading the whole library on first use: ``import jaxops`` stays cheap.

``import jaxops`` imports almost nothing; the first use of a public name (``jaxops.nonzero``,
``jaxops.get_op``...) imports every operator, backend and kernel, as ``import jaxops``
used to. The face registers that loader here (registration points down: the core does not
import the face), and the registry asks for it when a name is not registered yet, so
``jaxops.core.registry.get_op("NonZero")`` after a bare ``import jaxops`` still finds it.
A command that needs only part of the library (``jaxops golden NonZero``) imports that
part and never triggers the loader.

>>> calls = []
>>> set_loader(lambda: calls.append(1))
>>> load_all(), load_all(), calls
(True, False, [1])
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["lazy_attributes", "load_all", "loaded", "set_loader"]

_loader: Callable[[], None] | None = None
_state = {"loaded": False, "loading": False}


def set_loader(loader: Callable[[], None]) -> None:
    """Registers the function that loads the whole library (the face's; one at a time)."""
    global _loader
    _loader = loader
    _state["loaded"] = False


def loaded() -> bool:
    """Whether the whole library has been loaded."""
    return _state["loaded"]


def load_all() -> bool:
    """Runs the loader once (not again while it runs); ``True`` when it ran now."""
    if _loader is None or _state["loaded"] or _state["loading"]:
        return False
    _state["loading"] = True
    try:
        _loader()
        _state["loaded"] = True
    finally:
        _state["loading"] = False
    return True


def lazy_attributes(package: str, homes: dict[str, str], namespace: dict,
                    before: Callable[[], object] | None = None):
    """``(__getattr__, __dir__)`` for ``package`` (PEP 562): a name of ``homes`` is taken
    from its module on first use (``before()`` runs first, e.g. :func:`load_all`), any
    other name is imported as a submodule; ``namespace`` is the package's ``globals()``.

    >>> getattr_, _ = lazy_attributes("json", {"dumps": "json"}, {})
    >>> getattr_("dumps")([1])
    '[1]'
    """
    import importlib

    def __getattr__(name: str):
        if name.startswith("_"):  # dunders and private probes (doctest, pickle) load nothing
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        if name in homes:
            if before is not None:
                before()
            if name in namespace:
                return namespace[name]
            module = importlib.import_module(homes[name])
            return module if homes[name] == f"{package}.{name}" else getattr(module, name)
        try:
            return importlib.import_module(f"{package}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{package}.{name}":
                raise
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(homes))

    return __getattr__, __dir__
