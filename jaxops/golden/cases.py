"""Making, writing and reading golden cases (see :mod:`jaxops.golden`).

A case runs the operator's OpDef directly (the layer below ``tracing``) and writes what a
CANN kernel leaves behind: each output's max-shape buffer in wire layout and the int64
OP_OUTSHAPE words with the uint64 flag, encoded by :mod:`jaxops.core.outshape_format`.

>>> arrays, description = build_case("Unique", seed=1)
>>> description["outputs"][0]["actual_shape"] == [len(np.unique(arrays["input_x"]))]
True
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import numpy as np

from jaxops.core.dtypes import DataType
from jaxops.core.dynarray import DynArray
from jaxops.core.errors import OpArgumentError, UnsupportedDTypeError
from jaxops.core.impl_mode import OpImplMode, impl_mode_to_str
from jaxops.core.outshape_format import encode, to_host_words
from jaxops.capacity import warn_once
from jaxops.core.registry import OpDef, TensorParam, get_op
from jaxops.core.version import VERSION
from jaxops.golden.specs import get_spec, input_shape_dtype

__all__ = ["FORMAT_VERSION", "GoldenRun", "build_case", "default_path", "load_case",
           "run_opdef", "write_case"]

FORMAT_VERSION = 1


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


def run_opdef(opdef: OpDef, inputs: list, attrs: dict) -> GoldenRun:
    """Runs ``opdef`` on ``inputs`` as a CANN kernel would be checked: wire buffers, shapes
    and the OP_OUTSHAPE words, fetched from the device in one transfer.

    Args:
      opdef: the operator.
      inputs: its inputs in OpDef order.
      attrs: its attrs.

    Returns:
      The :class:`GoldenRun`.

    Examples:
      >>> import jax.numpy as jnp
      >>> run = run_opdef(get_op("NonZero"), [jnp.array([0, 5, 0, 7])], {})
      >>> run.actual_shapes, run.outshape[:3].tolist()
      ([(1, 2)], [2147483650, 1, 2])
    """
    mode = opdef.select_mode(None)
    outs = opdef(*inputs, **attrs)
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
    _warn_cut(opdef.name, run)
    return run


def _dims(shape) -> tuple[int, ...]:
    return tuple(int(d) for d in shape)


def _warn_cut(op: str, run: GoldenRun) -> None:
    """A size attr that cut an output is recorded in the case; say so once per call site."""
    for k, (got, true) in enumerate(zip(run.actual_shapes, run.true_shapes)):
        if true is not None and true != got:
            warn_once(f"{op}: golden case output {k} truncated to {got} by its size attr; "
                      f"true shape {true} (the case records it)")
            return


def build_case(op: str, seed: int = 0, attrs: dict | None = None, shape=None, dtype=None
               ) -> tuple[dict, dict]:
    """Computes a golden case: ``(arrays, description)`` (see :mod:`jaxops.golden`).

    Args:
      op: an operator with a golden spec.
      seed: the seed of the inputs (a case is deterministic per seed).
      attrs: attrs over the spec's defaults.
      shape: the input shape (default: the spec's; see its ``shape_doc``).
      dtype: the input dtype (default: the spec's).

    Returns:
      The arrays of the case and its JSON description.

    Examples:
      >>> arrays, _ = build_case("NonZero", seed=0, shape=(3, 4), dtype="bool")
      >>> arrays["input_x"].shape, arrays["input_x"].dtype
      ((3, 4), dtype('bool'))
    """
    spec = get_spec(op)
    opdef = get_op(op)  # the one lookup of this case
    attrs = {**spec.default_attrs, **(attrs or {})}
    opdef.check_attrs(attrs)  # bad values fail before any work
    in_shape, in_dtype = input_shape_dtype(spec, shape, dtype)
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
        raise OpArgumentError("golden", "seed", "a non-negative int", repr(seed))
    rng = np.random.default_rng(seed)
    inputs = spec.make_inputs(rng, attrs, in_shape, in_dtype) if spec.shape is not None \
        else spec.make_inputs(rng, attrs)
    _, full_attrs = opdef.check(inputs, attrs)
    extra, run = spec.run(opdef, inputs, attrs) if spec.run else ({}, run_opdef(opdef, inputs, attrs))
    arrays: dict[str, np.ndarray] = {}
    for p, x in zip(opdef.inputs, inputs):
        if x is not None and not isinstance(x, (list, tuple)) and hasattr(x, "dtype"):
            arrays[f"input_{p.name}"] = np.asarray(x)
    outputs_desc = []
    for k, (p, buf) in enumerate(zip(opdef.outputs, run.wire)):
        buf = _widen_index(p, np.asarray(jax.device_get(buf)))
        arrays[f"output_{p.name}"] = buf
        desc = _describe(p.name, buf)
        desc["max_shape"] = desc.pop("shape")
        if run.outshape is not None:
            desc["actual_shape"] = list(run.actual_shapes[k])
        true = (run.true_shapes or [None] * len(run.wire))[k]
        if true is not None:  # the size attr may have cut the output: say so
            desc["true_shape"] = list(true)
            desc["overflowed"] = list(true) != desc.get("actual_shape")
        if opdef.fill_values:
            desc["fill_value"] = opdef.fill_value(k)
        outputs_desc.append(desc)
    if run.outshape is not None:
        arrays["outshape"] = np.asarray(run.outshape)
    arrays.update(extra)
    chosen = {"input_shape": None if shape is None else list(in_shape),
              "input_dtype": None if dtype is None else str(in_dtype)}
    description = {
        "format_version": FORMAT_VERSION,
        "op": op,
        "seed": int(seed),
        "attrs": {k: (list(v) if isinstance(v, tuple) else v) for k, v in full_attrs.items()
                  if not isinstance(v, np.ndarray)},
        **{k: v for k, v in chosen.items() if v is not None},  # only when the user chose
        "impl_mode": {"name": impl_mode_to_str(run.impl_mode), "value": int(run.impl_mode)},
        "inputs": [_describe(k[len("input_"):], v) for k, v in arrays.items() if k.startswith("input_")],
        "outputs": outputs_desc,
        "outshape": None if run.outshape is None else {
            "dtype": "int64", "words": np.asarray(run.outshape).tolist(), "uint64_flag": True,
            "layout": "9 words per output: rank (bit 31 = uint64 flag), d0..d7"},
        "extra": sorted(extra),
        "wire_layout": "each output_* holds the max-shape buffer; its first prod(actual_shape) "
                       "elements in row-major order are the data, the rest is fill",
        "versions": {"jaxops": _version(), "jax": jax.__version__, "numpy": np.__version__},
    }
    return arrays, description


def _describe(name: str, a: np.ndarray) -> dict:
    try:
        code = DataType.from_dtype(a.dtype)
        dtype = {"numpy": str(a.dtype), "cann": code.name, "cann_code": int(code)}
    except UnsupportedDTypeError:
        dtype = {"numpy": str(a.dtype)}
    return {"name": name, "shape": list(a.shape), "dtype": dtype}


def _widen_index(param: TensorParam, buf: np.ndarray) -> np.ndarray:
    """int32 index outputs (x64 off) are written as int64 when the port allows INT64, the
    dtype CANN's kernels produce, so a case is the same with x64 off and on."""
    if buf.dtype == np.int32 and param.dtypes and DataType.INT64 in param.dtypes:
        return buf.astype(np.int64)
    return buf


def _version() -> str:
    return VERSION


def default_path(op: str, seed: int) -> str:
    """The file name of a case when ``--out`` names none: ``golden_<OP>_seed<N>.npz``.

    Examples:
      >>> default_path("NonZero", 3)
      'golden_NonZero_seed3.npz'
    """
    return f"golden_{op}_seed{seed}.npz"


def write_case(op: str, seed: int = 0, out: str | os.PathLike | None = None,
               attrs: dict | None = None, shape=None, dtype=None) -> str:
    """Writes a case as ``.npz`` plus a ``.json`` sidecar and returns the ``.npz`` path.

    Args:
      op: an operator with a golden spec.
      seed: the seed of the inputs.
      out: a file path (``.npz`` is appended when missing) or an existing directory (the
        case is written into it as :func:`default_path`); default: that name in the current
        directory. Its directory must exist (like ``ht.save``, a missing one is refused).
      attrs: attrs over the spec's defaults.
      shape: the input shape (see :func:`build_case`).
      dtype: the input dtype.

    Returns:
      The ``.npz`` path.

    Examples:
      >>> import tempfile
      >>> d = tempfile.mkdtemp()
      >>> write_case("NonZero", 3, out=d) == os.path.join(d, "golden_NonZero_seed3.npz")
      True
    """
    path = _target(op, seed, out)
    arrays, description = build_case(op, seed, attrs, shape, dtype)
    np.savez(path, **arrays, description=np.frombuffer(json.dumps(description).encode(), np.uint8))
    with open(path[:-4] + ".json", "w") as f:
        json.dump(description, f, indent=2)
    return path


def _target(op: str, seed: int, out: str | os.PathLike | None) -> str:
    """The ``.npz`` path ``out`` asks for; checked before any work is done."""
    if out is None:
        return default_path(op, seed)
    path = os.fspath(out)
    if os.path.isdir(path):
        return os.path.join(path, default_path(op, seed))
    if not path.endswith(".npz"):
        path += ".npz"
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise OpArgumentError("golden", "out", "a file in an existing directory (it is not "
                              "created, as ht.save does not)", repr(os.fspath(out)),
                              f"Create {parent} first.")
    return path


def load_case(path: str | os.PathLike) -> dict[str, Any]:
    """Reads a golden case.

    Args:
      path: the ``.npz`` file.

    Returns:
      The description's fields plus ``"arrays"``: ``{name: array}``.

    Examples:
      >>> import tempfile
      >>> case = load_case(write_case("Unique", 0, out=tempfile.mkdtemp()))
      >>> case["op"], "output_y" in case["arrays"]
      ('Unique', True)
    """
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files if k != "description"}
        description = json.loads(z["description"].tobytes().decode())
    return {**description, "arrays": _restore_dtypes(arrays, description)}


def _restore_dtypes(arrays: dict, description: dict) -> dict:
    """``.npz`` stores dtypes numpy does not know (bfloat16) as raw bytes ``|V2``; the
    description names them."""
    import jax.numpy as jnp  # knows bfloat16

    named = {f"{kind[:-1]}_{d['name']}": d["dtype"]["numpy"]
             for kind in ("inputs", "outputs") for d in description.get(kind, [])}
    return {k: a.view(jnp.dtype(named[k])) if a.dtype.kind == "V" and k in named else a
            for k, a in arrays.items()}
