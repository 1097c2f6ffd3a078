"""The table of golden specs: how to make a golden case for each operator.

A spec registers by operator name, next to its input generator, with :func:`golden_case`
(or :func:`register_golden`); a name no operator has raises, like a kernel registered for
an unknown operator: at registration when the operators are loaded, else when the spec is
first looked up (:func:`get_spec` loads its operators first). The spec modules
(``ops_specs``, ``hashtable_specs``) are imported when a spec is first asked for, the
hash-table ones only when a table operator's is. This module and ``ops_specs`` import no
JAX (:func:`find_spec`, :func:`draw_inputs`), so the command line refuses a bad shape or
option before JAX loads.

>>> get_spec("NonZero").op
'NonZero'
>>> [name for name, _ in list_cases()][:2]
['BatchedNMS', 'EfficientNMS']
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from collections.abc import Callable
from typing import Any

import numpy as np

import sys

from jaxops.core.errors import DuplicateOpError, OpArgumentError
from jaxops.core.memory import refuse_unless_fits

__all__ = ["GoldenSpec", "draw_inputs", "dtype_named", "find_spec", "get_spec", "golden_case",
           "input_shape_dtype", "list_cases", "register_golden"]


@dataclasses.dataclass(frozen=True)
class GoldenSpec:
    """How to make a golden case for one operator.

    ``make_inputs(rng, attrs, shape, dtype, generation)`` returns the inputs in OpDef
    order. ``shape`` and ``dtype`` are the spec's defaults unless the user chose others
    (``--shape`` / ``--dtype``); ``generation`` is the user's
    :class:`~jaxops.golden.generators.Generation` (``--density``, ``--special``).
    ``shape=None`` means the case's inputs are fixed (``make_inputs(rng, attrs)``) and
    none of these can be chosen; ``shape_doc`` says which input ``shape`` is.
    ``build`` (the hash-table operators) makes the whole case itself, with CANN's inputs
    and outputs by name (:mod:`jaxops.golden.hashtable_specs`):
    ``build(spec, seed, attrs, shape, dtype, input_path) -> (inputs, outputs, attrs)``;
    ``case_attrs`` are the attrs it takes beyond the OpDef's (CANN's ``bucket_size`` and
    ``embedding_dim``) and ``input_names`` its inputs (for ``--help`` and ``--input``).
    ``module`` registers the operator (imported before the spec is used).

    Examples:
      >>> spec = get_spec("MaskedSelect")
      >>> spec.shape, spec.dtype
      ((8, 8), 'float32')
    """

    op: str
    doc: str
    make_inputs: Callable[..., list]
    default_attrs: dict = dataclasses.field(default_factory=dict)
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    shape_doc: str = ""
    any_rank: bool = False  # whether --shape may have another number of dims than ``shape``
    takes: tuple[str, ...] = ()  # the generator options it takes: "density", "special"
    module: str = "jaxops.ops"
    build: Callable[..., tuple] | None = None
    case_attrs: tuple[str, ...] = ()
    input_names: tuple[str, ...] = ()


_SPECS: dict[str, GoldenSpec] = {}
#: The spec modules, imported on first use (the hash-table ones load the hash tables).
_SPEC_MODULES = ("jaxops.golden.ops_specs", "jaxops.golden.hashtable_specs")
#: CANN tensors have at most 8 dims (aclnn's MAX_SUPPORT_DIMS_NUMS, OP_OUTSHAPE's 8 words).
MAX_DIMS = 8


_importing: list[str] = []  # the spec modules being imported now


def _load_specs(op: str | None = None) -> None:
    """Imports the spec modules until ``op``'s spec is registered (``None``: all of them)."""
    for module in _SPEC_MODULES:
        if op is not None and op in _SPECS:
            return
        if module in _importing:  # registering from inside it: the rest loads later
            return
        _importing.append(module)
        try:
            importlib.import_module(module)
        finally:
            _importing.remove(module)


def _check_op(spec: GoldenSpec) -> None:
    """An unknown operator name raises :class:`~jaxops.errors.UnknownOpError`, with close
    matches (the operators loaded first)."""
    importlib.import_module(spec.module)
    from jaxops.core.registry import get_op
    get_op(spec.op)


def register_golden(spec: GoldenSpec) -> GoldenSpec:
    """Adds a golden spec (one per operator); an unknown operator name raises (now where
    the operators are loaded, else when the spec is first looked up).

    Args:
      spec: the spec; ``spec.op`` must be a registered operator.

    Returns:
      The spec.

    Examples:
      >>> register_golden(GoldenSpec("NoSuchOp", "", lambda *a: []))
      Traceback (most recent call last):
      ...
      jaxops.core.errors.UnknownOpError: unknown operator 'NoSuchOp'...
    """
    if "jaxops.core.registry" in sys.modules:
        _check_op(spec)
    _load_specs(spec.op)  # a spec of the library's own for the op is a duplicate too
    if spec.op in _SPECS:
        raise DuplicateOpError(f"golden spec for {spec.op!r} registered twice")
    _SPECS[spec.op] = spec
    return spec


def golden_case(op: str, doc: str, **fields: Any) -> Callable[[Callable[..., list]], GoldenSpec]:
    """Decorator: registers the decorated input generator as ``op``'s golden spec.

    Args:
      op: a registered operator name.
      doc: one line saying what the case holds.
      **fields: the other :class:`GoldenSpec` fields (``default_attrs``, ``shape``, ``build``,
        ``dtype``, ``shape_doc``, ``any_rank``, ``takes``).

    Returns:
      A decorator that returns the registered spec.

    Examples:
      >>> golden_case("NoSuchOp", "")(lambda *a: [])
      Traceback (most recent call last):
      ...
      jaxops.core.errors.UnknownOpError: unknown operator 'NoSuchOp'...
    """
    def register(make_inputs: Callable[..., list]) -> GoldenSpec:
        return register_golden(GoldenSpec(op, doc, make_inputs, **fields))
    return register


def list_cases() -> list[tuple[str, str]]:
    """``(op, description)`` for every operator with a golden spec, sorted by name.

    Examples:
      >>> ("NonZero" in dict(list_cases()), "NoSuchOp" in dict(list_cases()))
      (True, False)
    """
    _load_specs()
    for spec in _SPECS.values():
        importlib.import_module(spec.module)
    from jaxops.core.registry import list_ops
    registered = set(list_ops())
    return [(name, spec.doc) for name, spec in sorted(_SPECS.items()) if name in registered]


def find_spec(op: str) -> GoldenSpec | None:
    """``op``'s spec, or ``None``, without loading its operators (or JAX).

    Examples:
      >>> find_spec("NonZero").dtype, find_spec("NoSuchOp")
      ('int32', None)
    """
    _load_specs(op)
    return _SPECS.get(op)


def get_spec(op: str) -> GoldenSpec:
    """The golden spec of ``op``; an unknown operator or one without a spec raises.

    Examples:
      >>> get_spec("Unique").shape
      (64,)
    """
    _load_specs(op)
    spec = _SPECS.get(op)
    if spec is not None:
        _check_op(spec)
        return spec
    from jaxops.core.registry import get_op
    get_op(op)  # unknown name → UnknownOpError listing close matches
    raise OpArgumentError("golden", "OP", "an operator with a golden spec ("
                          + ", ".join(n for n, _ in list_cases()) + ")", repr(op))


def input_shape_dtype(spec: GoldenSpec, shape: Any, dtype: Any) -> tuple[Any, Any]:
    """The shape and dtype a case's inputs are made with: the user's choice, checked, or the
    spec's defaults.

    Args:
      spec: the operator's golden spec.
      shape: ``None`` or a sequence of non-negative ints (``shape_doc`` says of which input).
      dtype: ``None`` or a dtype name.

    Returns:
      ``(shape, dtype)``.

    Examples:
      >>> input_shape_dtype(get_spec("NonZero"), [3, 2], "bool")
      ((3, 2), dtype('bool'))
    """
    if spec.shape is None and (shape is not None or dtype is not None):
        raise OpArgumentError("golden", "shape" if shape is not None else "dtype",
                              f"no --shape/--dtype for {spec.op} ("
                              + (spec.shape_doc or "its case has fixed inputs") + ")",
                              repr(shape if shape is not None else dtype))
    if shape is None:
        shape = spec.shape
    elif not (isinstance(shape, (list, tuple)) and all(isinstance(d, (int, np.integer)) and d >= 0
                                                      for d in shape)):
        raise OpArgumentError("golden", "shape", "a sequence of non-negative ints", repr(shape))
    elif len(shape) > MAX_DIMS:
        raise OpArgumentError("golden", "shape", f"at most {MAX_DIMS} dims (CANN tensors have "
                              "0-8)", repr(tuple(shape)))
    elif not spec.any_rank and len(shape) != len(spec.shape):
        raise OpArgumentError("golden", "shape", f"{len(spec.shape)} dims for {spec.op} "
                              f"({spec.shape_doc})", repr(tuple(shape)))
    shape = None if shape is None else tuple(int(d) for d in shape)
    dtype = dtype_named(spec.dtype if dtype is None else dtype)
    if shape is not None:  # host memory: the case is drawn, held and written there
        refuse_unless_fits("golden", "shape", _case_bytes(shape, dtype),
                           f"a case of {math.prod(shape)} {dtype.name} elements", devices=())
    return shape, dtype


def draw_inputs(spec: GoldenSpec, seed: int, shape=None, dtype=None, generation=None,
                attrs: dict | None = None) -> tuple[list, tuple | None]:
    """The inputs ``spec`` draws at ``seed`` (numpy only) and the ``(shape, dtype)`` they
    were drawn with (``None`` for fixed inputs).

    Examples:
      >>> [x.shape for x in draw_inputs(find_spec("Unique"), 0, (5,))[0]]
      [(5,)]
    """
    from jaxops.golden.generators import Generation

    generation = Generation() if generation is None else generation
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
        raise OpArgumentError("golden", "seed", "a non-negative int", repr(seed))
    in_shape, in_dtype = input_shape_dtype(spec, shape, dtype)
    for option in ("density", "special"):
        if getattr(generation, option) not in (None, ()) and option not in spec.takes:
            raise OpArgumentError(f"golden {spec.op}", option, f"no --{option} (its inputs "
                                  "take " + (", ".join("--" + t for t in spec.takes) or
                                             "neither") + ")", repr(getattr(generation, option)))
    rng = np.random.default_rng(seed)
    attrs = {**spec.default_attrs, **(attrs or {})}
    if spec.shape is None:
        return spec.make_inputs(rng, attrs), None
    return spec.make_inputs(rng, attrs, in_shape, in_dtype, generation), (in_shape, in_dtype)


def _case_bytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    """An upper bound of the host memory a case of ``shape`` takes at its peak: the inputs
    are drawn as float64 (two temporaries), held in ``dtype`` on the host and the device,
    and every output (at most ``max(rank, 4)`` int64 words an element: NonZero's indices,
    Unique's four outputs) is held as computed and in its wire layout."""
    words = max(len(shape), 4)
    return math.prod(shape) * (2 * 8 + 2 * dtype.itemsize + 2 * 8 * words)


def dtype_named(name: Any) -> np.dtype:
    """The dtype called ``name`` (``bfloat16`` too, which numpy alone does not know); an
    unknown name raises naming ``--dtype``.

    Examples:
      >>> dtype_named("bfloat16").itemsize, dtype_named("int8")
      (2, dtype('int8'))
    """
    if str(name) == "bfloat16":  # numpy alone does not know it
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    try:
        return np.dtype(name)
    except TypeError:
        raise OpArgumentError("golden", "dtype", "a dtype name such as float32, int8, bool or "
                              "bfloat16", repr(name)) from None
