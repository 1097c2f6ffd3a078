"""The backend table: where operator kernels can run, and which one a call runs on.

Backends register themselves here (:func:`register_backend`: a name, whether it can run in
this process, whether it serves a given call, whether automatic selection may pick it), as
kernels register themselves into an OpDef; the core never imports a backend. ``xla`` (the
pure-JAX kernels, the reference and the fallback) is registered here.

The rules, strongest first (:mod:`jaxops.backends.selection` documents them for users):

1. ``backend=`` on the call: strict. An unknown or unavailable backend, or one that cannot
   run the call, raises :class:`~jaxops.errors.BackendUnavailableError`.
2. :func:`use_backend` (innermost ``with`` wins), then the environment variable
   ``JAXOPS_BACKEND``: a preference. An unknown or unavailable backend raises; a call the
   backend cannot run falls back to ``xla``, and the :class:`Selection` says why.
3. Otherwise automatic: the auto-selectable backends by decreasing priority, the first
   that is available and serves the call; else ``xla``.

>>> backend_names()[:2]
('xla', 'host')
>>> backend_status("xla")
(True, 'pure-JAX kernels (jit, vmap and grad everywhere)')
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from jaxops.core import loading
from jaxops.core.errors import BackendUnavailableError, DuplicateBackendError

__all__ = [
    "AUTOMATIC", "DEFAULT_BACKEND", "ENV_VAR", "BackendEntry", "Selection", "backend_entry",
    "backend_names", "backend_status", "op_support", "register_backend", "requested_backend",
    "select",
    "select_backend", "use_backend",
]

ENV_VAR = "JAXOPS_BACKEND"
AUTOMATIC = "auto"
DEFAULT_BACKEND = "xla"


class _Op(Protocol):  # what selection reads of an OpDef (the registry imports this module)
    name: str

    def has_kernel(self, backend: str) -> bool: ...

    def backends(self) -> list[str]: ...


Status = Callable[[], tuple[bool, str]]
Supports = Callable[[Any, Sequence[Any] | None, dict[str, Any] | None], tuple[bool, str]]


@dataclasses.dataclass(frozen=True)
class BackendEntry:
    """One row of the table.

    Args:
      name: the backend's name (``backend=`` takes it).
      status: ``() -> (available, reason)``: whether it can run at all in this process.
      supports: ``(op, inputs, attrs) -> (ok, reason)``: whether it serves this call of an
        op it has a kernel for (``None``: every such call). ``inputs``/``attrs`` may be None.
      auto_priority: ``None``: never chosen automatically; otherwise the automatic choice
        tries the highest priority first.
      auto_reason: what :class:`Selection` says when the automatic choice picks it.
      unavailable_hint: appended to the error for an unavailable backend.
    """

    name: str
    status: Status
    supports: Supports | None = None
    auto_priority: int | None = None
    auto_reason: str = ""
    unavailable_hint: str = ""


_TABLE: dict[str, BackendEntry] = {}
_scope: contextvars.ContextVar[str | None] = contextvars.ContextVar("jaxops_backend", default=None)


def register_backend(entry: BackendEntry) -> BackendEntry:
    """Adds a backend to the table (in registration order); a name registered twice raises."""
    if entry.name in _TABLE or entry.name == AUTOMATIC:
        raise DuplicateBackendError(f"backend {entry.name!r} is already registered")
    _TABLE[entry.name] = entry
    return entry


def backend_names() -> tuple[str, ...]:
    """The registered backends, in registration order (the library loaded first)."""
    loading.load_all()
    return tuple(_TABLE)


def backend_entry(name: str) -> BackendEntry:
    """The table row of ``name`` (a KeyError for an unknown name)."""
    return _TABLE[name]


def backend_status(name: str) -> tuple[bool, str]:
    """Whether backend ``name`` can run at all in this process, and why."""
    return _TABLE[name].status()


def op_support(op: _Op, name: str, inputs: Sequence[Any] | None = None,
               attrs: dict[str, Any] | None = None) -> tuple[bool, str]:
    """Whether backend ``name`` (assumed available) can run ``op`` on these inputs."""
    if not op.has_kernel(name):
        return False, f"{op.name} has no {name!r} kernel (kernels: {', '.join(op.backends())})"
    supports = _TABLE[name].supports
    return supports(op, inputs, attrs) if supports is not None else (True, "kernel registered")


@dataclasses.dataclass(frozen=True)
class Selection:
    """What :func:`select` chose for one operator, where the request came from
    (``"backend= argument"``, ``"use_backend"``, ``"JAXOPS_BACKEND"``, ``"automatic"``) and
    why; ``passed_over`` lists the backends considered first and the reason each lost."""

    op: str
    backend: str
    source: str
    reason: str
    passed_over: tuple[tuple[str, str], ...] = ()
    probing: str = ""  # hash-table ops: which path their walks take (core.walk_table)

    def __str__(self) -> str:
        text = f"{self.op} runs on {self.backend!r} ({self.source}): {self.reason}."
        for name, why in self.passed_over:
            text += f" Not {name!r}: {why}."
        return text + (f" Hash probing: {self.probing}." if self.probing else "")


def _check_available(name: str, source: str) -> None:
    if name not in _TABLE:
        loading.load_all()  # a backend of the library not loaded yet registers itself
    if name not in _TABLE:
        raise BackendUnavailableError(f"unknown backend {name!r} (from {source}); known "
                                      f"backends: {', '.join(_TABLE)}")
    ok, reason = backend_status(name)
    if not ok:
        raise BackendUnavailableError(f"backend {name!r} (from {source}) is unavailable: "
                                      f"{reason}.{_TABLE[name].unavailable_hint}")


def requested_backend() -> tuple[str | None, str]:
    """The backend asked for by :func:`use_backend` or ``JAXOPS_BACKEND`` (``None``:
    automatic) and where the request comes from."""
    scoped = _scope.get()
    if scoped == AUTOMATIC:
        return None, "automatic"
    if scoped is not None:
        return scoped, "use_backend"
    env = os.environ.get(ENV_VAR, "").strip()
    if env and env != AUTOMATIC:
        return env, ENV_VAR
    return None, "automatic"


def select(op: _Op, requested: str | None = None, inputs: Sequence[Any] | None = None,
           attrs: dict[str, Any] | None = None) -> Selection:
    """The backend a call of ``op`` runs on, with the reason (see the module docstring)."""
    name, source = ((requested, "backend= argument") if requested is not None
                    else requested_backend())
    if name is not None:
        _check_available(name, source)
        ok, why = op_support(op, name, inputs, attrs)
        if ok:
            return Selection(op.name, name, source, "requested explicitly" if source ==
                             "backend= argument" else f"requested by {source}")
        if source == "backend= argument":
            raise BackendUnavailableError(f"{op.name}: backend {name!r} was requested but "
                                          f"cannot run it: {why}.")
        return Selection(op.name, DEFAULT_BACKEND, source, f"fallback: {why}", ((name, why),))
    passed_over = []
    loading.load_all()  # automatic selection sees every backend, as after `import jaxops`
    candidates = sorted((e for e in _TABLE.values() if e.auto_priority is not None),
                        key=lambda e: -e.auto_priority)
    for entry in candidates:
        ok, why = entry.status()
        if ok:
            ok, why = op_support(op, entry.name, inputs, attrs)
            if ok:
                return Selection(op.name, entry.name, source, entry.auto_reason,
                                 tuple(passed_over))
        passed_over.append((entry.name, why))
    return Selection(op.name, DEFAULT_BACKEND, source, "the default backend", tuple(passed_over))


def select_backend(op: _Op, requested: str | None = None, inputs: Sequence[Any] | None = None,
                   attrs: dict[str, Any] | None = None) -> str:
    """The name of the backend a call of ``op`` runs on (what ``OpDef.__call__`` and
    ``tracing.launch`` run)."""
    return select(op, requested, inputs, attrs).backend


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Runs every operator call traced inside the block on backend ``name`` where it can
    (others fall back to ``xla``). ``"auto"`` restores automatic selection (ignoring
    ``JAXOPS_BACKEND``). An unknown or unavailable backend raises
    :class:`~jaxops.errors.BackendUnavailableError` on entry.

    >>> from jaxops.core.errors import BackendUnavailableError
    >>> try:
    ...     with use_backend("tpu"):
    ...         pass
    ... except BackendUnavailableError as e:
    ...     print(e)  # doctest: +ELLIPSIS
    unknown backend 'tpu' (from use_backend); known backends: xla, host...
    """
    if name != AUTOMATIC:
        _check_available(name, "use_backend")
    token = _scope.set(name)
    try:
        yield
    finally:
        _scope.reset(token)


register_backend(BackendEntry(
    DEFAULT_BACKEND, lambda: (True, "pure-JAX kernels (jit, vmap and grad everywhere)")))
