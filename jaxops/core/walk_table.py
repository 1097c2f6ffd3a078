"""Faster kernels for the hash tables' walks, registered by a backend; the hash ops ask here.

The hash-table operations (``jaxops/hashtable``) are built from a few walks over a
table: find each key (``find_slots``), group a batch's duplicates (``first_occurrences``),
place new keys in batch order (``place_new_keys``), read rows by slot (``gather_rows``),
or find keys and read their rows in one pass (``find_rows``); and the row moves every
training step makes into a table's per-slot arrays: read rows by slot (``take_rows``),
write them in place (``put_rows``), and make a table's arrays (``fill``).
Their xla versions are the reference and the fallback. A backend with a faster kernel for
a walk (:mod:`jaxops.native`: C++ through the XLA FFI) registers it here by the walk's
name; an operation asks :func:`walk_kernel` when it is traced and runs its xla walk when
the answer is ``None``. So the operations never import the backend (imports point down).

Which path the walks take follows backend selection (:mod:`jaxops.core.backend_table`):
``use_backend(name)`` or ``JAXOPS_BACKEND=name`` naming another backend (``"xla"``) gives
the xla walks; otherwise the registered backend's walks run where it is available
(``JAXOPS_NATIVE=0`` makes the native backend unavailable). Like every backend choice it
is made when a function is traced: a jitted function keeps the walks it was traced with.

>>> path, why = walk_path()
>>> path in ("xla", "native"), isinstance(why, str)
(True, True)
>>> from jaxops.core.backend_table import use_backend
>>> with use_backend("xla"):
...     walk_path()[0], walk_kernel("find_slots") is None
('xla', True)
"""

from __future__ import annotations

from collections.abc import Callable

from jaxops.core import loading
from jaxops.core.backend_table import backend_status, requested_backend

__all__ = ["WALKS", "probing_ops", "register_walk", "uses_walks", "walk_kernel", "walk_path"]

#: The walks a backend may serve (see the module docstring).
WALKS = ("find_slots", "first_occurrences", "place_new_keys", "gather_rows", "find_rows",
         "take_rows", "put_rows", "fill")

_KERNELS: dict[str, tuple[str, Callable]] = {}  # walk -> (backend, kernel)
_PROBING_OPS: set[str] = set()


def register_walk(walk: str, backend: str, kernel: Callable) -> None:
    """Registers ``backend``'s kernel for ``walk`` (one of :data:`WALKS`; one backend
    serves the walks)."""
    if walk not in WALKS:
        raise ValueError(f"unknown hash-table walk {walk!r}; walks: {', '.join(WALKS)}")
    others = {b for b, _ in _KERNELS.values()} - {backend}
    if others:
        raise ValueError(f"the hash-table walks are served by {others.pop()!r} already; "
                         f"{backend!r} cannot register {walk!r}")
    _KERNELS[walk] = (backend, kernel)


def walk_path() -> tuple[str, str]:
    """``(backend, why)``: the backend whose walks the hash ops take if traced now
    (``"xla"``: their own)."""
    if not _KERNELS:
        loading.load_all()  # the native walks register when the library loads
    if not _KERNELS:
        return "xla", "no backend registered hash-table walks"
    backend = next(iter(_KERNELS.values()))[0]
    name, source = requested_backend()
    if name is not None and name != backend:
        return "xla", f"{source} asks for {name!r}"
    ok, reason = backend_status(backend)
    if not ok:
        return "xla", f"the {backend} backend is unavailable: {reason}"
    return backend, reason


def walk_kernel(walk: str) -> Callable | None:
    """The registered kernel of ``walk`` when the walks take its backend now, else ``None``
    (run the xla walk)."""
    if walk not in _KERNELS or walk_path()[0] == "xla":
        return None
    return _KERNELS[walk][1]


def uses_walks(op_name: str) -> None:
    """Marks operator ``op_name`` as built from the walks (``explain`` then names their path)."""
    _PROBING_OPS.add(op_name)


def probing_ops() -> frozenset[str]:
    """The operators marked by :func:`uses_walks`."""
    return frozenset(_PROBING_OPS)
