"""The jaxops command line: ops, golden, demo, bench, help and user errors."""

import json
import subprocess
import sys

import numpy as np
import pytest

from jaxops import cli, golden


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
])
def test_golden_user_errors(argv, fragment, capsys):
    code, _, err = run(argv, capsys)
    assert code == 2 and fragment in err and "Traceback" not in err and err.count("\n") == 1


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
    path = golden.write_case("NonMaxSuppression", 0, str(tmp_path / "g.npz"))
    case = golden.load_case(path)
    arrays = dict(case["arrays"])
    arrays["outshape"] = arrays["outshape"].copy()
    arrays["outshape"][1] += 1
    desc = {k: v for k, v in case.items() if k != "arrays"}
    np.savez(path, **arrays, description=np.frombuffer(json.dumps(desc).encode(), np.uint8))
    with pytest.raises(AssertionError, match="outshape differs"):
        golden.check_case(path)


@pytest.mark.parametrize("command", [[], ["demo"], ["ops"], ["golden"], ["bench"]])
def test_help_everywhere(command):
    with pytest.raises(SystemExit) as e:
        cli.main(command + ["--help"])
    assert e.value.code == 0


def test_bad_subcommand_arguments_exit_2():
    with pytest.raises(SystemExit) as e:
        cli.main(["ops", "--frobnicate"])
    assert e.value.code == 2


def test_demo_quick(capsys):
    code, out, _ = run(["demo", "--quick"], capsys)
    assert code == 0
    assert "kept" in out and "loss" in out and "occupancy" in out and "Summary" in out


def test_bench_quick_nms_only(tmp_path, capsys):
    code, out, _ = run(["bench", "--quick", "--no-hugepages", "--only", "nms",
                        "--json", str(tmp_path / "b.json"),
                        "--png", str(tmp_path / "b.png")], capsys)
    assert code == 0 and "ratio" in out
    data = json.loads((tmp_path / "b.json").read_text())
    assert data["results"] and all(r["ratio"] > 0 and r["best_ratio"] > 0 for r in data["results"])
    assert data["meta"]["glibc_hugepages"] is False and "huge pages for large buffers: off" in out


def test_python_dash_m_entry_point():
    res = subprocess.run([sys.executable, "-m", "jaxops", "ops", "--json"], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0 and json.loads(res.stdout)


@pytest.mark.parametrize("op", ["BatchedNMS", "EfficientNMS"])
def test_golden_nms_variants(op, tmp_path):
    path = golden.write_case(op, 0, str(tmp_path / "n.npz"))
    case = golden.load_case(path)
    assert golden.check_case(path)
    if op == "BatchedNMS":  # some boxes suppressed, kept indices int64 as CANN writes them
        keep = case["outputs"][0]
        assert 0 < keep["actual_shape"][0] < 60 and case["arrays"]["output_keep"].dtype == np.int64
    else:  # the count port bounds the padded outputs
        counts = case["arrays"]["output_num_detections"].reshape(-1)
        assert np.all((counts > 0) & (counts <= 16))


TABLE_CASES = ["EmbeddingHashTableLookupOrInsert", "EmbeddingHashTableApplyAdamW",
               "EmbeddingHashTableEvict", "EmbeddingHashTableImport", "InitEmbeddingHashTable"]


@pytest.mark.parametrize("op", TABLE_CASES)
def test_golden_table_operators(op, tmp_path):
    import jax
    import jaxops.hashtable as ht
    path = golden.write_case(op, 0, str(tmp_path / "t.npz"))
    arrays = golden.load_case(path)["arrays"]
    after = ht.from_cann_bytes(arrays["output_table"], 4)  # the cases use dim 4
    if "table_before_bytes" in arrays:  # the operator changed the table
        assert not np.array_equal(arrays["table_before_bytes"], arrays["output_table"])
    if op == "EmbeddingHashTableLookupOrInsert":  # rows returned are the rows now in the slots
        slots = arrays["output_info"]
        np.testing.assert_array_equal(arrays["output_values"], np.asarray(after.values)[slots])
    with jax.enable_x64(True):  # the same case with x64 on
        assert golden.check_case(path)
