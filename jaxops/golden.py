"""Golden reference cases for validating Ascend kernels (``jaxops golden``).

A golden case is what an Ascend operator developer compares a kernel against: the inputs,
the outputs **in wire layout** (each output's buffer at max shape, its valid data a
contiguous row-major prefix, the rest fill — what the kernel leaves in device memory), the
OP_OUTSHAPE tensor exactly as a CANN kernel writes it (int64 words, the uint64 rank flag
set), the attrs and the impl mode. Index outputs are int64 (CANN's and ONNX's type) whether
or not ``jax_enable_x64`` is on. It is one ``.npz`` plus a JSON sidecar describing it;
for the hash-table operators the table before and after in CANN bucket bytes too.
Deterministic for a given seed.

>>> import tempfile, os
>>> path = write_case("NonZero", seed=0, out=os.path.join(tempfile.mkdtemp(), "nz.npz"))
>>> case = load_case(path)
>>> case["op"], sorted(case["arrays"])[:3]
('NonZero', ['input_x', 'output_y', 'outshape'])
>>> check_case(path)   # recompute with jaxops and compare everything
True
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from jaxops.core.dtypes import DataType
from jaxops.core.errors import OpArgumentError
from jaxops.core.registry import get_op, list_ops

FORMAT_VERSION = 1


@dataclasses.dataclass(frozen=True)
class GoldenSpec:
    """How to make a golden case for one operator.

    ``make_inputs(rng, attrs)`` returns the inputs in OpDef order; ``run(inputs, attrs)``
    (optional) replaces the default ``tracing.launch`` run and returns a dict of extra arrays
    plus the launch result (used by the hash-table operators for their CANN bucket bytes).
    """

    op: str
    doc: str
    make_inputs: Callable[[np.random.Generator, dict], list]
    default_attrs: dict = dataclasses.field(default_factory=dict)
    run: Callable[[list, dict], tuple[dict, Any]] | None = None


_SPECS: dict[str, GoldenSpec] = {}


def register_golden(spec: GoldenSpec) -> GoldenSpec:
    """Adds a golden spec (one per operator)."""
    _SPECS[spec.op] = spec
    return spec


def list_cases() -> list[tuple[str, str]]:
    """``(op, description)`` for every registered operator that has a golden spec."""
    _load_specs()
    registered = set(list_ops())
    return [(name, spec.doc) for name, spec in sorted(_SPECS.items()) if name in registered]


def _spec(op: str) -> GoldenSpec:
    _load_specs()
    get_op(op)  # unknown name → UnknownOpError listing close matches
    spec = _SPECS.get(op)
    if spec is None:
        raise OpArgumentError("golden", "OP", "an operator with a golden spec ("
                              + ", ".join(n for n, _ in list_cases()) + ")", repr(op))
    return spec


def parse_attr_args(op: str, argv: list[str]) -> dict[str, Any]:
    """Parses ``--name value`` pairs into attrs typed by the OpDef (errors name op and attr)."""
    opdef = get_op(op)
    known = {a.name: a for a in opdef.attrs}
    attrs: dict[str, Any] = {}
    it = iter(argv)
    for flag in it:
        if not flag.startswith("--"):
            raise OpArgumentError(op, None, "attrs as --name value", repr(flag))
        name = flag[2:].replace("-", "_")
        value = next(it, None)
        if name not in known:
            raise OpArgumentError(op, name, "one of its attrs: " + ", ".join(known), "an unknown attr")
        if value is None:
            raise OpArgumentError(op, name, "a value after the flag", "nothing")
        attrs[name] = _parse_value(op, known[name], value)
    return attrs


def _parse_value(op: str, attr, text: str):
    kind = attr.type
    try:
        if text.lower() == "none" and attr.optional:
            return None
        if kind == "int":
            return int(text)
        if kind == "float":
            return float(text)
        if kind == "bool":
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
        if kind == "list_int":
            return [int(t) for t in text.split(",") if t]
        if kind == "list_float":
            return [float(t) for t in text.split(",") if t]
        return text
    except ValueError:
        raise OpArgumentError(op, attr.name, attr.describe(), repr(text)) from None


def _describe(name: str, a: np.ndarray) -> dict:
    try:
        code = DataType.from_dtype(a.dtype)
        dtype = {"numpy": str(a.dtype), "cann": code.name, "cann_code": int(code)}
    except Exception:
        dtype = {"numpy": str(a.dtype)}
    return {"name": name, "shape": list(a.shape), "dtype": dtype}


def _launch(op: str, inputs: list, attrs: dict):
    import tracing

    opdef = get_op(op)
    n_out = len(opdef.outputs)
    shape_tensor = np.zeros(9 * n_out, np.int64)
    pairs = [tracing.OP_OUTSHAPE(shape_tensor, i) for i in range(n_out)] if opdef.data_dependent else []
    return tracing.launch(op, tracing.OP_INPUT(*inputs), tracing.OP_ATTR(**attrs), *pairs,
                          uint64_flag=True)


def build_case(op: str, seed: int = 0, attrs: dict | None = None) -> tuple[dict, dict]:
    """Computes a golden case: ``(arrays, description)`` (see the module docstring)."""
    spec = _spec(op)
    opdef = get_op(op)
    attrs = {**spec.default_attrs, **(attrs or {})}
    opdef.check_attrs(attrs)  # bad values fail before any work
    rng = np.random.default_rng(seed)
    inputs = spec.make_inputs(rng, attrs)
    _, full_attrs = opdef.check(inputs, attrs)
    extra, result = spec.run(inputs, attrs) if spec.run else ({}, _launch(op, inputs, attrs))
    arrays: dict[str, np.ndarray] = {}
    for p, x in zip(opdef.inputs, inputs):
        if x is not None and not isinstance(x, (list, tuple)) and hasattr(x, "dtype"):
            arrays[f"input_{p.name}"] = np.asarray(x)
    outputs_desc = []
    wire = result.wire if result.wire is not None else [np.asarray(o) for o in result.outputs]
    for k, (p, buf) in enumerate(zip(opdef.outputs, wire)):
        buf = _widen_index(p, np.asarray(jax.device_get(buf)))
        arrays[f"output_{p.name}"] = buf
        desc = _describe(p.name, buf)
        desc["max_shape"] = desc.pop("shape")
        if result.outshape is not None:
            desc["actual_shape"] = list(np.shape(result.outputs[k]))
        true = (result.true_shapes or [None] * len(wire))[k]
        if true is not None:  # the size attr may have cut the output: say so
            desc["true_shape"] = list(true)
            desc["overflowed"] = list(true) != desc.get("actual_shape")
        if opdef.fill_values:
            desc["fill_value"] = opdef.fill_values[min(k, len(opdef.fill_values) - 1)]
        outputs_desc.append(desc)
    if result.outshape is not None:
        arrays["outshape"] = np.asarray(result.outshape)
    arrays.update(extra)
    description = {
        "format_version": FORMAT_VERSION,
        "op": op,
        "seed": seed,
        "attrs": {k: (list(v) if isinstance(v, tuple) else v) for k, v in full_attrs.items()
                  if not isinstance(v, np.ndarray)},
        "impl_mode": {"name": _mode_name(result.impl_mode), "value": int(result.impl_mode)},
        "inputs": [_describe(k[len("input_"):], v) for k, v in arrays.items() if k.startswith("input_")],
        "outputs": outputs_desc,
        "outshape": None if result.outshape is None else {
            "dtype": "int64", "words": np.asarray(result.outshape).tolist(), "uint64_flag": True,
            "layout": "9 words per output: rank (bit 31 = uint64 flag), d0..d7"},
        "extra": sorted(extra),
        "wire_layout": "each output_* holds the max-shape buffer; its first prod(actual_shape) "
                       "elements in row-major order are the data, the rest is fill",
        "versions": {"jaxops": _version(), "jax": jax.__version__, "numpy": np.__version__},
    }
    return arrays, description


def _widen_index(param, buf: np.ndarray) -> np.ndarray:
    """int32 index outputs (x64 off) are written as int64 when the port allows INT64, the
    dtype CANN's kernels produce, so a case is the same with x64 off and on."""
    if buf.dtype == np.int32 and param.dtypes and DataType.INT64 in param.dtypes:
        return buf.astype(np.int64)
    return buf


def _mode_name(mode) -> str:
    from jaxops.core.impl_mode import impl_mode_to_str
    return impl_mode_to_str(mode)


def _version() -> str:
    import jaxops
    return jaxops.__version__


def write_case(op: str, seed: int = 0, out: str | None = None, attrs: dict | None = None) -> str:
    """Writes ``<out>.npz`` and its ``<out>.json`` sidecar; returns the ``.npz`` path."""
    arrays, description = build_case(op, seed, attrs)
    path = out or f"golden_{op}_seed{seed}.npz"
    if not path.endswith(".npz"):
        path += ".npz"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    np.savez(path, **arrays, description=np.frombuffer(json.dumps(description).encode(), np.uint8))
    with open(path[:-4] + ".json", "w") as f:
        json.dump(description, f, indent=2)
    return path


def load_case(path: str) -> dict:
    """Reads a golden case: ``{"op", "seed", "attrs", ..., "arrays": {name: array}}``."""
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files if k != "description"}
        description = json.loads(z["description"].tobytes().decode())
    return {**description, "arrays": arrays}


def check_case(path: str) -> bool:
    """Recomputes a golden case from its seed and attrs and compares every array exactly."""
    case = load_case(path)
    arrays, _ = build_case(case["op"], case["seed"], _user_attrs(case))
    if sorted(arrays) != sorted(case["arrays"]):
        raise AssertionError(f"golden case {path}: arrays differ: {sorted(arrays)} vs "
                             f"{sorted(case['arrays'])}")
    for name, want in case["arrays"].items():
        got = arrays[name]
        if got.dtype != want.dtype or got.shape != want.shape or not np.array_equal(
                got, want, equal_nan=got.dtype.kind == "f"):
            raise AssertionError(f"golden case {path}: {name} differs")
    return True


def _user_attrs(case: dict) -> dict:
    known = {a.name for a in get_op(case["op"]).attrs}
    return {k: v for k, v in case["attrs"].items() if k in known}


_loaded = False


def _load_specs() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        from jaxops import golden_specs  # noqa: F401  (registers the per-operator specs)
