"""Making and writing golden cases (see :mod:`jaxops.golden`).

A case runs the operator's OpDef directly (the layer below ``tracing``), on the CPU
kernels (native where built, else xla; never an NPU), and keeps what the kernel it is
golden for must produce (:mod:`jaxops.golden.contracts`): each output at its actual shape
in the contract's dtype, its max (buffer) shape and padding, and the OP_OUTSHAPE words
(int64, the uint64 flag set, :mod:`jaxops.core.outshape_format`). Files:
:mod:`jaxops.golden.files`.

>>> arrays, description = build_case("Unique", seed=1)
>>> description["outputs"][0]["actual_shape"] == [len(np.unique(arrays["input_x"]))]
True
>>> arrays["output_y"].dtype, description["contract"]["name"]   # values keep x's dtype
(dtype('int32'), 'aclnnUnique2')
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import numpy as np

import jaxops.native  # noqa: F401  (the native kernels, when built: a 16M case in well under a second)
from jaxops.capacity import warn_once
from jaxops.core.backend_table import use_backend
from jaxops.core.dtypes import DataType
from jaxops.core.dynarray import DynArray
from jaxops.core.errors import BackendUnavailableError, OpArgumentError
from jaxops.core.impl_mode import OpImplMode, impl_mode_to_str
from jaxops.core.outshape_format import encode, host_words, to_host_words
from jaxops.core.registry import OpDef, get_op
from jaxops.core.version import VERSION
from jaxops.golden import contracts, files
from jaxops.golden.files import default_path
from jaxops.golden.generators import Generation
from jaxops.golden.inputs import read_inputs
from jaxops.golden.specs import draw_inputs, get_spec

__all__ = ["FORMAT_VERSION", "GoldenRun", "build_case", "default_path", "describe", "load_case",
           "max_shape_buffer", "run_opdef", "write_case"]

#: 2: outputs stored at their actual shape, values in their input's dtype, contracts.
FORMAT_VERSION = 2
_INDEX_PORT = frozenset({DataType.INT32, DataType.INT64})


@dataclasses.dataclass
class GoldenRun:
    """What a case records of one run of an operator.

    ``wire``: every output's buffer at max shape in wire layout (valid data a contiguous
    row-major prefix, then fill). For data-dependent operators also ``outshape`` (the int64
    OP_OUTSHAPE words a CANN kernel writes, uint64 flag set), ``actual_shapes`` and
    ``true_shapes`` (per output the shape it has and the one unlimited capacity would give;
    ``None`` for outputs that cannot be cut).
    """

    wire: list
    impl_mode: OpImplMode
    outshape: np.ndarray | None = None
    actual_shapes: list | None = None
    true_shapes: list | None = None


def _on_cpu():
    """The CPU kernels: native where it is built (bit for bit the xla kernels), else xla."""
    try:
        return use_backend("native")
    except BackendUnavailableError:
        return use_backend("xla")


def run_opdef(opdef: OpDef, inputs: list, attrs: dict, impl_mode=None) -> GoldenRun:
    """Runs ``opdef`` on ``inputs`` as a CANN kernel would be checked: wire buffers, shapes
    and the OP_OUTSHAPE words, fetched from the device in one transfer.

    Args:
      opdef: the operator.
      inputs: its inputs in OpDef order.
      attrs: its attrs.
      impl_mode: the mode asked for (a misspelt name raises); ``None``: the default.

    Returns:
      The :class:`GoldenRun`.

    Examples:
      >>> import jax.numpy as jnp
      >>> run = run_opdef(get_op("NonZero"), [jnp.array([0, 5, 0, 7])], {})
      >>> run.actual_shapes, run.outshape[:3].tolist()
      ([(1, 2)], [2147483650, 1, 2])
    """
    mode = opdef.select_mode(impl_mode)
    with _on_cpu():
        outs = opdef(*inputs, impl_mode=mode, **attrs)
    outs = tuple(outs) if isinstance(outs, (tuple, list)) else (outs,)
    if not opdef.data_dependent:
        return GoldenRun([np.asarray(o) for o in outs], mode)
    fetched = jax.device_get([(o.to_wire(), o.actual_shape, o.true_shape) if isinstance(o, DynArray)
                              else (o, None, None) for o in outs])
    wire, actual, true = [], [], []
    for o, (buf, shape, true_shape) in zip(outs, fetched):
        wire.append(np.asarray(buf).reshape(np.shape(o.data) if isinstance(o, DynArray)
                                            else np.shape(o)))
        actual.append(_dims(shape) if shape is not None else np.shape(o))
        true.append(None if true_shape is None else _dims(true_shape))
    words = to_host_words(encode(actual, np.int64, uint64_flag=True), np.int64)
    run = GoldenRun(wire, mode, words, actual, true)
    _warn_cut(opdef.name, actual, true)
    return run


def _dims(shape) -> tuple[int, ...]:
    return tuple(int(d) for d in shape)


def _warn_cut(op: str, actual: list, true: list) -> None:
    """A size attr that cut an output is recorded in the case; say so once per call site."""
    for k, (got, want) in enumerate(zip(actual, true)):
        if want is not None and want != got:
            warn_once(f"{op}: golden case output {k} truncated to {got} by its size attr; "
                      f"true shape {want} (the case records it)")
            return


def _outputs(opdef: OpDef, inputs: list, attrs: dict, mode) -> list[contracts.GoldenOutput]:
    """Runs the OpDef; each output cut to its actual shape on the host (a DynArray's valid
    data is the leading block of its buffer), one transfer for all of them."""
    with _on_cpu():
        outs = opdef(*inputs, impl_mode=mode, **attrs)
    outs = tuple(outs) if isinstance(outs, (tuple, list)) else (outs,)
    fetched = jax.device_get([(o.data, o.actual_shape, o.true_shape) if isinstance(o, DynArray)
                              else (o, None, None) for o in outs])
    result = []
    for k, (param, (data, actual, true)) in enumerate(zip(opdef.outputs, fetched)):
        data = np.asarray(data)
        if actual is None:
            result.append(contracts.GoldenOutput(param.name, data, data.shape))
            continue
        actual = _dims(actual)
        cut = data[tuple(slice(0, d) for d in actual)]
        result.append(contracts.GoldenOutput(param.name, cut, data.shape,
                                             None if true is None else _dims(true),
                                             opdef.fill_value(k)))
    _warn_cut(opdef.name, [o.data.shape for o in result], [o.true_shape for o in result])
    return result


def _inputs(spec, opdef, attrs, seed, shape, dtype, generation, input_path):
    """The case's inputs: the developer's file, or the spec's generator at ``seed``."""
    if input_path is None:
        return draw_inputs(spec, seed, shape, dtype, generation, attrs)
    if generation != Generation():
        raise OpArgumentError("golden", "input", "no --density/--special with --input "
                              "(the file holds the values)", repr(os.fspath(input_path)))
    names = [p.name for p in opdef.inputs]
    required = [p.name for p in opdef.inputs if p.kind.name == "REQUIRED"]
    found = read_inputs(input_path, names, shape, dtype, required)
    return [found.get(n) for n in names], None


def build_case(op: str, seed: int = 0, attrs: dict | None = None, shape=None, dtype=None, *,
               input_path: str | os.PathLike | None = None,
               generation: Generation = Generation(), contract: str | None = None,
               impl_mode: str | None = None) -> tuple[dict, dict]:
    """Computes a golden case: ``(arrays, description)`` (see :mod:`jaxops.golden`).

    Args:
      op: an operator with a golden spec.
      seed: the seed of the generated inputs (a case is deterministic per seed).
      attrs: attrs over the spec's defaults.
      shape: the input shape (default: the spec's; see its ``shape_doc``).
      dtype: the input dtype (default: the spec's).
      input_path: the developer's inputs (``.npz``, ``.bin``, ``.json``) instead of the
        generator (:mod:`jaxops.golden.inputs`).
      generation: densities and special values (:mod:`jaxops.golden.generators`).
      contract: the kernel contract where an operator offers several (NonMaxSuppression:
        ``"aclnn"``, the default, or ``"onnx"``).
      impl_mode: the impl mode to run (a misspelt name raises); ``None``: the default.

    Returns:
      The arrays of the case (outputs at their actual shapes) and its JSON description.

    Examples:
      >>> arrays, _ = build_case("NonZero", seed=0, shape=(3, 4), dtype="bool")
      >>> arrays["input_x"].shape, arrays["input_x"].dtype, arrays["output_y"].dtype
      ((3, 4), dtype('bool'), dtype('int64'))
    """
    spec = get_spec(op)
    opdef = get_op(op)  # the one lookup of this case
    attrs = {**spec.default_attrs, **(attrs or {})}
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
        raise OpArgumentError("golden", "seed", "a non-negative int", repr(seed))
    if spec.build is not None:
        return _table_case(spec, opdef, int(seed), attrs, shape, dtype, input_path,
                           generation, contract, impl_mode)
    opdef.check_attrs(attrs)  # bad values fail before any work
    rule = contracts.choices(op)
    if not rule and contract is not None:
        raise OpArgumentError(f"golden {op}", "contract", "no --contract (its case has one)",
                              repr(contract))
    mode = opdef.select_mode(impl_mode)
    inputs, chosen = _inputs(spec, opdef, attrs, seed, shape, dtype, generation, input_path)
    _, full_attrs = opdef.check(inputs, attrs)  # the inputs as drawn: optional ones stay out
    kernel = contracts.contract(op, full_attrs, contract) if rule else None
    if kernel is not None:
        contracts.check_inputs(op, kernel, inputs, full_attrs)
    named = {p.name: np.asarray(x) for p, x in zip(opdef.inputs, inputs)
             if x is not None and not isinstance(x, (list, tuple)) and hasattr(x, "dtype")}
    extra, outputs, words = {}, _outputs(opdef, inputs, attrs, mode), None
    if kernel is not None:
        index = {p.name for p in opdef.outputs if p.dtypes and set(p.dtypes) == _INDEX_PORT}
        outputs = contracts.to_contract(op, kernel, outputs, named, index)
    dependent = [o for o in outputs if o.data_dependent]
    if words is None and dependent:
        words = host_words([o.data.shape for o in outputs], np.int64, uint64_flag=True)
    arrays = {f"input_{k}": v for k, v in named.items()}
    arrays.update({f"output_{o.name}": o.data for o in outputs})
    if words is not None:
        arrays["outshape"] = np.asarray(words)
    arrays.update(extra)
    source = ({"input_file": os.path.basename(os.fspath(input_path))} if input_path is not None
              else {"generation": generation.describe()})
    if shape is not None and chosen is not None:  # only what the user chose
        source["input_shape"] = list(chosen[0])
    if dtype is not None and chosen is not None:
        source["input_dtype"] = str(chosen[1])
    description = describe(op, None if input_path is not None else int(seed), source, kernel,
                            full_attrs, mode, arrays, outputs, words, extra)
    return arrays, description


def _table_case(spec, opdef, seed, attrs, shape, dtype, input_path, generation, contract,
                impl_mode) -> tuple[dict, dict]:
    """A hash-table case: its spec's ``build`` makes CANN's inputs and outputs by name."""
    if generation != Generation():
        raise OpArgumentError(f"golden {spec.op}", "density" if generation.density is not None
                              else "special", "no --density/--special (its inputs are tables "
                              "and keys)", repr(generation.describe()))
    mode = opdef.select_mode(impl_mode)
    own = {k: attrs.pop(k) for k in list(attrs) if k in spec.case_attrs}
    attrs = {**opdef.check_attrs(attrs), **own}  # bad values fail before any work
    contracts.contract(spec.op, attrs, contract)  # so do attrs the kernel does not have
    inputs, outputs, attrs = spec.build(spec, seed, attrs, shape, dtype, input_path)
    kernel = contracts.contract(spec.op, attrs, contract)
    arrays = {f"input_{k}": v for k, v in inputs.items()}
    arrays.update({f"output_{o.name}": o.data for o in outputs})
    source = ({"input_file": os.path.basename(os.fspath(input_path))} if input_path is not None
              else {"generation": generation.describe()})
    if shape is not None:
        source["input_shape"] = list(shape)
    if dtype is not None:
        source["input_dtype"] = str(dtype)
    description = describe(spec.op, None if input_path is not None else seed, source, kernel,
                            attrs, mode, arrays, outputs, None, {})
    return arrays, description


def describe(op, seed, source, kernel, attrs, mode, arrays, outputs, words, extra) -> dict:
    """A case's JSON description: ``source`` (how the inputs came) spread into it,
    ``kernel`` a :class:`~jaxops.golden.contracts.Contract` (or ``None``), ``outputs``
    :class:`~jaxops.golden.contracts.GoldenOutput`, ``words`` the OP_OUTSHAPE words."""
    outs = []
    for o in outputs:
        d = files.describe_tensor(o.name, o.data)
        d["max_shape"] = list(o.max_shape)
        d.update(o.notes or {})
        if o.data_dependent:
            d["actual_shape"] = list(o.data.shape)
            d["fill_value"] = o.fill_value
            if o.true_shape is not None:  # the size attr may have cut the output: say so
                d["true_shape"] = list(o.true_shape)
                d["overflowed"] = list(o.true_shape) != d["actual_shape"]
        outs.append(d)
    return {
        "format_version": FORMAT_VERSION,
        "op": op,
        "seed": seed,
        **source,
        "contract": kernel.describe() if kernel is not None else {
            "name": "jaxops", "follows": "jaxops' operator (no kernel contract recorded)"},
        "attrs": {k: (list(v) if isinstance(v, tuple) else v) for k, v in attrs.items()
                  if not isinstance(v, np.ndarray)},
        "impl_mode": {"name": impl_mode_to_str(mode), "value": int(mode)},
        "inputs": [files.describe_tensor(k[len("input_"):], v) for k, v in arrays.items()
                   if k.startswith("input_")],
        "outputs": outs,
        "outshape": None if words is None else {
            "dtype": "int64", "words": np.asarray(words).tolist(), "uint64_flag": True,
            "layout": "9 words per output: rank (bit 31 = uint64 flag), d0..d7"},
        "extra": sorted(extra),
        "layout": "output_* hold each output at its actual shape; its kernel buffer is "
                  "max_shape, the data its row-major prefix, then fill_value (outputs "
                  "without fill_value are their whole buffer)",
        "versions": {"jaxops": VERSION, "jax": jax.__version__, "numpy": np.__version__},
    }


def write_case(op: str, seed: int = 0, out: str | os.PathLike | None = None,
               attrs: dict | None = None, shape=None, dtype=None, *, force: bool = False,
               bin: bool = False, **options: Any) -> str:
    """Writes a case as ``.npz`` plus a ``.json`` description (and with ``bin`` raw
    ``.bin`` files, :mod:`jaxops.golden.files`); returns the ``.npz`` path.

    Args:
      op: an operator with a golden spec.
      seed: the seed of the inputs.
      out: a file path (``.npz`` is appended when missing) or an existing directory (the
        case is written into it as :func:`default_path`); default: that name in the current
        directory. Its directory must exist (like ``ht.save``, a missing one is refused).
      attrs: attrs over the spec's defaults.
      shape: the input shape (see :func:`build_case`).
      dtype: the input dtype.
      force: overwrite an existing case (refused otherwise, before any work).
      bin: also write the raw little-endian ``.bin`` files.
      **options: ``input_path``, ``generation``, ``contract``, ``impl_mode`` of
        :func:`build_case`.

    Returns:
      The ``.npz`` path.

    Examples:
      >>> import tempfile
      >>> d = tempfile.mkdtemp()
      >>> write_case("NonZero", 3, out=d) == os.path.join(d, "golden_NonZero_seed3.npz")
      True
      >>> write_case("NonZero", 3, out=d)
      Traceback (most recent call last):
      ...
      jaxops.core.errors.OpArgumentError: golden: argument 'out': expected a path where no case is yet, got '...golden_NonZero_seed3.npz'. Pass --force (force=True) to overwrite it, or choose another --out.
    """
    path = files.target(op, seed, out)
    files.refuse_existing(path, bin, force)
    arrays, description = build_case(op, seed, attrs, shape, dtype, **options)
    buffers = None
    if bin:
        case = {"outputs": description["outputs"], "arrays": arrays}
        buffers = {d["name"]: files.max_shape_buffer(case, d["name"])
                   for d in description["outputs"] if "fill_value" in d}
    return files.write(path, arrays, description, bin=bin, buffers=buffers)


def load_case(path: str | os.PathLike) -> dict[str, Any]:
    """Reads a golden case (format 1 files too, their outputs cut as format 2 stores them).

    Args:
      path: the ``.npz`` file.

    Returns:
      The description's fields plus ``"arrays"``: ``{name: array}``, bfloat16 restored.

    Examples:
      >>> import tempfile
      >>> case = load_case(write_case("Unique", 0, out=tempfile.mkdtemp()))
      >>> case["op"], case["arrays"]["output_y"].shape == tuple(case["outputs"][0]["actual_shape"])
      ('Unique', True)
    """
    return files.load(path)


def max_shape_buffer(case: dict, name: str) -> np.ndarray:
    """Output ``name`` of a loaded case as the kernel's max-shape buffer (its data as the
    row-major prefix, then its fill value).

    Examples:
      >>> import tempfile
      >>> case = load_case(write_case("NonZero", 0, out=tempfile.mkdtemp(), shape=(2, 3)))
      >>> max_shape_buffer(case, "y").shape
      (2, 6)
    """
    return files.max_shape_buffer(case, name)
