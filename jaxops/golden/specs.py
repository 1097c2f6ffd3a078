"""The table of golden specs: how to make a golden case for each operator.

A spec registers by operator name, next to its input generator, with :func:`golden_case`
(or :func:`register_golden`); a name no operator has raises at import, like a kernel
registered for an unknown operator.

>>> get_spec("NonZero").op
'NonZero'
>>> [name for name, _ in list_cases()][:2]
['BatchedNMS', 'EfficientNMS']
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from jaxops.core.errors import DuplicateOpError, OpArgumentError
from jaxops.core.memory import refuse_unless_fits
from jaxops.core.registry import get_op, list_ops

__all__ = ["GoldenSpec", "get_spec", "golden_case", "input_shape_dtype", "list_cases",
           "register_golden"]


@dataclasses.dataclass(frozen=True)
class GoldenSpec:
    """How to make a golden case for one operator.

    ``make_inputs(rng, attrs, shape, dtype)`` returns the inputs in OpDef order. ``shape``
    and ``dtype`` are the spec's defaults unless the user chose others (``--shape`` /
    ``--dtype``); ``shape=None`` means the case's inputs are fixed and neither can be
    chosen, and ``shape_doc`` says which input ``shape`` is. ``run(opdef, inputs, attrs)``
    (optional) replaces the default run of the OpDef and returns a dict of extra arrays plus
    the :class:`~jaxops.golden.cases.GoldenRun` (used by the hash-table operators for their
    CANN bucket bytes).

    Examples:
      >>> spec = get_spec("MaskedSelect")
      >>> spec.shape, spec.dtype
      ((8, 8), 'float32')
    """

    op: str
    doc: str
    make_inputs: Callable[..., list]
    default_attrs: dict = dataclasses.field(default_factory=dict)
    run: Callable[[Any, list, dict], tuple[dict, Any]] | None = None
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    shape_doc: str = ""
    any_rank: bool = False  # whether --shape may have another number of dims than ``shape``


_SPECS: dict[str, GoldenSpec] = {}


def register_golden(spec: GoldenSpec) -> GoldenSpec:
    """Adds a golden spec (one per operator); an unknown operator name raises.

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
    get_op(spec.op)  # an unknown name raises UnknownOpError, with close matches
    if spec.op in _SPECS:
        raise DuplicateOpError(f"golden spec for {spec.op!r} registered twice")
    _SPECS[spec.op] = spec
    return spec


def golden_case(op: str, doc: str, **fields: Any) -> Callable[[Callable[..., list]], GoldenSpec]:
    """Decorator: registers the decorated input generator as ``op``'s golden spec.

    Args:
      op: a registered operator name.
      doc: one line saying what the case holds.
      **fields: the other :class:`GoldenSpec` fields (``default_attrs``, ``run``, ``shape``,
        ``dtype``, ``shape_doc``, ``any_rank``).

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
    registered = set(list_ops())
    return [(name, spec.doc) for name, spec in sorted(_SPECS.items()) if name in registered]


def get_spec(op: str) -> GoldenSpec:
    """The golden spec of ``op``; an unknown operator or one without a spec raises.

    Examples:
      >>> get_spec("Unique").shape
      (64,)
    """
    spec = _SPECS.get(op)
    if spec is None:
        get_op(op)  # unknown name → UnknownOpError listing close matches
        raise OpArgumentError("golden", "OP", "an operator with a golden spec ("
                              + ", ".join(n for n, _ in list_cases()) + ")", repr(op))
    return spec


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
                              f"no --shape/--dtype for {spec.op} (its case has fixed inputs)",
                              repr(shape if shape is not None else dtype))
    if shape is None:
        shape = spec.shape
    elif not (isinstance(shape, (list, tuple)) and all(isinstance(d, (int, np.integer)) and d >= 0
                                                      for d in shape)):
        raise OpArgumentError("golden", "shape", "a sequence of non-negative ints", repr(shape))
    elif not spec.any_rank and len(shape) != len(spec.shape):
        raise OpArgumentError("golden", "shape", f"{len(spec.shape)} dims for {spec.op} "
                              f"({spec.shape_doc})", repr(tuple(shape)))
    shape = None if shape is None else tuple(int(d) for d in shape)
    dtype = _dtype(spec.dtype if dtype is None else dtype)
    if shape is not None:
        refuse_unless_fits("golden", "shape", _case_bytes(shape, dtype),
                           f"a case of {math.prod(shape)} {dtype.name} elements")
    return shape, dtype


def _case_bytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    """An upper bound of the host memory a case of ``shape`` takes at its peak: the inputs
    are drawn as float64 (two temporaries), held in ``dtype`` on the host and the device,
    and every output (at most ``max(rank, 4)`` int64 words an element: NonZero's indices,
    Unique's four outputs) is held as computed and in its wire layout."""
    words = max(len(shape), 4)
    return math.prod(shape) * (2 * 8 + 2 * dtype.itemsize + 2 * 8 * words)


def _dtype(name: Any) -> np.dtype:
    import jax.numpy as jnp  # knows bfloat16, which numpy alone does not

    try:
        return jnp.dtype(name)
    except TypeError:
        raise OpArgumentError("golden", "dtype", "a dtype name such as float32, int8, bool or "
                              "bfloat16", repr(name)) from None
