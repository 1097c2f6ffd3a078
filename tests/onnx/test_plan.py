"""Capacities from statistics for a whole model (jaxops.onnx.calibrate, CapacityPlan): a
plan round-trips through its file, follows the 3-sigma rule (or a quantile) under the
bound, and a plan exceeded on purpose never loses results silently: inside jit the report
names the tensor and the loss, outside jit each policy expands, warns or raises. One
compile per input shape."""

import warnings

import jax
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

import jaxops  # noqa: E402
import jaxops.onnx  # noqa: E402
from jaxops.errors import (CapacityOverflowError, CapacityOverflowWarning,  # noqa: E402
                           OpArgumentError)
from onnx import TensorProto as T, helper  # noqa: E402

N = 64


def _model():
    """x[64] -> the values above 0.5 (NonZero, GatherND) -> their sum; and a Compress of
    x by x < -0.5 (a second planned tensor)."""
    nodes = [helper.make_node("Greater", ["x", "half"], ["pos"]),
             helper.make_node("NonZero", ["pos"], ["idx"]),
             helper.make_node("Transpose", ["idx"], ["idx_t"]),
             helper.make_node("GatherND", ["x", "idx_t"], ["vals"]),
             helper.make_node("ReduceSum", ["vals"], ["total"], keepdims=0),
             helper.make_node("Less", ["x", "minus_half"], ["neg"]),
             helper.make_node("Compress", ["x", "neg"], ["low"], axis=0)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [N])],
                          [helper.make_tensor_value_info("vals", T.FLOAT, ["n"]),
                           helper.make_tensor_value_info("total", T.FLOAT, []),
                           helper.make_tensor_value_info("low", T.FLOAT, ["m"])],
                          [helper.make_tensor("half", T.FLOAT, [], [0.5]),
                           helper.make_tensor("minus_half", T.FLOAT, [], [-0.5])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _sample(rng, high=6, low=3):
    """An input with ``high`` values above 0.5 and ``low`` below -0.5."""
    x = rng.uniform(-0.4, 0.4, N).astype(np.float32)
    where = rng.permutation(N)
    x[where[:high]] = rng.uniform(0.6, 1.0, high)
    x[where[high:high + low]] = rng.uniform(-1.0, -0.6, low)
    return x


def _reference(x):
    return x[x > 0.5], x[x > 0.5].sum(), x[x < -0.5]


def _check(outs, x):
    vals, total, low = jaxops.refresh(outs)
    want = _reference(x)
    np.testing.assert_array_equal(vals, want[0])
    np.testing.assert_allclose(total, want[1], rtol=1e-6)
    np.testing.assert_array_equal(low, want[2])


@pytest.fixture(scope="module")
def calibrated():
    rng = np.random.default_rng(0)
    highs = [5, 6, 7, 6, 5, 8, 6, 7]
    samples = [(_sample(rng, h, 3),) for h in highs]
    return jaxops.onnx.calibrate(_model(), samples), highs


def test_the_plan_follows_three_sigma_under_the_bound_and_round_trips(calibrated, tmp_path):
    plan, highs = calibrated
    idx = plan.entries["idx"]
    assert (idx.op, idx.bound, idx.sizes) == ("NonZero", N, highs)
    want = int(np.ceil(np.mean(highs) + 3 * np.std(highs)))
    assert idx.capacity == -(-want // 8) * 8  # rounded up to a multiple of 8
    assert plan.entries["low"].capacity == 8 and plan.entries["low"].bound == N
    wide = jaxops.onnx.calibrate(_model(), [(_sample(np.random.default_rng(1), h),)
                                            for h in (2, 60)], round_to=None)
    assert wide.entries["idx"].capacity == N  # mean + 3 sigma is past the bound: the bound
    quant = jaxops.onnx.calibrate(_model(), [(_sample(np.random.default_rng(2), h),)
                                             for h in range(1, 11)], policy="quantile",
                                  q=0.5, round_to=None)
    assert quant.entries["idx"].capacity == 6  # the median of 1..10 (5.5), rounded up
    path = tmp_path / "model.plan.json"
    plan.save(path)
    again = jaxops.onnx.CapacityPlan.load(path)
    assert again.capacities == plan.capacities and again.rule == plan.rule
    assert {n: e.sizes for n, e in again.entries.items()} == \
        {n: e.sizes for n, e in plan.entries.items()}
    text = again.report(file=None)
    assert "idx" in text and "total" in text.splitlines()[-1]
    (tmp_path / "bad.json").write_text('{"format": "something else"}')
    with pytest.raises(OpArgumentError, match="bad.json"):
        jaxops.onnx.CapacityPlan.load(tmp_path / "bad.json")


@pytest.mark.parametrize("x64", [False, True], ids=["x64_off", "x64_on"])
def test_under_the_plan_one_compile_and_overflow_visible_inside_jit(calibrated, x64):
    plan, _ = calibrated
    cap = plan.capacities["idx"]
    rng = np.random.default_rng(3)
    with jax.enable_x64(x64):
        program = jaxops.onnx.load(_model(), capacities=plan)
        traces = []

        def run(x):
            traces.append(1)
            return program.sized(x)
        fn = jax.jit(run)
        for high in (4, cap, 7):  # within the plan: exact results, nothing lost
            x = _sample(rng, high)
            outs, report = fn(x)
            _check(outs, x)
            assert int(report.overflowed()) == 0 and int(report.lost()["idx"]) == 0
        x = _sample(rng, cap + 9)  # past the plan, on purpose
        outs, report = fn(x)
        assert len(traces) == 1
        assert bool(report.overflowed())
        assert {n: int(v) for n, v in report.lost().items()} == {"idx": 9, "low": 0}
        assert report.cut() == {"idx": (cap, cap + 9)}
        assert bool(outs[0].overflowed())  # and the values downstream say so
        row = 8 if x64 else 4  # NonZero's [1, n] int64 (int32 with x64 off) per result
        table = report.table(file=None).splitlines()
        assert table[2].split()[:6] == ["idx", "NonZero", str(cap), str(N), str(cap + 9), "9"]
        total = (cap * row + plan.capacities["low"] * 4) / 2 ** 20
        assert table[-1].split()[1] == f"{total:.2f}"


def test_an_exceeded_plan_outside_jit_expands_warns_or_raises(calibrated):
    plan, _ = calibrated
    cap = plan.capacities["idx"]
    rng = np.random.default_rng(4)
    within, past = _sample(rng, 5), _sample(rng, cap + 20, low=12)
    program = jaxops.onnx.load(_model(), capacities=plan)  # overflow="expand"
    _check(program(within), within)
    again = _sample(rng, 6)
    _check(program(again), again)
    assert program.compiles == 1
    _check(program(past), past)  # both tensors rerun at their bound: nothing lost
    assert program.compiles == 2
    _check(program(past), past)
    assert program.compiles == 2  # the expanded program is kept

    truncating = jaxops.onnx.load(_model(), capacities=plan, overflow="truncate")
    jaxops.capacity.reset_warnings()
    with pytest.warns(CapacityOverflowWarning, match="idx"):
        vals, _, low = truncating(past)
    assert vals.overflowed() and vals.lost(axis=0) == 20 and low.overflowed()
    assert truncating.compiles == 1

    raising = jaxops.onnx.load(_model(), capacities=plan, overflow="error")
    with pytest.raises(CapacityOverflowError, match="'idx'"):
        raising(past)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _check(raising(within), within)
    with pytest.raises(OpArgumentError, match="overflow"):
        jaxops.onnx.load(_model(), capacities=plan, overflow="host")


def test_an_overflow_crosses_an_if_on_a_traced_condition():
    """A cut tensor through both branches of an If whose condition is traced: the loss
    carries on (found in a full-size SSDlite under a plan)."""
    branch = lambda name: helper.make_graph(  # noqa: E731
        [helper.make_node("Identity", ["idx"], [name])], name, [],
        [helper.make_tensor_value_info(name, T.INT64, [1, "n"])])
    nodes = [helper.make_node("Greater", ["x", "half"], ["pos"]),
             helper.make_node("NonZero", ["pos"], ["idx"]),
             helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "half"], ["c"]),
             helper.make_node("If", ["c"], ["r"], then_branch=branch("a"),
                              else_branch=branch("b"))]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [N])],
                          [helper.make_tensor_value_info("r", T.INT64, [1, "n"])],
                          [helper.make_tensor("half", T.FLOAT, [], [0.5])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    program = jaxops.onnx.load(model, capacities={"idx": 4})
    (r,) = jax.jit(program)(_sample(np.random.default_rng(6), 10))
    assert r.max_shape == (1, 4) and bool(r.overflowed()) and int(r.lost()) >= 6  # a bound
