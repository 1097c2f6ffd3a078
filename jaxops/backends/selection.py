"""Which backend an operator call runs on, and why.

The rules, strongest first:

1. ``backend=`` on the call (``jaxops.nonzero(x, backend="host")``, ``tracing.launch(...,
   backend=...)``): strict. An unknown or unavailable backend, or one without a kernel for
   the operator (or for its input dtype), raises :class:`BackendUnavailableError`.
2. :func:`use_backend` (innermost ``with`` wins), then the environment variable
   ``JAXOPS_BACKEND``: a preference for every call in scope. An unknown or unavailable
   backend raises; an operator the backend has no kernel for runs on ``xla`` instead, and
   :func:`explain` says so.
3. Otherwise automatic: ``ascend`` when the runtime is available and has the operator's
   aclnn kernel, else ``native`` (C++ FFI kernels, :mod:`jaxops.native`) on the CPU when
   the library is built and ``JAXOPS_NATIVE`` is not ``0``, else ``xla``. ``host`` is never
   chosen automatically.

Selection happens when a call is *traced*: a function jitted before entering
``use_backend`` keeps the backend it was traced with (jit caches traces by argument
shapes only). Pass ``backend=`` or jit inside the ``with`` block.

>>> import jax.numpy as jnp
>>> from jaxops.core.dtypes import FLOATING
>>> from jaxops.core.registry import Input, OpDef, Output
>>> neg = OpDef("DocNeg", [Input("x", FLOATING)], [Output("y", FLOATING)])
>>> _ = neg.kernel("xla")(lambda x: (-x,))
>>> print(explain(neg, requested="xla"))
DocNeg runs on 'xla' (backend= argument): requested explicitly.
>>> with use_backend("host"):
...     print(explain(neg).reason)
fallback: DocNeg has no 'host' kernel (kernels: xla)
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
from collections.abc import Iterator, Sequence
from typing import Any

from jaxops.core.errors import BackendUnavailableError
from jaxops.core.registry import OpDef, get_op, list_ops

ENV_VAR = "JAXOPS_BACKEND"
BACKENDS = ("xla", "host", "ascend", "native")
AUTOMATIC = "auto"

_scope: contextvars.ContextVar[str | None] = contextvars.ContextVar("jaxops_backend", default=None)


@dataclasses.dataclass(frozen=True)
class BackendStatus:
    """One backend: whether it can run here, why (or why not), and its operators."""

    name: str
    available: bool
    reason: str
    operators: tuple[str, ...]

    def __str__(self) -> str:
        state = "available" if self.available else "unavailable"
        return f"{self.name:7s} {state}: {self.reason} ({len(self.operators)} operators)"


@dataclasses.dataclass(frozen=True)
class Selection:
    """What :func:`select_backend` chose for one operator, where the request came from
    (``"backend= argument"``, ``"use_backend"``, ``"JAXOPS_BACKEND"``, ``"automatic"``) and
    why; ``passed_over`` lists the backends considered first and the reason each lost."""

    op: str
    backend: str
    source: str
    reason: str
    passed_over: tuple[tuple[str, str], ...] = ()

    def __str__(self) -> str:
        text = f"{self.op} runs on {self.backend!r} ({self.source}): {self.reason}."
        for name, why in self.passed_over:
            text += f" Not {name!r}: {why}."
        return text


def _backend_status(name: str) -> tuple[bool, str]:
    """Whether backend ``name`` can run at all in this process, and why."""
    if name == "xla":
        return True, "pure-JAX kernels (jit, vmap and grad everywhere)"
    if name == "host":
        return True, "numpy kernels reached through jax.pure_callback (backward pass on xla)"
    if name == "native":
        from jaxops import native  # loads the library only when asked

        return native.status()
    from jaxops.backends import ascend  # loads ctypes only when asked

    detection = ascend.detect()
    return detection.available, detection.summary()


def _op_support(op: OpDef, name: str, inputs: Sequence[Any] | None,
                attrs: dict[str, Any] | None) -> tuple[bool, str]:
    """Whether backend ``name`` (assumed available) can run ``op`` on these inputs."""
    if not op.has_kernel(name):
        return False, f"{op.name} has no {name!r} kernel (kernels: {', '.join(op.backends())})"
    if name == "ascend":
        from jaxops.backends import ascend

        return ascend.supports(op, inputs, attrs)
    return True, "kernel registered"


def available() -> list[BackendStatus]:
    """Every backend with its status and the operators that have a kernel on it.

    >>> [b.name for b in available()]
    ['xla', 'host', 'ascend', 'native']
    """
    out = []
    for name in BACKENDS:
        ok, reason = _backend_status(name)
        ops = tuple(n for n in list_ops() if get_op(n).has_kernel(name))
        out.append(BackendStatus(name, ok, reason, ops))
    return out


def _check_name(name: str, source: str) -> None:
    if name not in BACKENDS:
        raise BackendUnavailableError(f"unknown backend {name!r} (from {source}); known "
                                      f"backends: {', '.join(BACKENDS)}")


def _check_available(name: str, source: str) -> None:
    _check_name(name, source)
    ok, reason = _backend_status(name)
    if not ok:
        hint = " Run jaxops.backends.ascend.diagnose() for every step." if name == "ascend" else ""
        raise BackendUnavailableError(f"backend {name!r} (from {source}) is unavailable: "
                                      f"{reason}.{hint}")


def _request() -> tuple[str | None, str]:
    scoped = _scope.get()
    if scoped == AUTOMATIC:
        return None, "automatic"
    if scoped is not None:
        return scoped, "use_backend"
    env = os.environ.get(ENV_VAR, "").strip()
    if env and env != AUTOMATIC:
        return env, ENV_VAR
    return None, "automatic"


def select(op: OpDef | str, requested: str | None = None, inputs: Sequence[Any] | None = None,
           attrs: dict[str, Any] | None = None) -> Selection:
    """The backend a call of ``op`` runs on, with the reason (see the module docstring).

    ``inputs`` and ``attrs`` (optional) let the choice take input dtypes and attribute
    values into account (an aclnn kernel may not serve every configuration).
    """
    op = get_op(op) if isinstance(op, str) else op
    name, source = (requested, "backend= argument") if requested is not None else _request()
    if name is not None:
        _check_available(name, source)
        ok, why = _op_support(op, name, inputs, attrs)
        if ok:
            return Selection(op.name, name, source, "requested explicitly" if source ==
                             "backend= argument" else f"requested by {source}")
        if source == "backend= argument":
            raise BackendUnavailableError(f"{op.name}: backend {name!r} was requested but "
                                          f"cannot run it: {why}.")
        return Selection(op.name, "xla", source, f"fallback: {why}", ((name, why),))
    passed_over = []
    for name, reason in (("ascend", "the Ascend runtime has its kernel"),
                         ("native", "its C++ FFI kernel is built")):
        ok, why = _backend_status(name)
        if ok:
            ok, why = _op_support(op, name, inputs, attrs)
            if ok:
                return Selection(op.name, name, source, reason, tuple(passed_over))
        passed_over.append((name, why))
    return Selection(op.name, "xla", source, "the default backend", tuple(passed_over))


def select_backend(op: OpDef, requested: str | None = None,
                   inputs: Sequence[Any] | None = None,
                   attrs: dict[str, Any] | None = None) -> str:
    """The name of the backend a call of ``op`` runs on (the entry the registry and
    ``tracing.launch`` call)."""
    return select(op, requested, inputs, attrs).backend


def explain(op: OpDef | str, requested: str | None = None,
            inputs: Sequence[Any] | None = None,
            attrs: dict[str, Any] | None = None) -> Selection:
    """What a call of ``op`` would run on here and now, and why (``str()`` it to read;
    the module docstring has an example)."""
    return select(op, requested, inputs, attrs)


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Runs every operator call traced inside the block on backend ``name`` where it has a
    kernel (others fall back to ``xla``; :func:`explain` says which). ``"auto"`` restores
    automatic selection (ignoring ``JAXOPS_BACKEND``). An unknown or unavailable backend
    raises :class:`BackendUnavailableError` on entry.

    >>> from jaxops.core.errors import BackendUnavailableError
    >>> try:
    ...     with use_backend("tpu"):
    ...         pass
    ... except BackendUnavailableError as e:
    ...     print(e)
    unknown backend 'tpu' (from use_backend); known backends: xla, host, ascend, native
    """
    if name != AUTOMATIC:
        _check_available(name, "use_backend")
    token = _scope.set(name)
    try:
        yield
    finally:
        _scope.reset(token)
