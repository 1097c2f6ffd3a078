"""The argument kinds of a CANN-style launch (opbase ``op_arg_def``).

A launch is ``tracing.launch("NonZero", OP_INPUT(x), OP_OUTPUT(y), OP_OUTSHAPE((t, 0)))``:
each ``OP_*`` constructor tags its values with an :class:`OpArgKind`, and
:class:`OpArgContext` collects them.

>>> import numpy as np
>>> t = np.zeros(9, np.int64)
>>> ctx = OpArgContext(OP_INPUT(np.ones(3)), OP_ATTR(transpose=True), OP_OUTSHAPE(t, 0))
>>> len(ctx.inputs), ctx.attrs, len(ctx.outshape)
(1, {'transpose': True}, 1)
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from jaxops.core.errors import OutshapeError
from jaxops.core.impl_mode import OpExecMode, OpImplMode, as_impl_mode


class OpArgKind(enum.IntEnum):
    """opbase's arg kinds, with CANN's numbering."""

    INPUT = 0
    OUTPUT = 1
    ATTR = 2
    WORKSPACE = 3
    OUTSHAPE = 4
    OPTION = 5
    EXEC_MODE = 6
    MEMSET = 7
    EMPTY = 8


@dataclasses.dataclass(frozen=True)
class OpArg:
    """One tagged group of launch arguments."""

    kind: OpArgKind
    value: Any


def OP_INPUT(*arrays) -> OpArg:
    """The operator's inputs, in declaration order (``None`` for an absent optional one)."""
    return OpArg(OpArgKind.INPUT, tuple(arrays))


def OP_OUTPUT(*arrays) -> OpArg:
    """Output buffers at max shape; their shape and dtype are checked against inference."""
    return OpArg(OpArgKind.OUTPUT, tuple(arrays))


def OP_ATTR(**attrs) -> OpArg:
    """Attribute values by name."""
    return OpArg(OpArgKind.ATTR, dict(attrs))


def OP_WORKSPACE(*arrays) -> OpArg:
    """Workspace buffers (accepted for CANN parity; XLA plans its own scratch memory)."""
    return OpArg(OpArgKind.WORKSPACE, tuple(arrays))


def OP_OUTSHAPE(pair, index: int | None = None) -> OpArg:
    """A ``(shape_tensor, output_index)`` pair, as a tuple or as two arguments."""
    if index is None:
        if not (isinstance(pair, tuple) and len(pair) == 2):
            raise OutshapeError("OP_OUTSHAPE: expected (shape_tensor, output_index) or two "
                                f"arguments, got {type(pair).__name__}")
        tensor, index = pair
    else:
        tensor = pair
    if not (hasattr(tensor, "shape") and hasattr(tensor, "dtype")):
        raise OutshapeError("OP_OUTSHAPE: expected a shape tensor (a 1-D numpy or JAX array of "
                            "9 words per output: int32, int64 or float32), got "
                            f"{type(tensor).__name__}; pass np.asarray(words, np.int64)")
    return OpArg(OpArgKind.OUTSHAPE, ((tensor, int(index)),))


def OP_OPTION(*impl_modes) -> OpArg:
    """The requested impl mode(s) (names or :class:`OpImplMode`), or-ed together; a
    misspelt name raises :class:`~jaxops.errors.OpArgumentError` naming the known ones."""
    mode = 0
    for m in impl_modes:
        mode |= int(as_impl_mode(m, "OP_OPTION"))
    return OpArg(OpArgKind.OPTION, OpImplMode(mode) if mode else OpImplMode.DEFAULT)


def OP_MODE(exec_mode: OpExecMode | int) -> OpArg:
    """The exec mode (``OpExecMode.HF32`` runs matmuls in TF32-class precision)."""
    return OpArg(OpArgKind.EXEC_MODE, OpExecMode(int(exec_mode)))


def OP_MEMSET(*arrays) -> OpArg:
    """Buffers the kernel expects zeroed before launch."""
    return OpArg(OpArgKind.MEMSET, tuple(arrays))


def OP_EMPTY() -> OpArg:
    """A placeholder argument (ignored)."""
    return OpArg(OpArgKind.EMPTY, None)


class OpArgContext:
    """Collects the ``OP_*`` arguments of one launch.

    Repeated OP_INPUT / OP_OUTPUT / OP_WORKSPACE / OP_MEMSET append; repeated OP_ATTR merge;
    repeated OP_OUTSHAPE append to one list whose pairs must share one shape tensor.
    """

    def __init__(self, *op_args: OpArg):
        self.inputs: list = []
        self.outputs: list = []
        self.attrs: dict[str, Any] = {}
        self.workspace: list = []
        self.memset: list = []
        self.outshape: list[tuple[Any, int]] = []
        self.impl_mode: OpImplMode | None = None
        self.exec_mode: OpExecMode = OpExecMode.DEFAULT
        for arg in op_args:
            self.add(arg)

    def add(self, arg: OpArg) -> None:
        if not isinstance(arg, OpArg):
            raise TypeError(f"launch arguments must be OP_* values, got {type(arg).__name__}; "
                            "wrap inputs in OP_INPUT(...), attrs in OP_ATTR(...)")
        kind = arg.kind
        if kind is OpArgKind.INPUT:
            self.inputs.extend(arg.value)
        elif kind is OpArgKind.OUTPUT:
            self.outputs.extend(arg.value)
        elif kind is OpArgKind.ATTR:
            self.attrs.update(arg.value)
        elif kind is OpArgKind.WORKSPACE:
            self.workspace.extend(arg.value)
        elif kind is OpArgKind.MEMSET:
            self.memset.extend(arg.value)
        elif kind is OpArgKind.OUTSHAPE:
            for tensor, index in arg.value:
                if self.outshape and tensor is not self.outshape[0][0]:
                    raise OutshapeError("OP_OUTSHAPE: every pair of a launch must share one "
                                        "shape tensor")
                self.outshape.append((tensor, index))
        elif kind is OpArgKind.OPTION:
            self.impl_mode = arg.value
        elif kind is OpArgKind.EXEC_MODE:
            self.exec_mode = arg.value
