"""The Ascend backend: aclnn kernels of the CANN runtime, through an XLA custom call or ctypes.

**Detection** (:func:`diagnose` reports every step; :func:`detect` is the cached verdict):

1. ``ASCEND_HOME_PATH`` (or ``ASCEND_TOOLKIT_HOME``) is set — ``source set_env.sh`` of the
   toolkit sets it.
2. ``libascendcl.so``, ``libnnopbase.so`` and ``libopapi.so`` load with ctypes from
   ``$ASCEND_HOME_PATH/lib64``, else from the library path, and export the runtime ABI.
3. ``aclInit`` succeeds (or was already done by someone else in this process) and
   ``aclrtGetDeviceCount`` reports at least one device.
4. Per operator: libopapi exports ``aclnn<Op>GetWorkspaceSize`` and ``aclnn<Op>``.

**Dispatch** (:meth:`jaxops.backends.aclnn.Runtime.dispatch`, the aclnn two-phase call as torch_npu and the
CANN samples make it): bind the calling thread to the device (``aclrtSetDevice``), create
a stream, copy the inputs to device memory and wrap them and the max-shape outputs in ND
``aclTensor``s (CANN DataType codes), call ``aclnn<Op>GetWorkspaceSize``, mark the
executor repeatable so it can be destroyed on every path, allocate the workspace, call
``aclnn<Op>``, synchronise the stream, then read each output's refreshed view shape
(``aclGetViewShape``: the runtime has decoded the kernel's OP_OUTSHAPE words, uint64 rank
flag included) and copy that many elements back: the valid data is the row-major prefix of
the max-shape buffer (the wire layout). Every resource is released in reverse order on
every path; a non-zero status raises :class:`~jaxops.errors.AclError` naming the call.

**From jit.** Where the native library is built and JAX runs on the CPU, an operator kernel
(:mod:`jaxops.backends.ascend_ops`) is one XLA custom call, ``jaxops_aclnn``
(:mod:`jaxops.backends.aclnn_call`; the C++ handler in ``jaxops/native/src/aclnn.cc`` runs
the same steps on the buffers XLA hands it, with no Python on the call path). Elsewhere —
the native library not built or not loaded, ``JAXOPS_NATIVE=0``, another default device —
it reaches the dispatch above through :func:`jax.pure_callback`
(:mod:`jaxops.backends.callback`), the data crossing Python. Both work under ``jit`` and
``vmap``; the route is chosen when a call is traced, and ``explain()`` names it. Inside a
jitted call a runtime error arrives as an XLA runtime error whose message carries the
AclError line; :func:`run` calls an operator eagerly (ctypes) and raises AclError itself.
On CPU, XLA's buffers are host memory, which the handler copies to and from the device; a
JAX platform that exposed the Ascend device to XLA would let the handler take device
buffers and XLA's stream instead, but none exists yet.

>>> import os
>>> d = diagnose()
>>> d.steps[0].name
'environment'
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable, Sequence
from ctypes import byref, c_uint32
from typing import Any

import numpy as np

from jaxops.backends import aclnn_call
from jaxops.backends.acl import ACL_ERROR_REPEAT_INITIALIZE, AclLibraries
from jaxops.backends.aclnn import DEVICE_VAR, Arg, In, Out, Runtime, Scalar
from jaxops.core.backend_table import BackendEntry, register_backend
from jaxops.core.dtypes import DataType
from jaxops.core.errors import AclError, BackendUnavailableError, LibraryLoadError

HOME_VARS = ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME")
__all__ = ["AclnnSpec", "Diagnosis", "In", "Out", "SPECS", "Scalar", "Step", "detect",
           "diagnose", "run", "runtime", "supports"]


@dataclasses.dataclass(frozen=True)
class Step:
    """One detection step: its name, whether it passed, and what was found."""

    name: str
    ok: bool | None  # None: not reached because an earlier step failed
    detail: str

    def __str__(self) -> str:
        mark = {True: "ok", False: "FAILED", None: "skipped"}[self.ok]
        return f"[{mark:7s}] {self.name}: {self.detail}"


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    """The detection steps in order; ``available`` when every one passed."""

    steps: tuple[Step, ...]

    @property
    def available(self) -> bool:
        return all(s.ok for s in self.steps)

    def summary(self) -> str:
        """One line: the first failed step, or what was found."""
        for s in self.steps:
            if not s.ok:
                return f"{s.name}: {s.detail}"
        return "; ".join(s.detail for s in self.steps[1:3])

    def __str__(self) -> str:
        return "\n".join(str(s) for s in self.steps)


def _home() -> tuple[str | None, str]:
    for var in HOME_VARS:
        value = os.environ.get(var)
        if value:
            return value, var
    return None, ""


# -- detection ----------------------------------------------------------------------------
_state_lock = threading.Lock()
_libraries: dict[tuple[str, ...], AclLibraries] = {}
_runtimes: dict[int, Runtime] = {}
_detections: dict[tuple, tuple[Diagnosis, Runtime | None]] = {}


def _probe() -> tuple[Diagnosis, Runtime | None]:
    home, var = _home()
    if home is None:
        return Diagnosis((Step("environment", False, f"neither {' nor '.join(HOME_VARS)} is "
                                                      "set (source the toolkit's set_env.sh)"),
                          Step("libraries", None, "not tried"),
                          Step("runtime", None, "not tried"))), None
    steps = [Step("environment", True, f"{var}={home}")]
    lib_dirs = [os.path.join(home, "lib64")]
    try:
        lib = _libraries.get(tuple(lib_dirs)) or _libraries.setdefault(
            tuple(lib_dirs), AclLibraries(lib_dirs))
    except LibraryLoadError as e:
        steps += [Step("libraries", False, str(e)), Step("runtime", None, "not tried")]
        return Diagnosis(tuple(steps)), None
    steps.append(Step("libraries", True, ", ".join(lib.paths.values())))
    runtime = _runtimes.get(id(lib))
    try:
        if runtime is None:
            code = lib.raw("aclInit")(None)
            if code not in (0, ACL_ERROR_REPEAT_INITIALIZE):
                raise lib.error("aclInit", code)
            runtime = Runtime(lib, owns_init=code == 0, device_count=0)
            _runtimes[id(lib)] = runtime
        count = c_uint32(0)
        lib.call("aclrtGetDeviceCount", byref(count))
    except AclError as e:
        steps.append(Step("runtime", False, str(e)))
        return Diagnosis(tuple(steps)), None
    runtime.device_count = count.value
    if count.value == 0:
        steps.append(Step("runtime", False, "aclrtGetDeviceCount reports 0 devices"))
        return Diagnosis(tuple(steps)), None
    steps.append(Step("runtime", True, f"{count.value} device(s), using {DEVICE_VAR}="
                                       f"{runtime.device}"))
    return Diagnosis(tuple(steps)), runtime


def detect(refresh: bool = False) -> Diagnosis:
    """Steps 1–3 (cached per toolkit path; ``refresh=True`` probes again)."""
    key = tuple(os.environ.get(v) for v in HOME_VARS)
    with _state_lock:
        if refresh or key not in _detections:
            _detections[key] = _probe()
        return _detections[key][0]


def runtime() -> Runtime:
    """The initialised runtime; raises BackendUnavailableError naming the failed step."""
    diagnosis = detect()
    key = tuple(os.environ.get(v) for v in HOME_VARS)
    found = _detections[key][1]
    if found is None:
        raise BackendUnavailableError(f"Ascend runtime unavailable: {diagnosis.summary()}")
    return found


# -- operators ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class AclnnSpec:
    """How one jaxops operator maps onto an aclnn kernel.

    ``build(*inputs, **attrs)`` returns the GetWorkspaceSize arguments (:class:`In`,
    :class:`Out`, :class:`Scalar`) from numpy inputs; ``finish(outs, *inputs, **attrs)``
    turns the exact :class:`Out` results into the operator's outputs (exact shapes, as if
    capacity were unlimited). ``dtypes`` are the first input's dtypes the kernel takes;
    ``refuses(**attrs)`` says why the kernel cannot serve these attrs (``None``: it can).
    ``traced_finish(outs, *inputs, **attrs)`` is ``finish`` in jnp for the XLA custom-call
    route (:mod:`jaxops.backends.aclnn_call`): ``outs`` are the :class:`Out` results as
    DynArrays at their max shapes; ``None`` keeps the operator on the callback route.
    """

    op: str
    aclnn: str
    dtypes: frozenset[DataType]
    build: Callable[..., Sequence[Arg]]
    finish: Callable[..., Sequence[np.ndarray]]
    refuses: Callable[..., str | None] = lambda **attrs: None
    traced_finish: Callable[..., Sequence[Any]] | None = None

    def symbols(self) -> tuple[str, str]:
        return f"aclnn{self.aclnn}GetWorkspaceSize", f"aclnn{self.aclnn}"


SPECS: dict[str, AclnnSpec] = {}


def problem(spec: AclnnSpec, inputs: Sequence[Any] | None,
            attrs: dict[str, Any] | None) -> str | None:
    """Why the aclnn kernel cannot take these inputs / attrs (``None`` when it can; what is
    not given is not checked)."""
    refused = spec.refuses(**attrs) if attrs is not None else None
    if refused:
        return refused
    dtype = getattr(inputs[0], "dtype", None) if inputs else None
    if dtype is None:
        return None
    try:
        code = DataType.from_dtype(dtype)
    except Exception:
        code = None
    if code not in spec.dtypes:
        return (f"aclnn{spec.aclnn} does not take dtype {np.dtype(dtype).name} (it takes "
                + ", ".join(sorted(d.name for d in spec.dtypes)) + ")")
    return None


def supports(op, inputs: Sequence[Any] | None = None,
             attrs: dict[str, Any] | None = None) -> tuple[bool, str]:
    """Step 4 for ``op``, plus its input dtype and attrs when they are given."""
    spec = SPECS.get(op.name)
    if spec is None:
        return False, f"jaxops maps no aclnn kernel onto {op.name}"
    try:
        lib = runtime().lib
    except BackendUnavailableError as e:
        return False, str(e)
    missing = [s for s in spec.symbols() if not lib.has(s)]
    if missing:
        return False, f"libopapi does not export {', '.join(missing)}"
    why = problem(spec, inputs, attrs)
    if why:
        return False, why
    return True, f"aclnn{spec.aclnn} {_route_text(spec)}"


def _route_text(spec: AclnnSpec) -> str:
    """How jitted calls reach the kernel (see "From jit" in the module docstring)."""
    ffi, why = aclnn_call.route(spec)
    return (f"through the XLA custom call {aclnn_call.TARGET}" if ffi
            else f"through jax.pure_callback ({why})")


def diagnose(refresh: bool = True) -> Diagnosis:
    """Every detection step, probed afresh, including step 4 for each mapped operator.

    ``print(diagnose())`` shows one line per step; a failed step says what is missing.
    """
    base = detect(refresh=refresh)
    steps = list(base.steps)
    for spec in SPECS.values():
        name = f"operator {spec.op}"
        if not base.available:
            steps.append(Step(name, None, "not tried"))
            continue
        lib = runtime().lib
        missing = [s for s in spec.symbols() if not lib.has(s)]
        steps.append(Step(name, not missing, f"missing {', '.join(missing)}" if missing
                          else " and ".join(spec.symbols()) + f", jit {_route_text(spec)}"))
    return Diagnosis(tuple(steps))


def run(op_name: str, *inputs, **attrs) -> tuple[np.ndarray, ...]:
    """Runs operator ``op_name`` eagerly on the Ascend runtime, numpy in, exact-shape numpy
    out (no jit, no capacity); runtime errors raise :class:`AclError` directly."""
    spec = SPECS.get(op_name)
    if spec is None:
        raise BackendUnavailableError(f"jaxops maps no aclnn kernel onto {op_name}")
    from jaxops.core.registry import get_op

    inputs, attrs = get_op(op_name).check([None if x is None else np.asarray(x) for x in inputs],
                                          attrs)
    why = problem(spec, inputs, attrs)
    if why:
        raise BackendUnavailableError(f"{op_name}: {why}")
    return dispatch(spec, inputs, attrs)


def dispatch(spec, inputs, attrs) -> tuple[np.ndarray, ...]:
    """One aclnn call of ``spec`` on inputs and attrs already checked (by :func:`run`, or
    by backend selection and the kernel's trace-time check for calls from JAX)."""
    outs = runtime().dispatch(spec.aclnn, spec.build(*inputs, **attrs))
    return tuple(spec.finish(outs, *inputs, **attrs))


def _status() -> tuple[bool, str]:
    detection = detect()
    return detection.available, detection.summary()


register_backend(BackendEntry(
    "ascend", _status, supports=supports, auto_priority=100,
    auto_reason="the Ascend runtime has its kernel",
    unavailable_hint=" Run jaxops.backends.ascend.diagnose() for every step."))
