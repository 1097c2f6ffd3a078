"""Golden data for a whole ONNX model (``jaxops golden --onnx MODEL --inputs NPZ --out DIR``).

For every data-dependent node of one run (:func:`jaxops.onnx.nodes.data_dependent`:
NonZero, NonMaxSuppression, Unique, Compress, TopK with a traced ``k``, ops fed a traced
shape...), a case in the single-operator golden format (format 2, :mod:`jaxops.golden`):
its inputs and outputs at their actual shapes in the dtypes the model declares (int64
stays int64 with x64 off), the OP_OUTSHAPE words (9 int64 words per output), each output's
max shape (jaxops' plan) and fill value, and with ``bin`` the raw ``.bin`` files and
max-shape buffers. Inputs and outputs are named by the op's formal parameters in the ONNX
schema (``X``, ``boxes``, ``selected_indices``; a variadic one numbered). ``DIR/index.json``
(:mod:`jaxops.golden.models`) lists each node, its op type, its files and which graph
value each tensor is. The values are those of the model run under ``jax.jit``.

>>> import os, tempfile, json, numpy as np
>>> from onnx import helper, TensorProto as T
>>> g = helper.make_graph([helper.make_node("NonZero", ["x"], ["i"], name="nz")], "g",
...                       [helper.make_tensor_value_info("x", T.FLOAT, [4])],
...                       [helper.make_tensor_value_info("i", T.INT64, [1, "n"])])
>>> model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
>>> out = os.path.join(tempfile.mkdtemp(), "golden")
>>> index = write_model_golden(model, {"x": np.array([0, 2, 0, 1], np.float32)}, out)
>>> node = json.load(open(index))["nodes"][0]
>>> node["op_type"], node["case"], node["outputs"][0]["key"]
('NonZero', 'node0000_NonZero.npz', 'output_Y')
>>> z = np.load(os.path.join(out, node["case"]))
>>> z["output_Y"].tolist(), z["outshape"][:3].tolist()
([[1, 3]], [2147483650, 1, 2])
"""

from __future__ import annotations

import os
import pathlib
import shutil
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from jaxops.core.errors import OpArgumentError, OpDTypeError
from jaxops.core.impl_mode import OpImplMode
from jaxops.core.outshape_format import host_words
from jaxops.core.version import VERSION
from jaxops.golden import files
from jaxops.golden.cases import FORMAT_VERSION, describe
from jaxops.golden.contracts import Contract, GoldenOutput
from jaxops.golden.models import INDEX, KIND
from jaxops.onnx.nodes import NodeValues, data_dependent, node_values
from jaxops.onnx.program import load

__all__ = ["read_inputs", "write_model_golden"]

_WHERE = "golden --onnx"


def read_inputs(program: Any, inputs: str | os.PathLike | Mapping[str, Any]) -> list:
    """The graph inputs of ``program`` from a ``.npz`` (or a mapping) by name, in graph
    order, each exactly of its declared dtype and shape: errors name ``--inputs`` and
    the input."""
    from onnx import helper

    if not isinstance(inputs, Mapping):
        path = os.fspath(inputs)
        if not (os.path.isfile(path) and path.endswith(".npz")):
            raise OpArgumentError(_WHERE, "--inputs", "a .npz file holding the graph inputs "
                                  "by name", repr(path))
        with np.load(path) as z:
            inputs = {k: z[k] for k in z.files}
    names = program.input_names
    missing = [n for n in names if n not in inputs]
    extra = sorted(set(inputs) - set(names))
    if missing or extra:
        given = f"none for {missing}" if missing else f"also {extra}"
        raise OpArgumentError(_WHERE, "--inputs", f"an array for each graph input {names}, "
                              "by name, and nothing else", f"{given} (it holds {sorted(inputs)})")
    declared = {v.name: v.type.tensor_type for v in program.proto.graph.input}
    arrays = []
    for name in names:
        x, t = np.asarray(inputs[name]), declared[name]
        arg = f"--inputs[{name!r}]"
        if t.elem_type:
            want = np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type))
            if x.dtype != want:
                raise OpDTypeError(_WHERE, arg, f"dtype {want.name} (the graph input's)",
                                   x.dtype.name)
        if t.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
            if len(dims) != x.ndim or any(d is not None and d != m for d, m in zip(dims, x.shape)):
                raise OpArgumentError(_WHERE, arg, "shape " + str([d if d is not None else "?"
                                                                   for d in dims]), list(x.shape))
        arrays.append(x)
    program.check_inputs(*arrays)
    return arrays


def _types(proto: Any) -> dict[str, np.dtype]:
    """Every value's numpy dtype as the model declares or infers it."""
    import onnx
    from onnx import helper

    try:
        proto = onnx.shape_inference.infer_shapes(proto)
    except Exception:  # inference is an aid: the values' own dtypes remain
        pass
    g = proto.graph
    found = {t.name: t.data_type for t in g.initializer}
    found.update({v.name: v.type.tensor_type.elem_type
                  for v in [*g.input, *g.value_info, *g.output] if v.type.HasField("tensor_type")})
    return {n: np.dtype(helper.tensor_dtype_to_np_dtype(e)) for n, e in found.items() if e}


def _formal(node: Any, opset: int) -> tuple[list[str], list[str]]:
    """The schema's names of the node's inputs and outputs (a variadic one numbered)."""
    from onnx import defs

    variadic = defs.OpSchema.FormalParameterOption.Variadic

    def names(params, n, prefix):
        out = []
        for k in range(n):
            p = params[min(k, len(params) - 1)] if params else None
            if p is not None and p.option == variadic:  # the last parameter, numbered
                out.append(f"{p.name}{k - len(params) + 1}")
            else:
                out.append(p.name if p is not None and k < len(params) else f"{prefix}{k}")
        return out

    try:
        schema = defs.get_schema(node.op_type, opset, node.domain)
    except Exception:  # no schema at this opset: positions
        schema = None
    return (names(schema.inputs if schema else [], len(node.input), "input"),
            names(schema.outputs if schema else [], len(node.output), "output"))


def _attrs(node: Any) -> dict:
    """The node's attributes as JSON values (a tensor as its list, a graph by name)."""
    from onnx import helper, numpy_helper

    out = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        if a.type == a.TENSOR:
            v = numpy_helper.to_array(v).tolist()
        elif a.type in (a.GRAPH, a.GRAPHS):
            v = f"<graph {v.name}>" if a.type == a.GRAPH else [f"<graph {g.name}>" for g in v]
        elif isinstance(v, bytes):
            v = v.decode()
        elif isinstance(v, list):
            v = [x.decode() if isinstance(x, bytes) else x for x in v]
        out[a.name] = v
    return out


def _typed(a: np.ndarray, want: np.dtype | None) -> np.ndarray:
    """A value in the model's dtype (JAX with x64 off computes int64 as int32)."""
    return a if want is None or a.dtype == want else a.astype(want)


def _case(run: NodeValues, model_name: str, inputs_name: str | None, opset: int,
          types: dict, fill_value: Any) -> tuple[dict, dict, list[dict], list[dict]]:
    node = run.node
    formal_in, formal_out = _formal(node, opset)
    arrays, ins, outs, outputs = {}, [], [], []
    for name, value, a in zip(formal_in, node.input, run.inputs):
        if a is not None:
            arrays[f"input_{name}"] = _typed(a, types.get(value))
            ins.append({"name": name, "value": value, "key": f"input_{name}"})
    for name, value, a, shape, dyn in zip(formal_out, node.output, run.outputs,
                                          run.max_shapes, run.dynamic):
        if a is None:
            continue
        a = _typed(a, types.get(value))
        outputs.append(GoldenOutput(name, a, tuple(shape), None,
                                    np.asarray(fill_value, a.dtype).item() if dyn else None))
        outs.append({"name": name, "value": value, "key": f"output_{name}"})
        arrays[f"output_{name}"] = a
    words = host_words([o.data.shape for o in outputs], np.int64, uint64_flag=True)
    arrays["outshape"] = words
    source = {"model": model_name, "input_file": inputs_name,
              "node": {"index": run.index, "name": node.name, "op_type": node.op_type,
                       "opset": opset, "inputs": list(node.input),
                       "outputs": list(node.output)}}
    contract = Contract("onnx", f"ONNX {node.op_type} (opset {opset}) as the model's node "
                        "computes it: jaxops.onnx under jax.jit; tensors named by the "
                        "schema's formal parameters")
    description = describe(node.op_type, None, source, contract, _attrs(node),
                           OpImplMode.HIGH_PRECISION, arrays, outputs, words, {})
    return arrays, description, ins, outs


def _stem(run: NodeValues) -> str:
    return f"node{run.index:04d}_{run.op_type}"


def _prepare(out: str, force: bool) -> None:
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise OpArgumentError(_WHERE, "--out", "a folder in an existing directory",
                              repr(out), f"Create {parent} first.")
    if os.path.exists(out) and not os.path.isdir(out):
        raise OpArgumentError(_WHERE, "--out", "a folder", f"the file {out!r}")
    if os.path.isdir(out) and os.listdir(out):
        if not force:
            raise OpArgumentError(_WHERE, "--out", "a new or empty folder", repr(out),
                                  "Pass --force (force=True) to overwrite it, or choose "
                                  "another --out.")
        if not os.path.isfile(os.path.join(out, INDEX)):
            raise OpArgumentError(_WHERE, "--out", f"a model's golden folder ({INDEX}) to "
                                  "overwrite with --force", f"{out!r}, which has none")
        shutil.rmtree(out)
    os.makedirs(out, exist_ok=True)


def write_model_golden(model: Any, inputs: str | os.PathLike | Mapping[str, Any],
                       out: str | os.PathLike, *, bin: bool = False,
                       force: bool = False) -> str:
    """Writes the golden folder of one run of ``model``; returns the index's path.

    Args:
      model: an ``.onnx`` path or an ``onnx.ModelProto``.
      inputs: the graph inputs by name: a ``.npz`` path or a mapping of arrays, each of
        its declared dtype and shape.
      out: the folder to write (created; its parent must exist). One that is not empty is
        refused unless ``force`` (and then only a model's golden folder is replaced).
      bin: also write each case's raw ``.bin`` files and max-shape buffers.
      force: replace an existing golden folder.

    Returns:
      The path of ``out/index.json``.
    """
    import json

    out = os.fspath(out)
    if not isinstance(model, (str, os.PathLike)) and not hasattr(model, "graph"):
        raise OpArgumentError(_WHERE, "--onnx", "an .onnx path or an onnx.ModelProto",
                              type(model).__name__)
    if isinstance(model, (str, os.PathLike)) and not os.path.isfile(model):
        raise OpArgumentError(_WHERE, "--onnx", "an existing .onnx file", repr(os.fspath(model)))
    program = load(model)
    arrays = read_inputs(program, inputs)
    _prepare(out, force)
    chosen = data_dependent(program, *arrays)
    runs = node_values(program, chosen, *arrays)
    types = _types(program.proto)
    model_name = (os.path.basename(os.fspath(model)) if isinstance(model, (str, os.PathLike))
                  else program.proto.graph.name)
    inputs_name = (os.path.basename(os.fspath(inputs)) if not isinstance(inputs, Mapping)
                   else None)
    entries = []
    for run in runs:
        case_arrays, description, ins, outs = _case(run, model_name, inputs_name,
                                                    program.opset, types, program.fill_value)
        stem = _stem(run)
        path = os.path.join(out, stem + ".npz")
        buffers = None
        if bin:
            case = {"outputs": description["outputs"], "arrays": case_arrays}
            buffers = {d["name"]: files.max_shape_buffer(case, d["name"])
                       for d in description["outputs"] if "fill_value" in d}
        files.write(path, case_arrays, description, bin=bin, buffers=buffers)
        entries.append({"index": run.index, "op_type": run.op_type,
                        "name": run.node.name or f"{run.op_type}->{run.node.output[0]}",
                        "stem": stem, "case": stem + ".npz", "json": stem + ".json",
                        "bin": stem if bin else None, "inputs": ins, "outputs": outs})
    index = {
        "kind": KIND, "format_version": FORMAT_VERSION, "model": model_name,
        "model_path": (os.path.abspath(os.fspath(model))
                       if isinstance(model, (str, os.PathLike)) else None),
        "opset": program.opset, "input_file": inputs_name,
        "inputs": [files.describe_tensor(n, a) for n, a in zip(program.input_names, arrays)],
        "selection": "the nodes whose output sizes are computed from tensor values "
                     "(jaxops.onnx.nodes.data_dependent), in graph order",
        "nodes": entries,
        "versions": {"jaxops": VERSION, "jax": jax.__version__, "numpy": np.__version__},
    }
    path = str(pathlib.Path(out) / INDEX)
    with open(path, "w") as f:
        json.dump(index, f, indent=1)
    return path
