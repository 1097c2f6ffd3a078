"""How an operator is traced, launched and refreshed, CANN-style.

- :mod:`tracing.args` — the OP_* launch arguments (opbase op_arg_def);
- :mod:`tracing.outshape` — the OP_OUTSHAPE wire format and RefreshOutputShape;
- :mod:`tracing.executor` — :func:`launch` and its compile cache;
- :mod:`tracing.host` — :func:`host_refresh`, exact shapes on the host from inside jit.
"""

from tracing import outshape
from tracing.args import (OP_ATTR, OP_EMPTY, OP_INPUT, OP_MEMSET, OP_MODE, OP_OPTION,
                          OP_OUTPUT, OP_OUTSHAPE, OP_WORKSPACE, OpArg, OpArgContext, OpArgKind)
from tracing.executor import CacheInfo, LaunchResult, cache_clear, cache_info, launch
from tracing.host import host_refresh

__all__ = [
    "OP_ATTR", "OP_EMPTY", "OP_INPUT", "OP_MEMSET", "OP_MODE", "OP_OPTION", "OP_OUTPUT",
    "OP_OUTSHAPE", "OP_WORKSPACE", "CacheInfo", "LaunchResult", "OpArg", "OpArgContext",
    "OpArgKind", "cache_clear", "cache_info", "host_refresh", "launch", "outshape",
]
