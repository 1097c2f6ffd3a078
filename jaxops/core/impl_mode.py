"""Precision / performance modes of a kernel, as opbase's ``OpImplMode`` defines them.

A kernel description lists the modes it supports as a bitmap; a call asks for one through
its OP_OPTION (here: the :func:`impl_mode` context or ``impl_mode=`` on a call); the
executor picks the kernel with :func:`select_impl_mode` and keys its compile cache with the
mode's index character.

>>> m = impl_mode_from_str("high_precision")
>>> m, to_index(m), to_index_char(m)
(<OpImplMode.HIGH_PRECISION: 4>, 2, '2')
>>> supported = OpImplMode.HIGH_PERFORMANCE | OpImplMode.HIGH_PRECISION
>>> select_impl_mode(OpImplMode.DEFAULT, supported)
<OpImplMode.HIGH_PRECISION: 4>
"""

from __future__ import annotations

import contextlib
import difflib
import enum
import threading
import warnings
from collections.abc import Iterator, Mapping

from jaxops.core.errors import OpArgumentError

__all__ = [
    "OpExecMode", "OpImplMode", "as_impl_mode", "current_impl_mode", "impl_mode",
    "impl_mode_from_str", "impl_mode_names", "impl_mode_to_str", "parse_kernel_impl_modes",
    "select_impl_mode", "to_index", "to_index_char",
]


class OpImplMode(enum.IntFlag):
    """opbase ``OpImplMode`` bit flags."""

    DEFAULT = 0x1
    HIGH_PERFORMANCE = 0x2
    HIGH_PRECISION = 0x4
    SUPER_PERFORMANCE = 0x8
    SUPPORT_OUT_OF_BOUND_INDEX = 0x10
    ENABLE_FLOAT32_EXECUTION = 0x20
    ENABLE_HI_FLOAT32_EXECUTION = 0x40
    KEEP_FP16 = 0x80
    RESERVED = 0xFFFFFFFF


class OpExecMode(enum.IntEnum):
    """opbase ``OpExecMode``: HF32 lets matmul-class kernels run in TF32-like precision."""

    DEFAULT = 0
    HF32 = 1
    RESERVED = 0xFFFFFFFF


_STR_TO_MODE: dict[str, OpImplMode] = {
    "default": OpImplMode.DEFAULT,
    "high_performance": OpImplMode.HIGH_PERFORMANCE,
    "high_precision": OpImplMode.HIGH_PRECISION,
    "super_performance": OpImplMode.SUPER_PERFORMANCE,
    "support_out_of_bound_index": OpImplMode.SUPPORT_OUT_OF_BOUND_INDEX,
    "enable_float32_execution": OpImplMode.ENABLE_FLOAT32_EXECUTION,
    "enable_hi_float32_execution": OpImplMode.ENABLE_HI_FLOAT32_EXECUTION,
    "keep_fp16": OpImplMode.KEEP_FP16,
}
_MODE_TO_STR: dict[OpImplMode, str] = {v: k for k, v in _STR_TO_MODE.items()}

#: The one multi-mode ``implMode`` string CANN's kernel-JSON parser recognises.
_KERNEL_JSON_MULTI = "high_performance,high_precision,enable_float_32_execution,enable_hi_float_32_execution"
_KERNEL_JSON_MULTI_MODES = (OpImplMode.HIGH_PERFORMANCE | OpImplMode.HIGH_PRECISION
                            | OpImplMode.ENABLE_FLOAT32_EXECUTION
                            | OpImplMode.ENABLE_HI_FLOAT32_EXECUTION)
#: Modes a kernel's file path can name (checked in this order, as CANN does).
_PATH_MODES = ("high_performance", "high_precision", "support_out_of_bound_index")


def impl_mode_names() -> tuple[str, ...]:
    """The mode names :func:`impl_mode_from_str` knows."""
    return tuple(_STR_TO_MODE)


def impl_mode_from_str(s: str) -> OpImplMode:
    """Parses a mode name; an unknown name gives RESERVED and a warning naming it."""
    mode = _STR_TO_MODE.get(s)
    if mode is None:
        warnings.warn(f"unknown impl mode string {s!r}; using RESERVED. Known: "
                      f"{', '.join(_STR_TO_MODE)}", stacklevel=2)
        return OpImplMode.RESERVED
    return mode


def impl_mode_to_str(mode: OpImplMode) -> str:
    """The name of a single mode; RESERVED (or any combination) gives ``"unknown"``."""
    return _MODE_TO_STR.get(OpImplMode(int(mode)), "unknown")


def to_index(mode: OpImplMode) -> int:
    """Position of the lowest set bit (``ffs(mode) - 1``): DEFAULT → 0 … KEEP_FP16 → 7."""
    m = int(mode)
    if m <= 0:
        raise ValueError(f"to_index: impl mode must have a bit set, got {m:#x}")
    return (m & -m).bit_length() - 1


def to_index_char(mode: OpImplMode) -> str:
    """:func:`to_index` as one character ``'0'``…``'7'``, the compile-cache key."""
    return str(to_index(mode))


def parse_kernel_impl_modes(desc: Mapping | None, path: str | None = None) -> OpImplMode:
    """The modes a kernel supports, read from its JSON description as CANN reads them.

    A mode named in the kernel's file ``path`` wins; otherwise the ``implMode`` field decides.
    A missing field or an unknown name falls back to HIGH_PRECISION with a warning.

    >>> parse_kernel_impl_modes({}, "/kernels/high_performance/nonzero.json")
    <OpImplMode.HIGH_PERFORMANCE: 2>
    >>> parse_kernel_impl_modes({"implMode": "keep_fp16"})
    <OpImplMode.KEEP_FP16: 128>
    """
    if path:
        for name in _PATH_MODES:
            if name in path:
                return _STR_TO_MODE[name]
    field = (desc or {}).get("implMode")
    if field is None:
        warnings.warn("kernel description has no implMode field; assuming high_precision",
                      stacklevel=2)
        return OpImplMode.HIGH_PRECISION
    if field == _KERNEL_JSON_MULTI:
        return _KERNEL_JSON_MULTI_MODES
    mode = _STR_TO_MODE.get(field)
    if mode is None:
        warnings.warn(f"kernel description has unknown implMode {field!r}; assuming "
                      "high_precision", stacklevel=2)
        return OpImplMode.HIGH_PRECISION
    return mode


def select_impl_mode(requested: OpImplMode, supported: OpImplMode) -> OpImplMode:
    """The mode a call runs in: the request when it is not DEFAULT and is supported, else
    HIGH_PRECISION when supported, else HIGH_PERFORMANCE."""
    requested, supported = OpImplMode(int(requested)), OpImplMode(int(supported))
    if (requested != OpImplMode.DEFAULT and requested != OpImplMode.RESERVED
            and requested & supported == requested):
        return requested
    if supported & OpImplMode.HIGH_PRECISION:
        return OpImplMode.HIGH_PRECISION
    return OpImplMode.HIGH_PERFORMANCE


def as_impl_mode(mode: OpImplMode | str | int | None, where: str = "impl_mode") -> OpImplMode:
    """Accepts a mode, its name or its integer value (``None`` → the current mode).

    A name :func:`impl_mode_names` does not know raises (``where`` names the caller in the
    message); CANN's own lenient parser, which warns and goes on with RESERVED, is
    :func:`impl_mode_from_str`.

    >>> as_impl_mode("high_performance")
    <OpImplMode.HIGH_PERFORMANCE: 2>
    >>> as_impl_mode("high_perfomance")
    Traceback (most recent call last):
    ...
    jaxops.core.errors.OpArgumentError: impl_mode: argument 'mode': expected one of default, ...
    """
    if mode is None:
        return current_impl_mode()
    if isinstance(mode, str):
        if mode not in _STR_TO_MODE:
            close = difflib.get_close_matches(mode, list(_STR_TO_MODE), n=1)
            raise OpArgumentError(where, "mode", "one of " + ", ".join(_STR_TO_MODE), repr(mode),
                                  f"Did you mean {close[0]!r}?" if close else "")
        return _STR_TO_MODE[mode]
    return OpImplMode(int(mode))


_local = threading.local()


def current_impl_mode() -> OpImplMode:
    """The mode of the innermost :func:`impl_mode` context on this thread (DEFAULT outside)."""
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else OpImplMode.DEFAULT


@contextlib.contextmanager
def impl_mode(mode: OpImplMode | str) -> Iterator[OpImplMode]:
    """Thread-local OP_OPTION: operator calls inside the block request ``mode`` (a name
    no mode has raises, naming the known ones).

    >>> with impl_mode("high_performance"):
    ...     current_impl_mode()
    <OpImplMode.HIGH_PERFORMANCE: 2>
    >>> current_impl_mode()
    <OpImplMode.DEFAULT: 1>
    """
    mode = as_impl_mode(mode, "impl_mode")  # a misspelt name raises here, not at the call
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    stack.append(mode)
    try:
        yield mode
    finally:
        stack.pop()
