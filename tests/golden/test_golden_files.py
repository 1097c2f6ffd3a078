"""Issue 40: golden cases an Ascend developer can use: the aclnn contracts, their own
inputs, raw files, the comparator, and the same files with x64 off and on."""

import json
import os
import re
import subprocess
import sys

import jax
import ml_dtypes
import numpy as np
import pytest

from jaxops import cli, golden
from jaxops.core.errors import OpArgumentError
from jaxops.golden.generators import Generation


def _case(path):
    return golden.load_case(path)


def test_aclnn_nms_blocks_pad_with_minus_one_and_keep_int32(tmp_path):
    """aclnnNonMaxSuppression: [B*C*M, 3] INT32, block b*C+c holds that class's selected
    rows then -1 rows; no shape tensor (ops-cv + the TBE kernel's filter_score_compute)."""
    path = golden.write_case("NonMaxSuppression", 1, tmp_path / "n.npz", {
        "max_output_boxes_per_class": 25, "score_threshold": 0.5}, shape=(2, 3, 40))
    case = _case(path)
    rows = case["arrays"]["output_selected_indices"]
    assert rows.dtype == np.int32 and rows.shape == (2 * 3 * 25, 3) and "outshape" not in case["arrays"]
    assert case["outshape"] is None and "actual_shape" not in case["outputs"][0]
    blocks = rows.reshape(2, 3, 25, 3)
    for b in range(2):
        for c in range(3):
            block = blocks[b, c]
            kept = block[block[:, 0] >= 0]
            assert (block[len(kept):] == -1).all() and 0 < len(kept) < 25  # selected, then -1
            assert (kept[:, 0] == b).all() and (kept[:, 1] == c).all()
            scores = case["arrays"]["input_scores"][b, c, kept[:, 2]]
            assert (np.diff(scores) <= 0).all() and (scores > 0.5).all()
    onnx = _case(golden.write_case("NonMaxSuppression", 1, tmp_path / "o.npz", {
        "max_output_boxes_per_class": 25, "score_threshold": 0.5}, shape=(2, 3, 40),
        contract="onnx"))["arrays"]["output_selected_indices"]
    np.testing.assert_array_equal(rows[rows[:, 0] >= 0], onnx)  # the same selection, compacted
    assert onnx.dtype == np.int64
    assert golden.check_case(path)


@pytest.mark.parametrize("attrs, inputs, fragment", [
    ({"max_output_boxes_per_class": 700}, None, None),  # the limit itself is accepted
    ({"max_output_boxes_per_class": 701}, None, r"\[0, 700\]"),
    ({"score_threshold": None}, None, "scoreThreshold"),
    ({}, "unordered", "y1 <= y2 and x1 <= x2"),
    ({}, "nan", "finite values"),
    ({}, "float64", "float16 or float32"),
])
def test_aclnn_nms_refuses_what_the_kernel_does_not_define(attrs, inputs, fragment, tmp_path):
    boxes = np.array([[[0, 0, 1, 1], [0, 0, 2, 2]]], np.float32)
    scores = np.array([[[0.9, 0.8]]], np.float32)
    if inputs == "unordered":
        boxes[0, 1] = [2, 0, 0, 2]
    elif inputs == "nan":
        scores[0, 0, 0] = np.nan
    elif inputs == "float64":
        boxes, scores = boxes.astype(np.float64), scores.astype(np.float64)
    np.savez(tmp_path / "in.npz", boxes=boxes, scores=scores)
    call = lambda: golden.build_case("NonMaxSuppression", attrs=attrs, input_path=tmp_path / "in.npz")
    if fragment is None:
        arrays, _ = call()
        assert arrays["output_selected_indices"].shape == (700, 3)
    else:
        with pytest.raises(OpArgumentError, match=fragment):
            call()


@pytest.mark.parametrize("op, dtype", [("Unique", "int8"), ("UniqueConsecutive", "uint8"),
                                       ("MaskedSelect", "int32"), ("MaskedSelect", "float16")])
def test_values_keep_the_input_dtype(op, dtype, tmp_path):
    """aclnnUnique2's valueOut, aclnnUniqueConsecutive's and aclnnMaskedSelect's out are in
    self's dtype (issue 40: an int32 input gave int64 values)."""
    case = _case(golden.write_case(op, 0, tmp_path / "c.npz", dtype=dtype))
    assert case["arrays"]["output_y"].dtype == np.dtype(dtype)
    assert case["outputs"][0]["dtype"]["cann_code"] == case["inputs"][0]["dtype"]["cann_code"]
    assert all(case["arrays"][f"output_{o['name']}"].dtype == np.int64
               for o in case["outputs"][1:])


def test_nonzero_contracts_name_cann_s_transpose(tmp_path):
    v2 = _case(golden.write_case("NonZero", 0, tmp_path / "a.npz"))
    v1 = _case(golden.write_case("NonZero", 0, tmp_path / "b.npz", {"transpose": True}))
    assert (v2["contract"]["name"], v2["contract"]["cann_attrs"]["transpose"]) == ("aclnnNonzeroV2", True)
    assert (v1["contract"]["name"], v1["contract"]["cann_attrs"]["transpose"]) == ("aclnnNonzero", False)
    np.testing.assert_array_equal(v1["arrays"]["output_y"], v2["arrays"]["output_y"].T)
    x = v2["arrays"]["input_x"]
    np.testing.assert_array_equal(v2["arrays"]["output_y"], np.stack(np.nonzero(x)))  # y, not y[:, :n]
    buffer = golden.max_shape_buffer(v2, "y")
    assert buffer.shape == (3, x.size) and (buffer.reshape(-1)[v2["arrays"]["output_y"].size:] == -1).all()


def test_bin_files_and_their_description_are_what_a_harness_reads(tmp_path):
    path = golden.write_case("MaskedSelect", 3, tmp_path / "m.npz", dtype="bfloat16", bin=True)
    with open(tmp_path / "m.json") as f:
        desc = json.load(f)
    x_desc, y_desc = desc["inputs"][0], desc["outputs"][0]
    assert x_desc["dtype"] == {"numpy": "bfloat16", "cann": "BF16", "cann_code": 27, "stored_as": "uint16"}
    raw = np.fromfile(tmp_path / x_desc["bin"], "<u2").view(ml_dtypes.bfloat16).reshape(x_desc["shape"])
    with np.load(path) as z:  # plain numpy + ml_dtypes read the .npz too
        np.testing.assert_array_equal(z["input_x"].view(ml_dtypes.bfloat16), raw)
        mask = z["input_mask"]
    y = np.fromfile(tmp_path / y_desc["bin"], "<u2").view(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(y, raw[mask])
    buffer = np.fromfile(tmp_path / y_desc["buffer_bin"], "<u2").view(ml_dtypes.bfloat16)
    assert buffer.size == int(np.prod(y_desc["max_shape"])) and (buffer[:y.size] == y).all()
    assert (buffer[y.size:] == 0).all() and y_desc["actual_shape"] == [y.size]
    words = np.fromfile(tmp_path / desc["outshape"]["bin"], "<i8")
    assert words.tolist() == desc["outshape"]["words"] and words[0] == 0x80000001 and words[1] == y.size


def test_existing_files_are_not_overwritten_without_force(tmp_path):
    path = golden.write_case("NonZero", 0, tmp_path / "c.npz")
    before = os.path.getmtime(path)
    for existing in (path, tmp_path / "c.npz"):
        with pytest.raises(OpArgumentError, match="--force"):
            golden.write_case("NonZero", 1, existing)
    (tmp_path / "d").mkdir()  # the .bin folder counts too
    with pytest.raises(OpArgumentError, match="--force"):
        golden.write_case("NonZero", 1, tmp_path / "d.npz", bin=True)
    assert os.path.getmtime(path) == before
    golden.write_case("NonZero", 1, path, force=True)
    assert _case(path)["seed"] == 1


def test_the_developers_own_inputs(tmp_path):
    x = np.array([[0, 2.5, -0.0], [np.nan, 0, 1e-45]], np.float32)
    np.savez(tmp_path / "x.npz", x=x)
    x.tofile(tmp_path / "x.bin")
    from_npz = _case(golden.write_case("NonZero", 0, tmp_path / "a.npz", input_path=tmp_path / "x.npz"))
    from_bin = _case(golden.write_case("NonZero", 0, tmp_path / "b.npz", shape=(2, 3),
                                       dtype="float32", input_path=tmp_path / "x.bin"))
    for case in (from_npz, from_bin):
        assert case["seed"] is None and case["input_file"].startswith("x.")
        assert case["arrays"]["output_y"].tolist() == [[0, 1, 1], [1, 0, 2]]  # NaN, subnormal
    back = golden.write_case("NonZero", 0, tmp_path / "c.npz", bin=True,
                             input_path=tmp_path / "a.npz")  # a case fed back
    again = golden.write_case("NonZero", 0, tmp_path / "e.npz", input_path=tmp_path / "c.json")
    np.testing.assert_array_equal(_case(again)["arrays"]["input_x"], x)
    assert golden.check_case(back) and golden.check_case(again)
    np.savez(tmp_path / "wrong.npz", boxes=np.zeros((1, 2, 4), np.float32))
    with pytest.raises(OpArgumentError, match="without scores"):
        golden.build_case("NonMaxSuppression", input_path=tmp_path / "wrong.npz")
    with pytest.raises(OpArgumentError, match="--density/--special"):
        golden.build_case("NonZero", input_path=tmp_path / "x.npz", generation=Generation(0.5))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "int8", "uint16", "bool"])
def test_generators_reach_every_density_and_special_value(dtype):
    none = golden.build_case("NonZero", 0, shape=(50,), dtype=dtype, generation=Generation(0.0))[0]
    every = golden.build_case("NonZero", 0, shape=(50,), dtype=dtype, generation=Generation(1.0))[0]
    assert none["output_y"].shape == (1, 0) and every["output_y"].shape == (1, 50)
    if dtype == "bool":
        return
    kinds = ("all",)
    x = golden.build_case("NonZero", 0, shape=(400,), dtype=dtype,
                          generation=Generation(0.5, kinds))[0]["input_x"]
    wide = x.astype(np.float64)
    if np.dtype(x.dtype).kind == "u" or dtype == "int8":
        info = np.iinfo(dtype)
        assert wide.max() == info.max and wide.min() == info.min
        return
    info = ml_dtypes.finfo(x.dtype)
    assert np.isnan(wide).any() and np.isposinf(wide).any() and np.isneginf(wide).any()
    zeros = wide[wide == 0]
    assert np.signbit(zeros).any() and (~np.signbit(zeros)).any()
    tiny = np.abs(wide[np.isfinite(wide)])
    assert ((tiny > 0) & (tiny < float(info.smallest_normal))).any()
    assert float(info.max) in wide and float(info.smallest_subnormal) in tiny


def _compare(argv, capsys):
    code = cli.main(["golden", "compare", *argv])
    return code, capsys.readouterr().out


def test_compare_is_exact_for_indices_and_reports_where(tmp_path, capsys):
    path = golden.write_case("NonZero", 0, tmp_path / "g.npz", bin=True)
    code, out = _compare([str(path), str(tmp_path / "g")], capsys)  # the golden's own .bin
    assert code == 0 and out.rstrip().endswith("PASS") and "[exact]" in out
    y = _case(path)["arrays"]["output_y"]
    buffer = golden.max_shape_buffer(_case(path), "y").copy()
    buffer.reshape(-1)[y.size:] = 12345  # what a kernel leaves after the data: not compared
    np.savez(tmp_path / "npu.npz", y=buffer)
    assert _compare([str(path), str(tmp_path / "npu.npz")], capsys)[0] == 0
    wrong = y.copy()
    wrong[1, 4] += 1
    np.savez(tmp_path / "npu.npz", output_y=wrong)
    code, out = _compare([str(path), str(tmp_path / "npu.npz")], capsys)
    assert code == 1 and "FAIL: 1 of" in out and f"at [1, 4]: golden {y[1, 4]}, actual {y[1, 4] + 1}" in out
    words = _case(path)["arrays"]["outshape"].copy()
    words[2] -= 1  # the NPU's OP_OUTSHAPE says one fewer
    np.savez(tmp_path / "npu.npz", y=buffer, outshape=words)
    code, out = _compare([str(path), str(tmp_path / "npu.npz")], capsys)
    assert code == 1 and "the NPU's OP_OUTSHAPE says" in out
    np.savez(tmp_path / "npu.npz", y=y.astype(np.int32))
    code, out = _compare([str(path), str(tmp_path / "npu.npz"), "--json"], capsys)
    report = json.loads(out)
    assert code == 1 and not report["passed"] and "dtype int32" in report["outputs"][0]["verdict"]


@pytest.mark.parametrize("dtype, t", [("float16", 2**-10), ("bfloat16", 2**-7), ("float32", 2**-13)])
def test_compare_follows_cann_s_precision_standard(dtype, t, tmp_path, capsys):
    """MERE < T and MARE < 10 T (opbase experimental_standard.md), per dtype."""
    path = golden.write_case("MaskedSelect", 0, tmp_path / "g.npz", dtype=dtype,
                             shape=(32, 32), generation=Generation(special=("nan", "inf")))
    y = _case(path)["arrays"]["output_y"]
    finite = np.isfinite(y.astype(np.float64))
    off = y.astype(np.float64)
    off[np.flatnonzero(finite)[0]] *= 1 + 5 * t  # one element 5 T off: MARE < 10 T, MERE tiny
    np.savez(tmp_path / "npu.npz", y=off.astype(y.dtype).view(np.uint16) if dtype == "bfloat16"
             else off.astype(y.dtype))
    code, out = _compare([str(path), str(tmp_path / "npu.npz")], capsys)
    assert code == 0 and f"T = 2^{int(np.log2(t))}" in out
    off[np.flatnonzero(finite)[0]] = y.astype(np.float64)[np.flatnonzero(finite)[0]] * (1 + 20 * t)
    np.savez(tmp_path / "npu.npz", y=off.astype(y.dtype))
    assert _compare([str(path), str(tmp_path / "npu.npz")], capsys)[0] == 1  # MARE > 10 T
    nan_lost = y.copy()
    nan_lost[np.isnan(y.astype(np.float64))] = 0
    np.savez(tmp_path / "npu.npz", y=nan_lost)
    code, out = _compare([str(path), str(tmp_path / "npu.npz")], capsys)
    assert code == 1 and "golden nan" in out


def test_check_refuses_a_mode_its_reference_does_not_model(tmp_path):
    path = golden.write_case("NonMaxSuppression", 0, tmp_path / "n.npz", contract="onnx",
                             impl_mode="high_performance")
    assert golden.check_case(path)  # modelled: float32 keys with their low bits cleared
    case = _case(path)
    description = {k: v for k, v in case.items() if k != "arrays"}
    description["impl_mode"] = {"name": "keep_fp16", "value": 128}
    np.savez(path, **case["arrays"], description=np.frombuffer(json.dumps(description).encode(), np.uint8))
    with pytest.raises(OpArgumentError, match="the modes its reference models"):
        golden.check_case(path)


_X64_CASES = [("NonZero", {}), ("Unique", {"dtype": "int32"}), ("UniqueConsecutive", {}),
              ("MaskedSelect", {"dtype": "float64"}), ("NonMaxSuppression", {}),
              ("NonMaxSuppression", {"contract": "onnx"}), ("BatchedNMS", {}),
              ("EfficientNMS", {})]


def _write_x64_cases(folder: str) -> None:
    for op, kw in _X64_CASES:
        golden.write_case(op, 2, f"{folder}/{op}{len(kw)}{kw.get('contract', '')}.npz", **kw)


_X64_SCRIPT = f"""
import sys, jax
jax.config.update("jax_enable_x64", sys.argv[2] == "on")
from jaxops import golden
for op, kw in {_X64_CASES!r}:
    golden.write_case(op, 2, f"{{sys.argv[1]}}/{{op}}{{len(kw)}}{{kw.get('contract', '')}}.npz", **kw)
"""


@pytest.mark.x64_off
def test_files_are_the_same_with_x64_off_and_on(tmp_path):
    """x64 off here (the suite's setting, already compiled), on in a fresh process."""
    for mode in ("off", "on"):
        (tmp_path / mode).mkdir()
    assert not jax.config.jax_enable_x64
    _write_x64_cases(str(tmp_path / "off"))
    done = subprocess.run([sys.executable, "-c", _X64_SCRIPT, str(tmp_path / "on"), "on"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    names = sorted(os.listdir(tmp_path / "off"))
    assert names == sorted(os.listdir(tmp_path / "on")) and len(names) == 16
    for name in names:
        assert (tmp_path / "off" / name).read_bytes() == (tmp_path / "on" / name).read_bytes(), name


def test_the_docs_commands_are_ones_the_cli_takes():
    """Every ``jaxops golden ...`` line of docs/golden.md, README and ARCHITECTURE parses
    (issue 40: ARCHITECTURE documented a golden --check that did not exist)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parser = cli.build_parser()
    golden_flags = {a for action in parser._subparsers._group_actions[0].choices["golden"]._actions
                    for a in action.option_strings}
    seen = 0
    for doc in ("docs/golden.md", "README.md", "docs/ARCHITECTURE.md"):
        with open(os.path.join(root, doc)) as f:
            text = f.read()
        for line in re.findall(r"jaxops golden[^\n`|]*", text):
            words = line.split("#")[0].split()[2:]
            flags = [w for w in words if w.startswith("--")]
            if not words or words[0] in ("check", "compare", "OP", "Op"):
                seen += 1
                continue
            op = words[0]
            if op.startswith("-"):
                assert set(flags) <= golden_flags, (doc, line)
                continue
            from jaxops.core.registry import get_op
            known = golden_flags | {f"--{a.name}" for a in get_op(op).attrs} | {"--ATTR"}
            assert set(flags) <= known, (doc, line, set(flags) - known)
            seen += 1
    assert seen >= 10
