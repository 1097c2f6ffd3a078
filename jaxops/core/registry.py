"""One description per operator (CANN metadef ``OpDef`` / ``OpRegistrationData``).

An :class:`OpDef` says everything the rest of jaxops needs to know about an operator: its
inputs and outputs with their allowed dtypes, its attributes with defaults and validators,
how to infer the max shapes of its outputs, which precision modes it supports, whether its
output shape depends on the data, and which kernel runs it on each backend. The functional
API, ``tracing.launch``, every backend and the CLI read this one description.

>>> import jax.numpy as jnp
>>> from jaxops.core.dtypes import FLOATING
>>> square = OpDef(
...     name="DocSquare",
...     inputs=[Input("x", FLOATING)],
...     outputs=[Output("y", FLOATING)],
...     infer_shape=lambda ctx: [ctx.inputs[0].shape],
... )
>>> @square.kernel("xla")
... def _square(x):
...     return (x * x,)
>>> square(jnp.arange(3.0))[0].tolist()
[0.0, 1.0, 4.0]
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.core import loading
from jaxops.core.backend_table import select_backend
from jaxops.core.dtypes import DataType
from jaxops.core.errors import (DuplicateOpError, KernelNotFoundError, MissingInputError,
                                OpArgumentError, OpDTypeError, UnknownAttrError,
                                UnknownOpError, UnsupportedDTypeError)
from jaxops.core.impl_mode import (OpImplMode, as_impl_mode, impl_mode_names, impl_mode_to_str,
                                    select_impl_mode)
from jaxops.core.memory import SMALL_REQUEST, refuse_unless_fits
from jaxops.core.narrowing import check_fits
from jaxops.core.tensor_desc import TensorDesc

__all__ = [
    "AttrDef", "InferContext", "Input", "KernelFn", "OpDef", "Output", "ParamKind", "REQUIRED",
    "TensorParam", "check_pending", "get_op", "list_ops", "on_op", "register_op",
    "unregister_op",
]


class ParamKind(enum.Enum):
    """How many tensors an input/output slot takes (CANN's REQUIRED / OPTIONAL / DYNAMIC)."""

    REQUIRED = "required"
    OPTIONAL = "optional"
    DYNAMIC = "dynamic"  # a list of tensors


@dataclasses.dataclass(frozen=True)
class TensorParam:
    """An input or output slot: name, allowed dtypes (``None`` = any object), kind."""

    name: str
    dtypes: frozenset[DataType] | None
    kind: ParamKind = ParamKind.REQUIRED
    doc: str = ""

    def dtype_names(self) -> list[str]:
        return ["any"] if self.dtypes is None else sorted(d.name for d in self.dtypes)


def Input(name: str, dtypes, kind: str | ParamKind = "required", doc: str = "") -> TensorParam:
    """Declares an input slot."""
    return TensorParam(name, None if dtypes is None else frozenset(dtypes), ParamKind(kind), doc)


Output = Input  # outputs are declared the same way


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED = _Required()

_ATTR_TYPES: dict[str, Callable[[Any], bool]] = {
    "int": lambda v: isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_)),
    "float": lambda v: isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_)),
    "bool": lambda v: isinstance(v, (bool, np.bool_)),
    "str": lambda v: isinstance(v, str),
    "list_int": lambda v: isinstance(v, (list, tuple)) and all(_ATTR_TYPES["int"](e) for e in v),
    "list_float": lambda v: isinstance(v, (list, tuple)) and all(_ATTR_TYPES["float"](e) for e in v),
    "any": lambda v: True,
}
_ATTR_CAST: dict[str, Callable[[Any], Any]] = {
    "int": int, "float": float, "bool": bool, "str": str,
    "list_int": lambda v: tuple(int(e) for e in v),
    "list_float": lambda v: tuple(float(e) for e in v),
    "any": lambda v: v,
}


@dataclasses.dataclass(frozen=True)
class AttrDef:
    """An attribute: name, type (``int float bool str list_int list_float any``), default.

    ``optional=True`` also accepts ``None``. ``choices`` restricts the value to a set;
    ``check`` is a predicate on the cast value and ``expected`` says in words what it accepts.

    ``traced=True`` (a float attr only) also accepts a JAX scalar, traced or not: it is then
    a runtime operand of the kernel, not a compile-time constant, so a jitted caller
    compiles once for every value (ONNX passes its NMS thresholds as tensors). A traced
    value cannot be checked before it runs; Python and numpy values are checked and stay
    compile-time constants. Any other attr given a traced value raises, saying it must be
    static.

    >>> import jax, jax.numpy as jnp
    >>> t = AttrDef("t", "float", 0.5, traced=True)
    >>> jax.jit(lambda x: t.validate("Doc", x) * 2)(jnp.float32(0.25)).item()
    0.5
    """

    name: str
    type: str
    default: Any = REQUIRED
    optional: bool = False
    choices: tuple | None = None
    check: Callable[[Any], bool] | None = None
    expected: str = ""
    doc: str = ""
    traced: bool = False

    def __post_init__(self):
        if self.type not in _ATTR_TYPES:
            raise ValueError(f"AttrDef {self.name!r}: unknown attr type {self.type!r}")
        if self.traced and self.type != "float":
            raise ValueError(f"AttrDef {self.name!r}: only float attrs can be traced")

    def describe(self) -> str:
        """What the attribute accepts, in words (used in error messages and the CLI)."""
        if self.expected:
            return self.expected
        if self.choices is not None:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        if self.type == "bool":
            return "true or false" + (" or None" if self.optional else "")
        return f"{self.type}{' or None' if self.optional else ''}"

    def _runtime_scalar(self, op: str, value: jax.Array) -> jax.Array:
        """A JAX scalar for a ``traced`` attr: checked for shape and dtype only."""
        if value.shape != () or not jnp.issubdtype(value.dtype, jnp.floating):
            raise OpArgumentError(op, self.name, f"{self.describe()}: a Python float or a "
                                  "float JAX scalar", f"a {value.dtype} array of shape "
                                  f"{tuple(value.shape)}")
        if not isinstance(value, jax.core.Tracer):  # concrete: its value can be checked
            self.validate(op, float(value))
        return value

    def parse_text(self, op: str, text: str) -> Any:
        """Parses a command-line value into the attribute's type, then validates it.

        Args:
          op: the operator's name (for the error message).
          text: the value as typed (``none`` for an optional attr; lists comma-separated;
            bools as true/false or 1/0).

        Returns:
          The value, cast and validated as :meth:`validate` does.

        Examples:
          >>> AttrDef("sizes", "list_int", default=()).parse_text("Doc", "2,3")
          (2, 3)
          >>> AttrDef("on", "bool", default=False).parse_text("Doc", "True")
          True
        """
        try:
            value = _parse_text(self, text)
        except ValueError:
            raise OpArgumentError(op, self.name, self.describe(), repr(text)) from None
        return self.validate(op, value)

    def validate(self, op: str, value: Any) -> Any:
        """Returns the value cast to the attribute's type, or raises naming op and attr.
        A JAX scalar given to a ``traced`` attr is returned as it is (see the class)."""
        if value is None and self.optional:
            return None
        if isinstance(value, jax.Array):
            if self.traced:
                return self._runtime_scalar(op, value)
            if isinstance(value, jax.core.Tracer):
                raise OpArgumentError(
                    op, self.name, f"a static value ({self.describe()}): it fixes the "
                    "compiled program", f"a traced {type(value).__name__}",
                    "Pass a Python value, or make the caller's argument static, e.g. "
                    f"jax.jit(f, static_argnames=[{self.name!r}]).")
            if value.ndim == 0:
                value = value.item()
        if isinstance(value, np.ndarray) and value.ndim == 0:
            value = value.item()
        if not _ATTR_TYPES[self.type](value):
            raise OpArgumentError(op, self.name, self.describe(), f"{value!r} ({type(value).__name__})")
        value = _ATTR_CAST[self.type](value)
        if self.choices is not None and value not in self.choices:
            raise OpArgumentError(op, self.name, self.describe(), repr(value))
        if self.check is not None and not self.check(value):
            raise OpArgumentError(op, self.name, self.describe(), repr(value))
        return value


#: Bool attrs as text: true/false (any case) or 1/0; "yes", "on" and the like are refused,
#: so a typo is an error rather than a guess.
_TRUE, _FALSE = ("1", "true"), ("0", "false")


def _parse_text(attr: AttrDef, text: str) -> Any:
    """The typed value of ``text`` for ``attr`` (ValueError when it does not parse)."""
    if text.lower() == "none" and attr.optional:
        return None
    if attr.type == "int":
        return int(text)
    if attr.type == "float":
        return float(text)
    if attr.type == "bool":
        if text.lower() not in _TRUE + _FALSE:
            raise ValueError(text)
        return text.lower() in _TRUE
    if attr.type in ("list_int", "list_float"):
        cast = int if attr.type == "list_int" else float
        return [cast(t) for t in text.split(",") if t]
    return text


@dataclasses.dataclass
class InferContext:
    """What shape/dtype inference sees: input descs, attrs, values of value-dependent inputs."""

    op: "OpDef"
    inputs: list  # TensorDesc | None | list[TensorDesc] (dynamic) | object (untyped input)
    attrs: dict[str, Any]
    values: dict[str, np.ndarray]

    def input(self, name: str):
        return self.inputs[self.op.input_index(name)]


KernelFn = Callable[..., Any]


@dataclasses.dataclass(eq=False)
class OpDef:
    """The description of one operator. See the module docstring for an example."""

    name: str
    inputs: Sequence[TensorParam]
    outputs: Sequence[TensorParam]
    attrs: Sequence[AttrDef] = ()
    infer_shape: Callable[[InferContext], list[tuple[int, ...]]] | None = None
    infer_dtype: Callable[[InferContext], list[DataType]] | None = None
    value_depend: Sequence[str] = ()
    impl_modes: OpImplMode = OpImplMode.HIGH_PRECISION
    data_dependent: bool = False
    fill_values: Sequence[Any] | None = None  # padding value of each data-dependent output
    doc: str = ""
    jit_kernels: bool = True  # eager calls run the kernel jitted (attrs static)
    kernels: dict[tuple[str, OpImplMode | None], KernelFn] = dataclasses.field(default_factory=dict)
    _jitted: dict[tuple, KernelFn] = dataclasses.field(default_factory=dict, repr=False)
    _small_requests: set = dataclasses.field(default_factory=set, repr=False, compare=False)

    def __post_init__(self):
        self.inputs, self.outputs, self.attrs = tuple(self.inputs), tuple(self.outputs), tuple(self.attrs)
        self.value_depend = tuple(self.value_depend)
        self.impl_modes = OpImplMode(int(self.impl_modes))
        names = [p.name for p in self.inputs] + [a.name for a in self.attrs]
        if len(set(names)) != len(names):
            raise ValueError(f"OpDef {self.name}: input and attr names must be unique: {names}")
        unknown = set(self.value_depend) - {p.name for p in self.inputs}
        if unknown:
            raise ValueError(f"OpDef {self.name}: value_depend names unknown inputs {sorted(unknown)}")

    # -- kernels --------------------------------------------------------------------------
    def kernel(self, backend: str = "xla", modes: OpImplMode | None = None):
        """Decorator registering ``fn`` as this op's kernel on ``backend``.

        ``modes=None`` serves every impl mode; otherwise the kernel serves the listed modes
        and takes priority over the catch-all kernel for them.
        """
        def register(fn: KernelFn) -> KernelFn:
            keys = [None] if modes is None else [m for m in OpImplMode if m != OpImplMode.RESERVED
                                                 and m & OpImplMode(int(modes))]
            for m in keys:
                if (backend, m) in self.kernels:
                    raise DuplicateOpError(f"{self.name}: kernel for backend {backend!r}, "
                                           f"mode {m} registered twice")
                self.kernels[(backend, m)] = fn
            return fn
        return register

    def backends(self) -> list[str]:
        """Backends with at least one kernel for this op, in registration order."""
        return list(dict.fromkeys(b for b, _ in self.kernels))

    def has_kernel(self, backend: str) -> bool:
        return any(b == backend for b, _ in self.kernels)

    def get_kernel(self, backend: str, mode: OpImplMode) -> KernelFn:
        fn = self.kernels.get((backend, OpImplMode(int(mode)))) or self.kernels.get((backend, None))
        if fn is None:
            raise KernelNotFoundError(f"{self.name}: no kernel for backend {backend!r} in mode "
                                      f"{impl_mode_to_str(mode)}; backends: {self.backends()}")
        bind = getattr(fn, "bind_mode", None)  # one kernel for every mode that needs to know it
        return bind(OpImplMode(int(mode))) if bind is not None else fn

    def select_mode(self, requested: OpImplMode | str | int | None = None) -> OpImplMode:
        """The impl mode a call runs in (see :func:`select_impl_mode`).

        A misspelt mode name raises here (naming the known ones), as it does in
        :func:`~jaxops.core.impl_mode.impl_mode` and ``OP_OPTION``; CANN's parser, which
        warns and goes on with RESERVED, stays in :func:`impl_mode_from_str`.
        """
        known = impl_mode_names()
        if isinstance(requested, str) and requested not in known:
            raise OpArgumentError(self.name, "impl_mode", f"one of {', '.join(known)}",
                                  repr(requested))
        return select_impl_mode(as_impl_mode(requested), self.impl_modes)

    # -- validation and inference -----------------------------------------------------------
    def input_index(self, name: str) -> int:
        for i, p in enumerate(self.inputs):
            if p.name == name:
                return i
        raise KeyError(f"{self.name} has no input {name!r}")

    def check(self, inputs: Sequence[Any], attrs: Mapping[str, Any] | None = None
              ) -> tuple[list, dict[str, Any]]:
        """Validates inputs and attrs before anything is traced.

        Returns the inputs (missing optional ones as ``None``) and the attrs with defaults
        filled in and values cast. Raises :class:`~jaxops.errors.MissingInputError`,
        :class:`~jaxops.errors.OpDTypeError`, :class:`~jaxops.errors.UnknownAttrError` or
        :class:`~jaxops.errors.OpArgumentError`, each naming op, argument, expected and given.
        """
        inputs = list(inputs)
        if len(inputs) > len(self.inputs):
            raise OpArgumentError(self.name, None, f"at most {len(self.inputs)} inputs "
                                  f"({', '.join(p.name for p in self.inputs)})", f"{len(inputs)} inputs")
        inputs += [None] * (len(self.inputs) - len(inputs))
        for param, value in zip(self.inputs, inputs):
            self._check_input(param, value)
        return inputs, self.check_attrs(attrs or {})

    def attr(self, name: str) -> AttrDef:
        """The attribute called ``name``; an unknown name raises with close matches.

        Examples:
          >>> from jaxops.core.registry import get_op
          >>> get_op("NonZero").attr("transpose").type
          'bool'
        """
        for a in self.attrs:
            if a.name == name:
                return a
        known = [a.name for a in self.attrs]
        close = difflib.get_close_matches(name, known, n=3)
        hint = f"Did you mean {', '.join(close)}?" if close else ""
        raise UnknownAttrError(self.name, name, "one of its attrs: " + (", ".join(known) or "(none)"),
                               "an unknown attr", hint)

    def check_attrs(self, attrs: Mapping[str, Any]) -> dict[str, Any]:
        for name in attrs:
            self.attr(name)  # an unknown name raises, with its "did you mean"
        out = {}
        for a in self.attrs:
            if a.name in attrs:
                out[a.name] = a.validate(self.name, attrs[a.name])
            elif a.default is REQUIRED:
                raise MissingInputError(self.name, a.name, f"a value ({a.describe()})", "nothing")
            else:
                out[a.name] = a.default
        return out

    def _check_input(self, param: TensorParam, value: Any) -> None:
        if value is None:
            if param.kind is ParamKind.REQUIRED:
                raise MissingInputError(self.name, param.name, "a tensor", "nothing")
            return
        if param.dtypes is None:
            return
        values = value if param.kind is ParamKind.DYNAMIC else [value]
        if param.kind is ParamKind.DYNAMIC and not isinstance(value, (list, tuple)):
            raise OpArgumentError(self.name, param.name, "a list of tensors", type(value).__name__)
        for v in values:
            dtype = getattr(v, "dtype", None)
            if dtype is None:
                raise OpArgumentError(self.name, param.name, "an array", type(v).__name__)
            try:
                code = DataType.from_dtype(dtype)
            except UnsupportedDTypeError:
                code = None
            if code not in param.dtypes:
                raise OpDTypeError(self.name, param.name, "dtype in {" + ", ".join(
                    param.dtype_names()) + "}", str(dtype))
            check_fits(self.name, param.name, v)  # x64 off must not change a value

    def _describe_input(self, param: TensorParam, value: Any):
        if value is None:
            return None
        if param.dtypes is None:
            return value
        if param.kind is ParamKind.DYNAMIC:
            return [TensorDesc.from_array(v, name=param.name) for v in value]
        return TensorDesc.from_array(value, name=param.name)

    def infer(self, inputs: Sequence[Any], attrs: Mapping[str, Any] | None = None
              ) -> list[TensorDesc]:
        """Max-shape inference: the output TensorDescs before anything runs."""
        inputs, attrs = self.check(inputs, attrs)
        return self._infer_checked(inputs, attrs)

    def _infer_checked(self, inputs: Sequence[Any], attrs: Mapping[str, Any]
                       ) -> list[TensorDesc]:
        if self.infer_shape is None:
            raise NotImplementedError(f"{self.name} declares no infer_shape")
        values = {}
        for name in self.value_depend:
            v = inputs[self.input_index(name)]
            if v is not None:
                values[name] = np.asarray(v)  # value-dependent inputs must be concrete
        ctx = InferContext(self, [self._describe_input(p, v) for p, v in zip(self.inputs, inputs)],
                           attrs, values)
        shapes = self.infer_shape(ctx)
        dtypes = self.infer_dtype(ctx) if self.infer_dtype else [ctx.inputs[0].dtype] * len(shapes)
        names = [p.name for p in self.outputs]
        if len(shapes) != len(dtypes):
            raise RuntimeError(f"{self.name}: infer_shape gave {len(shapes)} shapes but "
                               f"infer_dtype {len(dtypes)} dtypes")
        return [TensorDesc(s, d, name=names[min(i, len(names) - 1)])
                for i, (s, d) in enumerate(zip(shapes, dtypes))]

    # -- calling --------------------------------------------------------------------------
    def __call__(self, *inputs, backend: str | None = None,
                 impl_mode: OpImplMode | str | None = None, **attrs):
        """Validates, picks impl mode and backend, and runs the kernel (jittable)."""
        inputs, attrs = self.check(inputs, attrs)
        if self.data_dependent:
            self._refuse_outputs_beyond_memory(inputs, attrs)
        mode = self.select_mode(impl_mode)
        chosen = select_backend(self, backend, inputs=inputs, attrs=attrs)  # per-config choice
        return self._runner(self.get_kernel(chosen, mode), attrs)(*inputs, **attrs)

    def _refuse_outputs_beyond_memory(self, inputs: Sequence[Any], attrs: Mapping[str, Any]
                                      ) -> None:
        """A data-dependent operator's max shape comes from its caller (``size=``): one
        that cannot fit is refused here, naming the bytes, instead of failing in XLA."""
        if self.infer_shape is None or self.value_depend:
            return
        try:  # a signature once found small is not inferred again (eager calls repeat it)
            signature = (tuple((np.shape(v), str(getattr(v, "dtype", ""))) for v in inputs),
                         tuple(attrs.items()))
            if signature in self._small_requests:
                return
        except TypeError:  # an unhashable attr
            signature = None
        outputs = [o for o in self._infer_checked(inputs, attrs) if o.is_static]
        need = sum(o.nbytes for o in outputs)
        if need < SMALL_REQUEST:
            if signature is not None and len(self._small_requests) < 1024:
                self._small_requests.add(signature)
            return
        held = ", ".join(f"{list(o.shape)} {o.dtype.to_numpy().name}" for o in outputs)
        size = "size" if any(a.name == "size" for a in self.attrs) else None
        refuse_unless_fits(self.name, size, need, f"the max-shape outputs {held}")

    def _runner(self, kernel: KernelFn, attrs: Mapping[str, Any]) -> KernelFn:
        """The kernel jitted with its attrs static, so an eager call is one compiled
        executable rather than op-by-op dispatch (inside an outer jit it simply inlines).
        A JAX scalar given to a ``traced`` attr is an operand instead (one compile for
        every value)."""
        if not self.jit_kernels or self.value_depend:
            return kernel
        static = tuple(a.name for a in self.attrs if not isinstance(attrs.get(a.name), jax.Array))
        try:
            hash(tuple(attrs[name] for name in static))
        except TypeError:  # an unhashable attr value cannot be static
            return kernel
        jitted = self._jitted.get((id(kernel), static))
        if jitted is None:
            jitted = self._jitted[(id(kernel), static)] = jax.jit(kernel, static_argnames=static)
        return jitted

    def fill_value(self, k: int) -> Any:
        """The padding value of data-dependent output ``k`` (``None`` when none is declared).

        Examples:
          >>> from jaxops.core.registry import get_op
          >>> get_op("Unique").fill_value(1), get_op("Unique").fill_value(3)
          (-1, 0)
        """
        if not self.fill_values:
            return None
        return self.fill_values[min(k, len(self.fill_values) - 1)]

    def summary(self) -> dict[str, Any]:
        """A JSON-friendly description (used by ``jaxops ops --json``)."""
        def attr_default(a: AttrDef):
            return None if a.default is REQUIRED else a.default

        def port(p: TensorParam) -> dict[str, Any]:
            return {"name": p.name, "kind": p.kind.value, "dtypes": p.dtype_names(), "doc": p.doc}

        def fill(k: int) -> dict[str, Any]:
            return {} if not self.fill_values else {"fill_value": self.fill_value(k)}
        return {
            "name": self.name,
            "doc": self.doc,
            "inputs": [port(p) for p in self.inputs],
            "outputs": [{**port(p), **fill(k)} for k, p in enumerate(self.outputs)],
            "attrs": [{"name": a.name, "type": a.type, "default": attr_default(a),
                       "required": a.default is REQUIRED, "accepts": a.describe()}
                      for a in self.attrs],
            "impl_modes": [impl_mode_to_str(m) for m in OpImplMode
                           if m != OpImplMode.RESERVED and m & self.impl_modes],
            "value_depend": list(self.value_depend),
            "data_dependent": self.data_dependent,
            "backends": self.backends(),
        }


_REGISTRY: dict[str, OpDef] = {}
# Registrations made by name before their operator exists (backends sit below the
# operators and never import them): op name -> [(what, attach)]. register_op attaches them;
# check_pending, at the end of ``import jaxops``, raises for names no operator claimed.
_PENDING: dict[str, list[tuple[str, Callable[[OpDef], Any]]]] = {}
_sealed = False


def register_op(op: OpDef) -> OpDef:
    """Adds ``op`` to the registry and returns it; a name registered twice raises."""
    if op.name in _REGISTRY:
        raise DuplicateOpError(f"operator {op.name!r} is already registered")
    _REGISTRY[op.name] = op
    for _, attach in _PENDING.pop(op.name, []):
        attach(op)
    return op


def unregister_op(name: str) -> None:
    """Removes an operator (for tests that register throwaway ops)."""
    _REGISTRY.pop(name, None)


def _unknown(name: str, prefix: str = "unknown operator") -> UnknownOpError:
    close = difflib.get_close_matches(name, _REGISTRY, n=3, cutoff=0.5)
    close += [n for n in _REGISTRY if n.lower() == name.lower() and n not in close]
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    return UnknownOpError(f"{prefix} {name!r}.{hint} Registered: "
                          f"{', '.join(sorted(_REGISTRY)) or '(none)'}")


def get_op(name: str) -> OpDef:
    """The registered OpDef called ``name``; an unknown name lists close matches. A name
    not registered yet loads the whole library first (:mod:`jaxops.core.loading`)."""
    if name not in _REGISTRY:
        loading.load_all()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise _unknown(name) from None


def list_ops() -> list[str]:
    """Names of every registered operator, sorted (the whole library loaded first)."""
    loading.load_all()
    return sorted(_REGISTRY)


def on_op(name: str, attach: Callable[[OpDef], Any], what: str) -> None:
    """Runs ``attach(op)`` for the operator called ``name``: now if it is registered, else
    when :func:`register_op` registers it. What a backend's kernel decorator calls.

    While ``import jaxops`` runs, a name no operator claims raises in :func:`check_pending`
    at its end; afterwards an unknown name raises here. ``what`` names the registration in
    the error (``"host kernel"``).

    >>> on_op("NonZro", lambda op: None, "doc kernel")
    Traceback (most recent call last):
    ...
    jaxops.core.errors.UnknownOpError: doc kernel registered for unknown operator 'NonZro'. Did you mean: NonZero? ...
    """
    if name in _REGISTRY:
        attach(_REGISTRY[name])
    elif _sealed:
        raise _unknown(name, f"{what} registered for unknown operator")
    else:
        _PENDING.setdefault(name, []).append((what, attach))


def check_pending() -> None:
    """Raises :class:`~jaxops.errors.UnknownOpError` for registrations made by
    :func:`on_op` for a name no operator claimed (a misspelt name), with the close matches;
    from then on :func:`on_op` checks names at once. ``import jaxops`` calls it last."""
    global _sealed
    _sealed = True
    if _PENDING:
        name, items = next(iter(_PENDING.items()))
        _PENDING.clear()  # reported: a later check starts clean
        raise _unknown(name, f"{items[0][0]} registered for unknown operator")
