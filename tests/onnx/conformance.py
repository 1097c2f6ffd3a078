"""ONNX's backend node test cases (``onnx.backend.test.case.node``) for the ops
jaxops.onnx supports: which cases apply, how a case is run under jit, and when a refusal
is the expected answer (x64 off and a 64-bit value that 32 bits cannot hold)."""

from __future__ import annotations

import functools

import jax
import numpy as np


@functools.lru_cache(maxsize=1)
def cases() -> dict:
    """Every node case whose ops (subgraphs included) all have handlers, by name."""
    import warnings

    from onnx.backend.test.case.node import collect_testcases

    from jaxops.onnx import supported_ops

    ops = set(supported_ops())
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        found = collect_testcases()
    return {c.name: c for c in found if c.kind == "node" and _ops(c.model.graph) <= ops
            and _default_domain(c.model)}


def _ops(graph) -> set:
    found = set()
    for n in graph.node:
        found.add(n.op_type)
        for a in n.attribute:
            for g in ([a.g] if a.type == a.GRAPH else list(a.graphs)):
                found |= _ops(g)
    return found


def _default_domain(model) -> bool:
    return all(n.domain in ("", "ai.onnx") for n in model.graph.node)


def _wide(values) -> bool:
    """Whether a 64-bit value would change in 32 bits (what x64 off must refuse)."""
    for v in values:
        v = np.asarray(v)
        if v.dtype.itemsize == 8 and v.dtype.kind in "iuf" and v.size:
            narrow = v.astype(np.int32 if v.dtype.kind == "i" else np.uint32 if v.dtype.kind == "u"
                              else np.float32)
            with np.errstate(all="ignore"):
                if not np.array_equal(narrow.astype(v.dtype), v, equal_nan=v.dtype.kind == "f"):
                    return True
    return False


def needs_x64(case) -> bool:
    """A case whose inputs, constants or expected outputs hold 64-bit values 32 bits
    cannot: with x64 off it is refused (inputs, constants) or cannot be computed."""
    from onnx import numpy_helper

    consts = [numpy_helper.to_array(t) for t in case.model.graph.initializer]
    for n in case.model.graph.node:
        for a in n.attribute:
            if a.type == a.TENSOR:
                consts.append(numpy_helper.to_array(a.t))
    return any(_wide([_array(v) for v in list(i) + list(o)] + consts)
               for i, o in case.data_sets)


#: Input positions that say a shape, axes, sizes or counts: in a model they are constants
#: (or computed from shapes); the backend cases feed them as graph inputs, so the harness
#: closes over them as constants, as a model would hold them (one compile per value).
SHAPE_INPUTS = {
    "Reshape": {1}, "Expand": {1}, "Tile": {1}, "Slice": {1, 2, 3, 4}, "Squeeze": {1},
    "Unsqueeze": {1}, "Split": {1}, "TopK": {1}, "Resize": {1, 2, 3}, "Upsample": {1},
    "ConstantOfShape": {0}, "Pad": {1, 2, 3}, "CumSum": {1}, "Range": {0, 1, 2},
    "OneHot": {1}, "NonMaxSuppression": {2, 3, 4}, "Trilu": {1}, "CenterCropPad": {1},
    **{op: {1} for op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd",
                          "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSum",
                          "ReduceLogSumExp")},
}


def static_inputs(model) -> set[str]:
    """The graph inputs that feed a shape-like input position (:data:`SHAPE_INPUTS`)."""
    names = {v.name for v in model.graph.input}
    return {name for n in model.graph.node for k, name in enumerate(n.input)
            if name in names and k in SHAPE_INPUTS.get(n.op_type, ())}


def _array(v):
    """A data set's value as numpy (special types come as TensorProtos)."""
    from onnx import TensorProto, numpy_helper

    return numpy_helper.to_array(v) if isinstance(v, TensorProto) else v


def run(case):
    """Runs every data set of ``case`` under jit; raises AssertionError on a mismatch."""
    import jaxops
    import jaxops.onnx

    program = jaxops.onnx.load(case.model)
    static = static_inputs(case.model)
    names = program.input_names
    for inputs, expected in case.data_sets:
        inputs, expected = [_array(v) for v in inputs], [_array(v) for v in expected]
        program.check_inputs(*inputs)  # jit would narrow a 64-bit input before we see it
        fixed = {n: v for n, v in zip(names, inputs) if n in static}
        traced = [v for n, v in zip(names, inputs) if n not in static]
        fn = jax.jit(lambda *xs: program(**fixed, **dict(zip(
            [n for n in names if n not in static], xs))))
        got = jaxops.refresh(fn(*traced))
        for k, (a, b) in enumerate(zip(got, expected)):
            a, b = np.asarray(a), np.asarray(b)
            assert a.shape == b.shape, f"output {k}: shape {a.shape}, expected {b.shape}"
            if b.dtype.kind in "fc":
                np.testing.assert_allclose(a.astype(b.dtype), b, rtol=max(case.rtol, 1e-5),
                                           atol=max(case.atol, 1e-6), equal_nan=True,
                                           err_msg=f"output {k}")
            else:
                np.testing.assert_array_equal(a.astype(b.dtype), b, err_msg=f"output {k}")
