"""The jaxops command line: ops, golden, demo, help and user errors."""

import json
import subprocess
import sys

import numpy as np
import pytest

from jaxops import cli, golden
from jaxops.core.errors import OpArgumentError


def run(argv, capsys):
    code = cli.main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_ops_lists_every_registered_operator(capsys):
    import jaxops
    code, out, _ = run(["ops"], capsys)
    assert code == 0
    for name in jaxops.list_ops():
        assert name in out
    assert "impl modes" in out and "backends" in out and "data-dependent" in out


def test_ops_one_and_json(capsys):
    code, out, _ = run(["ops", "NonMaxSuppression", "--json"], capsys)
    data = json.loads(out)
    assert code == 0 and data["name"] == "NonMaxSuppression" and data["data_dependent"] is True
    assert {a["name"] for a in data["attrs"]} >= {"max_output_boxes_per_class", "iou_threshold"}
    assert "xla" in data["backends"] and data["inputs"][0]["dtypes"]


def test_unknown_op_is_one_line_and_exit_2(capsys):
    code, out, err = run(["ops", "NonMaxSupression"], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "Did you mean: NonMaxSuppression" in err


def test_golden_list(capsys):
    code, out, _ = run(["golden", "--list"], capsys)
    assert code == 0 and "NonMaxSuppression" in out and "EmbeddingHashTableExport" in out


def test_golden_writes_deterministic_case(tmp_path, capsys):
    a, b = str(tmp_path / "a.npz"), str(tmp_path / "b.npz")
    for path in (a, b):
        code, out, _ = run(["golden", "NonMaxSuppression", "--seed", "7", "--out", path,
                            "--iou_threshold", "0.3", "--max_output_boxes_per_class", "5"], capsys)
        assert code == 0 and path in out
    ca, cb = golden.load_case(a), golden.load_case(b)
    assert ca["attrs"]["iou_threshold"] == 0.3 and ca["attrs"]["max_output_boxes_per_class"] == 5
    for k in ca["arrays"]:
        np.testing.assert_array_equal(ca["arrays"][k], cb["arrays"][k])
    with open(a[:-4] + ".json") as f:
        sidecar = json.load(f)
    assert sidecar["op"] == "NonMaxSuppression" and sidecar["impl_mode"]["name"] == "high_precision"
    assert golden.check_case(a)


def test_golden_out_directory_and_missing_directory(tmp_path, capsys):
    code, out, _ = run(["golden", "Unique", "--seed", "4", "--out", str(tmp_path)], capsys)
    written = tmp_path / "golden_Unique_seed4.npz"
    assert code == 0 and str(written) in out and written.exists()
    assert (tmp_path / "golden_Unique_seed4.json").exists()
    assert not (tmp_path.parent / f"{tmp_path.name}.npz").exists()  # not DIR.npz beside it
    missing = tmp_path / "missing" / "case.npz"
    code, out, err = run(["golden", "Unique", "--out", str(missing)], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1 and "existing directory" in err
    assert not missing.parent.exists()  # refused, not created (as ht.save refuses)


def test_golden_shape_and_dtype_choose_the_inputs(tmp_path, capsys):
    path = str(tmp_path / "ms.npz")
    code, _, _ = run(["golden", "MaskedSelect", "--shape", "3,5,2", "--dtype", "float16",
                      "--out", path], capsys)
    case = golden.load_case(path)
    x, mask = case["arrays"]["input_x"], case["arrays"]["input_mask"]
    assert code == 0 and x.shape == (3, 5, 2) and x.dtype == np.float16 and mask.shape == (3, 5, 2)
    assert case["input_shape"] == [3, 5, 2] and case["input_dtype"] == "float16"
    np.testing.assert_array_equal(case["arrays"]["output_y"], x[mask])  # numpy's answer, exactly
    assert golden.check_case(path)  # rebuilt with the recorded shape and dtype
    path = str(tmp_path / "nms.npz")
    run(["golden", "NonMaxSuppression", "--shape", "1,2,7", "--dtype", "bfloat16", "--out", path,
         "--contract", "onnx"], capsys)
    arrays = golden.load_case(path)["arrays"]
    assert arrays["input_boxes"].shape == (1, 7, 4) and str(arrays["input_scores"].dtype) == "bfloat16"


def test_ops_shows_fill_values_and_untyped_ports(capsys):
    code, out, _ = run(["ops", "Unique"], capsys)
    rows = {ln.split()[1]: ln for ln in out.splitlines() if ln.startswith("  output")}
    from jaxops.core.registry import get_op
    op = get_op("Unique")
    for k, p in enumerate(op.outputs):
        assert rows[p.name].endswith(f"; fill {op.fill_value(k)!r}")
    code, out, _ = run(["ops", "EmbeddingHashTableLookupOrInsert"], capsys)
    assert code == 0 and " any" not in out and "int64 keys, or uint64" in out
    data = json.loads(run(["ops", "Unique", "--json"], capsys)[1])
    assert [o["fill_value"] for o in data["outputs"]] == [0, -1, -1, 0]


def test_golden_other_seed_differs(tmp_path):
    a = golden.load_case(golden.write_case("NonMaxSuppression", 1, str(tmp_path / "1.npz")))
    b = golden.load_case(golden.write_case("NonMaxSuppression", 2, str(tmp_path / "2.npz")))
    assert not np.array_equal(a["arrays"]["input_boxes"], b["arrays"]["input_boxes"])


@pytest.mark.parametrize("argv, fragment", [
    (["golden", "NonMaxSuppression", "--iou_threshold", "2.5"], "iou_threshold"),
    (["golden", "NonMaxSuppression", "--iou_threshold", "high"], "iou_threshold"),
    (["golden", "NonMaxSuppression", "--no_such_attr", "1"], "no_such_attr"),
    (["golden", "NonMaxSuppression", "--center_point_box"], "a value after the flag"),
    (["golden", "NoSuchOp"], "unknown operator"),
    (["golden"], "name an operator"),
    (["golden", "NonZero", "--seed", "-5"], "argument 'seed': expected a non-negative int, got -5"),
    (["golden", "NonZero", "--shape", "3,a"], "argument 'shape'"),
    (["golden", "NonZero", "--shape", "-3"], "argument 'shape'"),
    (["golden", "NonMaxSuppression", "--shape", "3,4"], "expected 3 dims"),
    (["golden", "NonZero", "--dtype", "float99"], "argument 'dtype'"),
    (["golden", "BatchedNMS", "--dtype", "int32"], "BatchedNMS: argument 'boxes'"),
    (["golden", "EmbeddingHashTableExport", "--dtype", "int8"], "argument 'dtype': expected int64"),
    (["golden", "NonZero", "--trnaspose", "1"], "Did you mean transpose?"),
    # issue 40's small defects, each refused in one line
    (["golden", "NonZero", "--shape", "3x4"], "argument 'shape'"),
    (["golden", "NonZero", "--shape", "2,,3"], "argument 'shape'"),
    (["golden", "NonZero", "--shape", ""], "argument 'shape'"),
    (["golden", "NonZero", "--transpose", "yes"], "argument 'transpose': expected true or false"),
    (["golden", "NonZero", "--shape", "1,1,1,1,1,1,1,1,1"], "at most 8 dims"),
    (["golden", "NonMaxSuppression", "--max_output_boxes_per_class", "701"],
     "an int in [0, 700] (aclnnNonMaxSuppression refuses more)"),
    (["golden", "NonMaxSuppression", "--size", "4"], "Use --contract onnx"),
    (["golden", "NonZero", "--impl_mode", "fast"], "argument 'impl_mode'"),
    (["golden", "NonZero", "--contract", "onnx"], "argument 'contract'"),
    (["golden", "NonZero", "--density", "1.5"], "argument 'density'"),
    (["golden", "NonZero", "--dtype", "int8", "--special", "nan"], "argument 'special'"),
    (["golden", "EfficientNMS", "--density", "0.5"], "argument 'density'"),
])
def test_golden_user_errors(argv, fragment, capsys):
    code, _, err = run(argv, capsys)
    assert code == 2 and fragment in err and "Traceback" not in err and err.count("\n") == 1
    assert err.startswith("jaxops: error: ")


def test_golden_records_a_truncating_size(tmp_path, capsys):
    from jaxops.errors import CapacityOverflowWarning
    path = str(tmp_path / "nz.npz")
    with pytest.warns(CapacityOverflowWarning, match="NonZero"):
        code, _, _ = run(["golden", "NonZero", "--out", path, "--size", "1"], capsys)
    out = golden.load_case(path)["outputs"][0]
    assert code == 0 and out["overflowed"] and out["true_shape"][1] > out["actual_shape"][1] == 1
    (tmp_path / "file").write_text("")  # a file where a directory is needed
    code, _, err = run(["golden", "NonZero", "--out", str(tmp_path / "file" / "x.npz")], capsys)
    assert code == 2 and "error:" in err and "Traceback" not in err and err.count("\n") == 1


def test_golden_detects_a_tampered_case(tmp_path):
    path = golden.write_case("NonMaxSuppression", 0, str(tmp_path / "g.npz"), contract="onnx")
    case = golden.load_case(path)
    arrays = dict(case["arrays"])
    arrays["outshape"] = arrays["outshape"].copy()
    arrays["outshape"][1] += 1
    desc = {k: v for k, v in case.items() if k != "arrays"}
    np.savez(path, **arrays, description=np.frombuffer(json.dumps(desc).encode(), np.uint8))
    with pytest.raises(AssertionError, match="output selected_indices: OP_OUTSHAPE shape"):
        golden.check_case(path)


@pytest.mark.parametrize("command", [[], ["demo"], ["ops"]])
def test_help_everywhere(command):
    with pytest.raises(SystemExit) as e:
        cli.main(command + ["--help"])
    assert e.value.code == 0


def test_version(capsys):
    import jaxops
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"jaxops {jaxops.__version__}"


def test_golden_help_and_op_help_lists_its_attributes(capsys):
    code, out, _ = run(["golden", "--help"], capsys)
    assert code == 0 and "--seed" in out and "--shape" in out
    code, out, _ = run(["golden", "NonMaxSuppression", "--help"], capsys)
    assert code == 0 and "--shape is scores [batches, classes, boxes]" in out
    lines = {ln.split()[0]: ln for ln in out.splitlines() if ln.startswith("  --")}
    from jaxops.core.registry import get_op
    assert set(lines) == {f"--{a.name}" for a in get_op("NonMaxSuppression").attrs}
    # name, type, the case's default (10, not the OpDef's) and what it accepts
    assert "int" in lines["--max_output_boxes_per_class"] and "default 10;" in lines[
        "--max_output_boxes_per_class"] and "accepts an int >= 0" in lines["--max_output_boxes_per_class"]
    assert "accepts one of 0, 1" in lines["--center_point_box"]
    code, out, _ = run(["golden", "EmbeddingHashTableExport", "--help"], capsys)
    assert code == 0 and "--bucket_size" in out and "table_sizes [tables]" in out and "--export_mode" in out


@pytest.mark.parametrize("argv", [["ops", "--frobnicate"], ["demo", "--quick"]])
def test_bad_subcommand_arguments_exit_2(argv):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2


def test_demo(capsys):
    code, out, _ = run(["demo"], capsys)
    assert code == 0
    assert "kept" in out and "loss" in out and "occupancy" in out and "Summary" in out


def test_python_dash_m_entry_point(capsys):
    # The entry point in a real child, at a command that loads no JAX (--version: the child
    # costs ~0.2 s of CPU, not ~2 s); ``ops --json`` through the same main(), in-process.
    import jaxops
    res = subprocess.run([sys.executable, "-m", "jaxops", "--version"], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == f"jaxops {jaxops.__version__}"
    code, out, _ = run(["ops", "--json"], capsys)
    assert code == 0 and json.loads(out)


@pytest.mark.parametrize("op", ["BatchedNMS", "EfficientNMS"])
def test_golden_nms_variants(op, tmp_path):
    path = golden.write_case(op, 0, str(tmp_path / "n.npz"))
    case = golden.load_case(path)
    assert golden.check_case(path)
    if op == "BatchedNMS":  # some boxes suppressed, kept indices int64 as torchvision's
        keep = case["outputs"][0]
        assert 0 < keep["actual_shape"][0] < 60 and case["arrays"]["output_keep"].dtype == np.int64
    else:  # the count port bounds the padded outputs
        counts = case["arrays"]["output_num_detections"].reshape(-1)
        assert np.all((counts > 0) & (counts <= 16))


TABLE_CASES = ["EmbeddingHashTableLookupOrInsert", "EmbeddingHashTableApplyAdamW",
               "EmbeddingHashTableEvict", "EmbeddingHashTableImport", "InitEmbeddingHashTable"]


@pytest.mark.parametrize("op", TABLE_CASES)
def test_golden_table_operators(op, tmp_path):
    import jaxops.hashtable as ht
    path = golden.write_case(op, 0, str(tmp_path / "t.npz"))
    arrays = golden.load_case(path)["arrays"]
    table = "output_table0" if op == "EmbeddingHashTableImport" else "output_table"
    after = ht.cann.from_cann_bytes(arrays[table], 4)  # the cases use dim 4
    before = arrays.get(table.replace("output_", "input_"))
    if before is not None:  # the operator changed the table
        assert not np.array_equal(before, arrays[table])
    if op == "EmbeddingHashTableLookupOrInsert":  # rows returned are the rows now in the slots
        rows, _ = ht.find(after, arrays["input_keys"])
        np.testing.assert_array_equal(arrays["output_values"], np.asarray(rows))
    assert golden.check_case(path)  # the independent reference (tests/golden/test_golden_tables.py)
