"""ONNX's backend node test cases (``onnx.backend.test.case.node``) for the ops
jaxops.onnx supports: which cases apply, how a case is run under jit, and when a refusal
is the expected answer (x64 off and a 64-bit value that 32 bits cannot hold)."""

from __future__ import annotations

import functools

import jax
import ml_dtypes
import numpy as np

_BF16 = np.dtype(ml_dtypes.bfloat16)


@functools.lru_cache(maxsize=1)
def _all_cases() -> dict:
    import warnings

    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return {c.name: c for c in collect_testcases() if c.kind == "node"}


@functools.lru_cache(maxsize=1)
def cases() -> dict:
    """Every node case whose ops (subgraphs included) all have handlers, by name."""
    from jaxops.onnx import supported_ops

    ops = set(supported_ops())
    return {name: c for name, c in _all_cases().items() if _ops(c.model.graph) <= ops
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


#: Input positions that say a shape, axes, sizes, counts or a mode: in a model they are
#: constants (or computed from shapes); the backend cases feed them as graph inputs, so the
#: harness makes them initializers, as a model would hold them (one load per value). An
#: ``_expanded`` case (the op's function body inlined) takes the same inputs as constants
#: as the op's own case: ``HannWindow``'s size, ``AffineGrid``'s, ``Range``'s bounds.
SHAPE_INPUTS = {
    "Dropout": {1, 2}, "HannWindow": {0}, "HammingWindow": {0},
    "BlackmanWindow": {0}, "AffineGrid": {1}, "Loop": {0, 1},
    "Reshape": {1}, "Expand": {1}, "Tile": {1}, "Slice": {1, 2, 3, 4}, "Squeeze": {1},
    "Unsqueeze": {1}, "Split": {1}, "TopK": {1}, "Resize": {1, 2, 3}, "Upsample": {1},
    "ConstantOfShape": {0}, "Pad": {1, 2, 3}, "CumSum": {1}, "Range": {0, 1, 2},
    "OneHot": {1}, "NonMaxSuppression": {2, 3, 4}, "Trilu": {1}, "CenterCropPad": {1},
    **{op: {1} for op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd",
                          "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSum",
                          "ReduceLogSumExp")},
}


def static_inputs(case) -> set[str]:
    """The graph inputs that feed a shape-like input position (:data:`SHAPE_INPUTS`), of the
    case or, for an ``_expanded`` case, of the op's own case."""
    model = case.model
    if case.name.endswith("_expanded") and case.name[:-len("_expanded")] in _all_cases():
        model = _all_cases()[case.name[:-len("_expanded")]].model
    names = {v.name for v in model.graph.input}
    return {name for n in model.graph.node for k, name in enumerate(n.input)
            if name in names and k in SHAPE_INPUTS.get(n.op_type, ())}


def model_with_constants(model, values: dict):
    """A copy of ``model`` whose graph inputs named in ``values`` are initializers."""
    import onnx
    from onnx import numpy_helper

    out = onnx.ModelProto()
    out.CopyFrom(model)
    keep = [v for v in out.graph.input if v.name not in values]
    del out.graph.input[:]
    out.graph.input.extend(keep)
    out.graph.initializer.extend(numpy_helper.from_array(np.asarray(v), n)
                                 for n, v in values.items())
    return out


def _array(v):
    """A data set's value as numpy (special types come as TensorProtos)."""
    from onnx import TensorProto, numpy_helper

    return numpy_helper.to_array(v) if isinstance(v, TensorProto) else v


def load(case):
    """Loads ``case``'s model once per data set, its shape-like inputs made constants:
    ``[(program, traced inputs, expected outputs)]``. A model jaxops.onnx refuses raises
    here, at load."""
    import jaxops.onnx

    static = static_inputs(case)
    inits = {t.name for t in case.model.graph.initializer}
    names = [v.name for v in case.model.graph.input if v.name not in inits]
    runs = []
    for inputs, expected in case.data_sets:
        inputs, expected = [_array(v) for v in inputs], [_array(v) for v in expected]
        fixed = {n: v for n, v in zip(names, inputs) if n in static}
        program = jaxops.onnx.load(model_with_constants(case.model, fixed) if fixed
                                   else case.model)
        runs.append((program, [v for n, v in zip(names, inputs) if n not in static], expected))
    return runs


def run(case, runs=None):
    """Runs every data set of ``case`` under jit (``runs``: from :func:`load`); raises
    AssertionError on a mismatch."""
    import jaxops

    for program, traced, expected in runs if runs is not None else load(case):
        program.check_inputs(*traced)  # jit would narrow a 64-bit input before we see it
        check(case, jaxops.refresh(jax.jit(program)(*traced)), expected)


def run_many(names) -> dict:
    """Runs the cases ``names`` as :func:`run` does, but every program in one jitted
    function (one trace, one compile, one run: a compile per case costs more than the case);
    ``{name: None (passed) or the exception it raised}``. A case that fails to load, to
    check its inputs or to trace fails alone; should the shared compile itself fail, each
    case runs on its own."""
    import jaxops

    found, runs = {}, {}
    for name in names:
        try:
            runs[name] = load(cases()[name])
            for program, traced, _ in runs[name]:
                program.check_inputs(*traced)
        except Exception as e:  # noqa: BLE001 (reported to the case's test)
            found[name] = e
            runs.pop(name, None)

    def every(feeds):
        outs = {}
        for name, data in feeds.items():
            try:
                outs[name] = [program(*traced) for (program, _, _), traced in
                              zip(runs[name], data)]
            except Exception as e:  # noqa: BLE001
                found[name] = e
        return outs
    feeds = {name: [traced for _, traced, _ in r] for name, r in runs.items()}
    try:
        got = jaxops.refresh(jax.jit(every)(feeds))
    except Exception:  # noqa: BLE001 (a compile error: isolate it)
        for name in runs:
            found[name] = _outcome(run, cases()[name], runs[name])
        return found
    for name, outs in got.items():
        found[name] = _outcome(lambda case, r: [check(case, g, e) for g, (_, _, e)
                                                in zip(outs, r)], cases()[name], runs[name])
    return found


def _outcome(fn, *args):
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001
        return e
    return None


def check(case, got, expected) -> None:
    """Raises AssertionError where ``got`` differs from ``expected`` beyond the case's
    tolerance."""
    for k, (a, b) in enumerate(zip(got, expected)):
        a, b = np.asarray(a), np.asarray(b)
        assert a.shape == b.shape, f"output {k}: shape {a.shape}, expected {b.shape}"
        if b.dtype.kind == "V" and b.dtype != _BF16:  # float8, float4, int4, int2: exact
            np.testing.assert_array_equal(a.astype(np.float32), b.astype(np.float32),
                                          err_msg=f"output {k}")
        elif b.dtype == _BF16:  # 8 bits of mantissa (eps 2**-7): the expected values come
            # from numpy rounding every step to bfloat16 (a matmul accumulates in it), XLA
            # keeps a fusion's intermediates in float32; 2 eps apart at most
            np.testing.assert_allclose(a.astype(np.float32), b.astype(np.float32),
                                       rtol=2.0 ** -6, atol=max(case.atol, 1e-6),
                                       equal_nan=True, err_msg=f"output {k}")
        elif b.dtype.kind in "fc":
            np.testing.assert_allclose(a.astype(b.dtype), b, rtol=max(case.rtol, 1e-5),
                                       atol=max(case.atol, 1e-6), equal_nan=True,
                                       err_msg=f"output {k}")
        else:
            np.testing.assert_array_equal(a.astype(b.dtype), b, err_msg=f"output {k}")
