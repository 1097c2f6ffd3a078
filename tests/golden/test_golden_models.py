"""Golden data for a whole ONNX model (``jaxops golden --onnx``): the nodes chosen, every
written tensor against ONNX Runtime's per-node values (intermediate values exposed as graph
outputs of a copy of the model: an independent oracle), the OP_OUTSHAPE words restated by
hand, the ``.bin`` files, the index, ``compare`` against a dump, and bad inputs."""

import json
import os
import pathlib
import sys

import jax
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto as T  # noqa: E402
from onnx import helper, numpy_helper  # noqa: E402

from jaxops.cli import main  # noqa: E402
from jaxops.core.errors import OpArgumentError, OpDTypeError  # noqa: E402
from jaxops.golden import load_case  # noqa: E402
from jaxops.golden.models import compare_model  # noqa: E402
from jaxops.onnx.golden import write_model_golden  # noqa: E402
from tests.onnx.node_compare import all_values, with_outputs  # noqa: E402

DATA = pathlib.Path(__file__).parents[1] / "onnx" / "data"
_I64 = lambda name, v: helper.make_tensor(name, T.INT64, [len(v)], v)  # noqa: E731
_F32 = lambda name, v: helper.make_tensor(name, T.FLOAT, [len(v)], v)  # noqa: E731


def _mixed_model():
    """One of each kind of data-dependent node, and nodes that only carry a size on."""
    nodes = [
        helper.make_node("NonZero", ["x"], ["nz"], name="nonzero"),
        helper.make_node("Unique", ["u"], ["uy", "uidx", "uinv", "ucnt"], name="unique"),
        helper.make_node("NonMaxSuppression", ["boxes", "scores", "max_out", "iou", "st"],
                         ["sel"], name="nms"),
        helper.make_node("Reshape", ["x", "flat"], ["xf"], name="flatten"),
        helper.make_node("Greater", ["xf", "zero"], ["pos"], name="greater"),
        helper.make_node("Compress", ["xf", "pos"], ["kept"], name="compress"),
        helper.make_node("Shape", ["kept"], ["n"], name="shape"),
        helper.make_node("Min", ["n", "four"], ["k"], name="min"),
        helper.make_node("TopK", ["kept", "k"], ["top", "where"], name="topk"),
        helper.make_node("Relu", ["top"], ["r"], name="relu"),
        helper.make_node("Concat", ["top", "kept"], ["cat"], axis=0, name="concat"),
        helper.make_node("Gather", ["xf", "where"], ["picked"], name="gather"),
        helper.make_node("ConstantOfShape", ["k"], ["ramp"], name="fill",
                         value=helper.make_tensor("v", T.INT64, [1], [7])),
    ]
    graph = helper.make_graph(
        nodes, "mixed",
        [helper.make_tensor_value_info("x", T.FLOAT, [2, 6]),
         helper.make_tensor_value_info("u", T.INT64, [8]),
         helper.make_tensor_value_info("boxes", T.FLOAT, [1, 5, 4]),
         helper.make_tensor_value_info("scores", T.FLOAT, [1, 1, 5])],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in
         [("nz", T.INT64, [2, "n"]), ("uy", T.INT64, ["a"]), ("ucnt", T.INT64, ["a"]),
          ("sel", T.INT64, ["s", 3]), ("r", T.FLOAT, ["k"]), ("cat", T.FLOAT, ["c"]),
          ("picked", T.FLOAT, ["k"]), ("ramp", T.INT64, ["m"])]],
        [_I64("flat", [-1]), helper.make_tensor("zero", T.FLOAT, [], [0.0]),
         _I64("four", [4]), _I64("max_out", [2]), _F32("iou", [0.5]), _F32("st", [0.1])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _mixed_inputs(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(2, 6)).astype(np.float32)
    x[rng.random((2, 6)) < 0.4] = 0
    corner = rng.random((1, 5, 2)).astype(np.float32)
    boxes = np.concatenate([corner, corner + 0.3 + rng.random((1, 5, 2)).astype(np.float32)], -1)
    return {"x": x, "u": rng.integers(-3, 4, 8).astype(np.int64), "boxes": boxes,
            "scores": rng.random((1, 1, 5)).astype(np.float32)}


#: The mixed model's data-dependent nodes, by name (Relu, Concat, Gather only carry a size).
MIXED = ["nonzero", "unique", "nms", "compress", "topk", "fill"]


def _ort_values(model, feeds) -> dict:
    """Every value of one run, by name, from ONNX Runtime (the graph inputs and
    initializers too)."""
    names = all_values(model)
    session = ort.InferenceSession(with_outputs(model, names).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    values = dict(zip(names, session.run(names, feeds)))
    values.update({t.name: numpy_helper.to_array(t) for t in model.graph.initializer})
    values.update(feeds)
    return values


def _check_against_ort(folder, model, feeds, expected_ops=None):
    """Every tensor of every node case equals ONNX Runtime's value of that graph value, in
    its dtype and shape (integers exactly); returns the index."""
    index = json.load(open(os.path.join(folder, "index.json")))
    theirs = _ort_values(model, feeds)
    nodes = list(model.graph.node)
    for entry in index["nodes"]:
        node = nodes[entry["index"]]
        assert node.op_type == entry["op_type"]
        case = load_case(os.path.join(folder, entry["case"]))
        assert [t["value"] for t in entry["inputs"]] == [n for n in node.input if n]
        assert [t["value"] for t in entry["outputs"]] == [n for n in node.output if n]
        for t in entry["inputs"] + entry["outputs"]:
            ours, want = case["arrays"][t["key"]], np.asarray(theirs[t["value"]])
            where = f"{entry['name']} {t['key']} ({t['value']})"
            assert ours.dtype == want.dtype and ours.shape == want.shape, \
                (where, ours.dtype, ours.shape, want.dtype, want.shape)
            if want.dtype.kind == "f":  # as tests/onnx/test_models.py: 1e-4 of the scale
                scale = float(np.max(np.abs(want), initial=1.0))
                np.testing.assert_allclose(ours, want, rtol=1e-4, atol=1e-4 * scale,
                                           err_msg=where)
            else:
                np.testing.assert_array_equal(ours, want, err_msg=where)
    if expected_ops is not None:
        assert sorted(e["op_type"] for e in index["nodes"]) == sorted(expected_ops)
    return index


def _words_by_hand(shapes) -> list[int]:
    words = []
    for s in shapes:
        words += [0x80000000 | len(s), *s, *[0] * (8 - len(s))]
    return words


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    d = tmp_path_factory.mktemp("mixed")
    model, feeds = _mixed_model(), _mixed_inputs()
    onnx.save(model, str(d / "mixed.onnx"))
    np.savez(d / "inputs.npz", **feeds)
    assert main(["golden", "--onnx", str(d / "mixed.onnx"), "--inputs", str(d / "inputs.npz"),
                 "--out", str(d / "g"), "--bin"]) == 0
    return d, model, feeds


def test_each_data_dependent_node_and_only_those_equal_onnxruntime(mixed):
    d, model, feeds = mixed
    index = _check_against_ort(d / "g", model, feeds)
    assert [e["name"] for e in index["nodes"]] == MIXED  # in graph order
    assert index["model"] == "mixed.onnx" and index["input_file"] == "inputs.npz"
    assert [t["name"] for t in index["inputs"]] == ["x", "u", "boxes", "scores"]
    by_name = {e["name"]: e for e in index["nodes"]}
    # the schema's formal names, the files named in the index
    assert [t["key"] for t in by_name["nms"]["inputs"]] == [
        "input_boxes", "input_scores", "input_max_output_boxes_per_class",
        "input_iou_threshold", "input_score_threshold"]
    assert [t["key"] for t in by_name["topk"]["outputs"]] == ["output_Values", "output_Indices"]
    for e in index["nodes"]:
        for f in (e["case"], e["json"], e["bin"]):
            assert (d / "g" / f).exists(), f


def test_outshape_words_and_bin_files(mixed):
    d, _, _ = mixed
    index = json.load(open(d / "g" / "index.json"))
    for e in index["nodes"]:
        case = load_case(d / "g" / e["case"])
        outs = [case["arrays"][t["key"]] for t in e["outputs"]]
        assert case["arrays"]["outshape"].dtype == np.int64
        assert case["arrays"]["outshape"].tolist() == _words_by_hand([o.shape for o in outs])
        assert case["outshape"]["words"] == case["arrays"]["outshape"].tolist()
        assert np.fromfile(d / "g" / e["bin"] / "outshape.bin", "<i8").tolist() == \
            case["arrays"]["outshape"].tolist()
        for t, desc in zip(e["outputs"], case["outputs"]):
            a = case["arrays"][t["key"]]
            raw = np.fromfile(d / "g" / desc["bin"], a.dtype.newbyteorder("<"))
            np.testing.assert_array_equal(raw, a.reshape(-1))
            if "fill_value" in desc:  # the max-shape buffer: the data as prefix, then fill
                buf = np.fromfile(d / "g" / desc["buffer_bin"], a.dtype.newbyteorder("<"))
                assert buf.size == np.prod(desc["max_shape"]) >= a.size
                np.testing.assert_array_equal(buf[:a.size], a.reshape(-1))
                assert (buf[a.size:] == desc["fill_value"]).all()
    nz = load_case(d / "g" / "node0000_NonZero.npz")
    assert nz["outputs"][0]["max_shape"] == [2, 12]  # jaxops' plan: every element
    assert nz["contract"]["name"] == "onnx" and nz["node"]["name"] == "nonzero"


def test_compare_with_a_dump_passes_and_fails_by_node(mixed, tmp_path, capsys):
    d, _, _ = mixed
    golden = d / "g"
    assert main(["golden", "compare", str(golden), str(golden)]) == 0  # its own cases
    index = json.load(open(golden / "index.json"))
    dump = tmp_path / "npu"
    dump.mkdir()
    for e in index["nodes"]:  # an NPU's dump: max-shape buffers and OP_OUTSHAPE as .bin
        case = load_case(golden / e["case"])
        (dump / e["stem"]).mkdir()
        for desc in case["outputs"]:
            src = desc.get("buffer_bin", desc["bin"])
            (dump / e["stem"] / f"{desc['name']}.bin").write_bytes((golden / src).read_bytes())
        (dump / e["stem"] / "outshape.bin").write_bytes(
            case["arrays"]["outshape"].astype("<i8").tobytes())
    assert compare_model(golden, dump).passed
    values = dump / "node0008_TopK" / "Values.bin"
    v = np.fromfile(values, "<f4")
    v[0] *= 1.01
    v.tofile(values)
    (dump / "node0012_ConstantOfShape" / "outshape.bin").unlink()
    (dump / "node0000_NonZero" / "outshape.bin").write_bytes(
        np.array(_words_by_hand([(2, 1)]), "<i8").tobytes())
    import shutil
    shutil.rmtree(dump / "node0001_Unique")
    report = compare_model(golden, dump)
    verdicts = {e["name"]: r for e, r in report.nodes}
    assert verdicts["unique"] is None
    assert not verdicts["topk"].passed and not verdicts["nonzero"].passed
    assert verdicts["fill"].passed and verdicts["nms"].passed and verdicts["compress"].passed
    capsys.readouterr()
    assert main(["golden", "compare", str(golden), str(dump)]) == 1
    text = capsys.readouterr().out
    assert "node 1 'unique' (Unique): FAIL: no node0001_Unique.npz" in text
    assert "OP_OUTSHAPE says [2, 1]" in text and "FAIL (3 of 6 nodes)" in text


def test_a_torchvision_detector_node_by_node(tmp_path):
    """SSDlite (tiny, committed): its NonZero, TopK (k from the count) and the If around
    the NMS, every tensor equal to ONNX Runtime's; ``check`` recomputes all but the If."""
    model = onnx.load(str(DATA / "ssdlite_small.onnx"))
    feeds = {"images": np.random.RandomState(0).rand(1, 3, 64, 64).astype(np.float32)}
    index = write_model_golden(DATA / "ssdlite_small.onnx", feeds, tmp_path / "g")
    found = _check_against_ort(tmp_path / "g", model, feeds,
                               ["NonZero"] * 8 + ["TopK"] * 4 + ["If"])
    assert json.load(open(index)) == found and found["model"] == "ssdlite_small.onnx"
    from jaxops.onnx.golden_check import check_model
    status = [(r.entry["op_type"], r.status) for r in check_model(tmp_path / "g")]
    assert {s for op, s in status if op != "If"} == {"ok"}
    assert ("If", "not checked") in status  # its NMS lives in a subgraph


def test_files_are_the_same_with_x64_on(mixed, tmp_path):
    d, _, _ = mixed
    with jax.enable_x64(True):
        write_model_golden(d / "mixed.onnx", d / "inputs.npz", tmp_path / "g64")
    for e in json.load(open(d / "g" / "index.json"))["nodes"]:
        a, b = load_case(d / "g" / e["case"]), load_case(tmp_path / "g64" / e["case"])
        assert sorted(a["arrays"]) == sorted(b["arrays"])
        for k in a["arrays"]:
            assert a["arrays"][k].dtype == b["arrays"][k].dtype, k
            np.testing.assert_array_equal(a["arrays"][k], b["arrays"][k], err_msg=k)


def test_bad_inputs_name_the_flag(mixed, tmp_path, monkeypatch, capsys):
    d, model, feeds = mixed
    out = str(tmp_path / "g")
    bad = [({k: v for k, v in feeds.items() if k != "u"}, OpArgumentError,
            r"argument '--inputs': expected an array for each graph input .*none for \['u'\]"),
           ({**feeds, "extra": np.zeros(1)}, OpArgumentError, r"'--inputs'.*also \['extra'\]"),
           ({**feeds, "x": feeds["x"].astype(np.float64)}, OpDTypeError,
            r"argument '--inputs\['x'\]': expected dtype float32 .*got float64"),
           ({**feeds, "x": feeds["x"][:1]}, OpArgumentError,
            r"argument '--inputs\['x'\]': expected shape \[2, 6\], got \[1, 6\]")]
    for given, error, message in bad:
        with pytest.raises(error, match=message):
            write_model_golden(model, given, out)
        assert not os.path.exists(out)  # refused before anything is written
    with pytest.raises(OpArgumentError, match="'--inputs': expected a .npz file"):
        write_model_golden(model, d / "mixed.onnx", out)
    with pytest.raises(OpArgumentError, match="'--onnx': expected an existing .onnx file"):
        write_model_golden(d / "nothing.onnx", feeds, out)
    with pytest.raises(OpArgumentError, match="'--out': expected a new or empty folder"):
        write_model_golden(model, feeds, d / "g")
    capsys.readouterr()
    assert main(["golden", "--onnx", str(d / "mixed.onnx"), "--out", out]) == 2
    assert "argument '--inputs': expected a value" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "onnx", None)  # as if onnx were not installed
    assert main(["golden", "--onnx", str(d / "mixed.onnx"), "--inputs",
                 str(d / "inputs.npz"), "--out", out]) == 2
    assert "argument '--onnx': expected the onnx package installed" in capsys.readouterr().err


def test_check_recomputes_each_node_with_onnx_reference(mixed, tmp_path, capsys):
    d, _, _ = mixed
    capsys.readouterr()
    assert main(["golden", "check", str(d / "g")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(MIXED) and all(": ok: equals onnx.reference" in x for x in lines)
    import shutil
    shutil.copytree(d / "g", tmp_path / "g")
    case = tmp_path / "g" / "node0001_Unique.npz"
    with np.load(case) as z:
        arrays = dict(z)
    arrays["output_counts"] = arrays["output_counts"] + np.eye(1, arrays["output_counts"].size,
                                                                 dtype=np.int64)[0]
    np.savez(case, **arrays)
    assert main(["golden", "check", str(tmp_path / "g")]) == 1
    out = capsys.readouterr().out
    assert "node 1 'unique' (Unique): FAIL: output_counts: 1 of" in out
    from jaxops.onnx.golden_check import check_model
    with pytest.raises(OpArgumentError, match="'--onnx': expected the model whose node 0"):
        check_model(d / "g", DATA / "ssdlite_small.onnx")
