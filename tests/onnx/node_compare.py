"""Every node's output of a model, jaxops.onnx under jit against ONNX Runtime (which gives
intermediate values when they are added as graph outputs). Used by the real-model tests and
by hand: ``python -m tests.onnx.node_compare MODEL.onnx``."""

from __future__ import annotations

import sys

import jax
import numpy as np


def all_values(model) -> list[str]:
    """The names of every node output of the main graph, in node order."""
    return [o for n in model.graph.node for o in n.output if o]


def with_outputs(model, names):
    """A copy of ``model`` whose graph outputs are ``names`` (types from shape inference)."""
    import onnx
    from onnx import helper

    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type for v in
             list(inferred.graph.value_info) + list(inferred.graph.output) + list(inferred.graph.input)}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.output[:]
    out.graph.output.extend(helper.make_tensor_value_info(n, types.get(n, 1), None) for n in names)
    return out


def compare(model, feeds: list[dict], rtol=1e-4, atol=1e-4, names=None):
    """Runs ``model`` on each feed with both; returns ``(compiles, rows, theirs)``: one row
    ``(feed index, name, op, ok, why)`` per compared value; float values within
    ``rtol`` and ``atol`` times the value's largest magnitude (at least 1), every other
    dtype exact."""
    import onnxruntime as ort

    import jaxops
    import jaxops.onnx

    names = names or all_values(model)
    ops = {o: n.op_type for n in model.graph.node for o in n.output}
    session = ort.InferenceSession(with_outputs(model, names).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    results = [session.run(names, feed) for feed in feeds]
    if not jax.config.jax_enable_x64:  # constants such as INT64_MAX stay on the host
        wide = {n for r in results for n, v in zip(names, r)
                if v.dtype.itemsize == 8 and v.dtype.kind in "iu" and v.size
                and (v.max() > 2**31 - 1 or v.min() < -2**31)}
        keep = [k for k, n in enumerate(names) if n not in wide]
        names = [names[k] for k in keep]
        results = [[r[k] for k in keep] for r in results]
    fn = jaxops.onnx.load(model, outputs=names)
    traces = []

    def run(*args):
        traces.append(1)
        return fn(*args)
    # every value is an output, so nothing fuses and XLA's CPU code generation dominates
    # (fcos: 26 s of CPU at the default level, 15 s at 0); the values are the same: the
    # program compared is jaxops', the level only changes how LLVM optimises the kernels
    jf = jax.jit(run, compiler_options={"xla_backend_optimization_level": 0})
    rows = []
    for i, feed in enumerate(feeds):
        ours = jaxops.refresh(jf(*feed.values()), allow_truncated=True)
        theirs = results[i]
        for name, a, b in zip(names, ours, theirs):
            a, b = np.asarray(a), np.asarray(b)
            if a.shape != b.shape:
                rows.append((i, name, ops[name], False, f"shape {a.shape} vs {b.shape}"))
            elif b.dtype.kind == "f":
                scale = float(np.max(np.abs(b), initial=1.0, where=np.isfinite(b)))
                ok = np.allclose(a, b, rtol=rtol, atol=atol * scale, equal_nan=True)
                rows.append((i, name, ops[name], ok,
                             "" if ok else f"max diff {np.nanmax(np.abs(a - b)):.3g}"))
            else:
                ok = np.array_equal(a.astype(b.dtype), b)
                rows.append((i, name, ops[name], ok, "" if ok else
                             f"{int(np.sum(a.astype(b.dtype) != b))} of {b.size} differ"))
    return len(traces), rows, dict(zip(range(len(feeds)), [dict(zip(names, r)) for r in results]))


if __name__ == "__main__":
    import onnx

    model = onnx.load(sys.argv[1])
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    feeds = [{model.graph.input[0].name: np.random.RandomState(s).rand(*dims).astype(np.float32)}
             for s in range(int(sys.argv[2]) if len(sys.argv) > 2 else 2)]
    compiles, rows, _ = compare(model, feeds)
    bad = [r for r in rows if not r[3]]
    print(f"compiles {compiles}, values {len(rows)}, mismatches {len(bad)}")
    for r in bad[:15]:
        print(r)
