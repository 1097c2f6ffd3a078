"""The aclnn dispatch as an XLA custom call: the ascend kernels without Python on the call path.

An ascend kernel (:mod:`jaxops.backends.ascend_ops`) traces, inside ``jit``, one
:func:`jax.ffi.ffi_call` to the C++ handler ``jaxops_aclnn`` of the native library
(``jaxops/native/src/aclnn.cc``). XLA hands it the input buffers and the max-shape output
buffers; the handler runs the aclnn two-phase dispatch through the CANN runtime libraries the
backend's detection loaded (the same files, resolved with ``dlsym``), reads each output's
refreshed view shape from the runtime (the OP_OUTSHAPE words decoded by the runtime) and
returns the wire-layout buffers plus one int32 slot ``[rank, d0, …, d7]`` per output. The
rest is traced JAX: :meth:`DynArray.from_wire`, the operator's ``traced_finish`` (the jnp
counterpart of its numpy ``finish``), and :func:`pack` into the ``xla`` kernel's outputs
(capacity cut, fill values, true shape). Under ``vmap`` the custom call runs once per
example (``vmap_method="sequential"``, a loop inside the compiled program).

**Where the callback route stays** (:func:`jax.pure_callback` into ctypes,
:mod:`jaxops.backends.callback`), said by :func:`route`:

- the native library is not built, does not load, or ``JAXOPS_NATIVE=0``;
- JAX's default device is not the CPU: the handler is registered for the CPU platform,
  where XLA's buffers are host memory it copies to and from the device (no JAX platform
  exposes an Ascend device to XLA, so there is no device-buffer handler to register);
- an aclnn signature with a floating-point scalar (the handler passes integer-class
  arguments only; no mapped kernel has one) or more than 14 arguments;
- an operator mapping without a ``traced_finish``.

Eager :func:`jaxops.backends.ascend.run` keeps the ctypes dispatch (numpy in and out).
The route, the library paths and the device are fixed when a call is traced: a compiled
function keeps them after ``ASCEND_HOME_PATH`` or ``JAXOPS_NATIVE`` change. The handler
serialises its own dispatches; it does not share the ctypes route's lock, so an eager
``run()`` on another thread at the same moment is not ordered against it.

>>> route(None)[0]
False
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.backends.aclnn import In, Out, Scalar
from jaxops.core.backend_table import backend_names, backend_status
from jaxops.core.dtypes import DataType
from jaxops.core.dynarray import DynArray

__all__ = ["TARGET", "dispatch", "forward", "pack", "route"]

#: the FFI target (registered by :mod:`jaxops.native` for the CPU platform)
TARGET = "jaxops_aclnn"
SLOT_WORDS = 9
_KINDS = {"bool": 2, "int64": 3}  # In: 0, Out: 1 (aclnn.cc)
_MAX_ARGS = 14  # the handler's 16, less the workspace-size and executor pointers


def route(spec, args: Sequence[Any] = ()) -> tuple[bool, str]:
    """Whether a call of ``spec`` with GetWorkspaceSize ``args`` goes through the custom
    call (``True``) or the callback route, and why."""
    if spec is None or getattr(spec, "traced_finish", None) is None:
        return False, "the operator mapping has no traced_finish"
    if "native" not in backend_names():
        return False, "jaxops.native is not imported"
    ok, why = backend_status("native")
    if not ok:
        return False, f"the native library does not serve it ({why})"
    floats = [a for a in args if isinstance(a, Scalar) and a.kind not in _KINDS]
    if floats:
        return False, f"aclnn{spec.aclnn} takes a {floats[0].kind} scalar (integer-class only)"
    if len(args) > _MAX_ARGS:
        return False, f"aclnn{spec.aclnn} takes {len(args)} arguments (at most {_MAX_ARGS})"
    return True, f"XLA custom call {TARGET}"


def dispatch(spec, args: Sequence[Any], runtime) -> list[DynArray]:
    """One custom call of ``aclnn<spec.aclnn>`` with ``args`` (:class:`In` holding traced
    arrays); returns each :class:`Out` as a DynArray at its max shape (fill value 0)."""
    outs = [a for a in args if isinstance(a, Out)]
    tensors = [a for a in args if isinstance(a, (In, Out))]
    kinds = [0 if isinstance(a, In) else 1 if isinstance(a, Out) else _KINDS[a.kind] for a in args]
    scalars = [int(a.value) for a in args if isinstance(a, Scalar)] or [0]  # no empty attr
    dtypes = [int(DataType.from_dtype(a.array.dtype if isinstance(a, In) else a.dtype))
              for a in tensors]
    results = [jax.ShapeDtypeStruct(o.shape, jax.dtypes.canonicalize_dtype(o.dtype)) for o in outs]
    results.append(jax.ShapeDtypeStruct((len(outs), SLOT_WORDS), jnp.int32))
    paths = runtime.lib.paths
    *buffers, slots = jax.ffi.ffi_call(TARGET, results, vmap_method="sequential")(
        *[a.array for a in args if isinstance(a, In)],
        ascendcl=paths["libascendcl.so"], nnopbase=paths["libnnopbase.so"],
        opapi=paths["libopapi.so"], aclnn=spec.aclnn, kinds=np.asarray(kinds, np.int64),
        dtypes=np.asarray(dtypes, np.int64), scalars=np.asarray(scalars, np.int64),
        device=np.int64(runtime.device))
    return [DynArray.from_wire(b, o.shape, slots[k, 1:1 + len(o.shape)])
            for k, (b, o) in enumerate(zip(buffers, outs))]


def pack(exact: Any, struct: Any) -> Any:
    """One output laid into the ``struct`` of the xla kernel's output: a DynArray cut to
    the struct's max shape (a leading block, the struct's fill value outside it, the true
    shape kept where the struct keeps one), or a static array in the struct's dtype. The
    traced counterpart of :func:`jaxops.backends.callback.pack`."""
    if not isinstance(struct, DynArray):
        return jnp.asarray(exact).astype(struct.dtype)
    max_shape = tuple(struct.data.shape)
    data = exact.data[tuple(slice(0, min(m, s)) for m, s in zip(exact.max_shape, max_shape))]
    data = jnp.pad(data, [(0, s - d) for d, s in zip(data.shape, max_shape)])
    kept = jnp.minimum(exact.actual_shape, jnp.asarray(max_shape, jnp.int32))
    cut = DynArray(data.astype(struct.data.dtype), kept, fill_value=struct.fill_value)
    return DynArray(cut.valid_data(), kept, fill_value=struct.fill_value,
                    true_shape=None if struct.true_shape is None else exact.actual_shape)


def forward(spec, runtime, structs, inputs, attrs) -> tuple | None:
    """The operator's outputs (the xla kernel's ``structs``) through the custom call, or
    ``None`` where :func:`route` keeps the call on the callback route."""
    args = spec.build(*inputs, **attrs)
    if not route(spec, args)[0]:
        return None
    runtime.hold_device()
    exact = spec.traced_finish(dispatch(spec, args, runtime), *inputs, **attrs)
    return tuple(pack(e, s) for e, s in zip(exact, structs))
