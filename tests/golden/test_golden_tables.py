"""Issue 40, the hash-table operators: each golden case follows its arch35 kernel's contract
(CANN's inputs and outputs by name, tables as bucket bytes), agrees with the independent
numpy reference written from that contract (jaxops/golden/table_references.py, not the
library's kernels), keeps EVICTED in byte 20 where CANN's Evict writes it, is refused when
tampered with, and is the same with x64 off and on."""

import os

import numpy as np
import pytest

import jaxops.hashtable as ht
from jaxops import cli, golden
from jaxops.core.errors import OpArgumentError
from jaxops.golden.table_references import murmur3_key, row_width

# Every table operator, at attrs that change what its reference must model.
TABLE_CASES = [
    ("InitEmbeddingHashTable", {}, None, None),
    ("InitEmbeddingHashTable", {"initializer_mode": "constant", "constant_value": 0.5,
                                "embedding_dim": 3}, None, None),  # padding after odd rows
    ("EmbeddingHashTableLookupOrInsert", {}, None, None),
    ("EmbeddingHashTableLookupOrInsert", {"filter_key_flag": True, "filter_key": 7,
                                          "default_key_or_value": True, "default_key": 11,
                                          "filter_mode": "counter", "filter_freq": 3}, None, None),
    ("EmbeddingHashTableLookupOrInsert", {"filter_key_flag": True, "default_value": 2.5}, (5,), None),
    ("EmbeddingHashTableExport", {}, None, None),
    ("EmbeddingHashTableExport", {"export_mode": "new", "filtered_export_flag": True}, (3,), None),
    ("EmbeddingHashTableImport", {}, None, None),
    ("EmbeddingHashTableEvict", {}, None, None),
    ("EmbeddingHashTableEvict", {"init_mode": "random"}, None, None),
    ("EmbeddingHashTableApplyAdamW", {}, None, None),
    ("EmbeddingHashTableApplyAdamW", {"amsgrad": True, "maximize": True}, None, "float16"),
]


@pytest.mark.parametrize("op, attrs, shape, dtype", TABLE_CASES, ids=lambda v: str(v))
def test_table_cases_agree_with_the_independent_reference(op, attrs, shape, dtype, tmp_path):
    path = golden.write_case(op, 1, tmp_path / "c.npz", attrs, shape, dtype)
    assert golden.check_case(path)
    case = golden.load_case(path)
    contract = case["contract"]
    assert contract["name"] == op and contract["fixed_shape"] and case["outshape"] is None
    assert all(s.startswith("hicann/ops-nn ") for s in contract["sources"])
    tables = [d for d in case["outputs"] if d["name"].startswith("table")]
    assert tables and all(d["dtype"]["numpy"] == "uint8" and "buckets" in d for d in tables)


def test_the_reference_is_written_from_cann_not_from_the_library():
    """Its hash is a second MurmurHash3 (numpy, from hashtable_common.h) that agrees with the
    library's; a table made by hand reads as CANN's kernels read it."""
    keys = np.random.default_rng(0).integers(-2**63, 2**63 - 1, 200, dtype=np.int64)
    words = keys.view(np.uint32).reshape(-1, 2)
    assert murmur3_key(keys).tolist() == np.asarray(ht.cann.murmur3_x86_32(
        words[:, 0], words[:, 1])).tolist()
    assert int(murmur3_key(np.zeros(1, np.int64))[0]) == 0x63852AFC  # 8 zero bytes, seed 0
    dim, size = 1, 4
    buf = np.zeros((size, row_width(dim)), np.uint8)
    buf[:, 0:8] = 0xFF  # empty: key -1
    for s, (key, flag20, flag23) in enumerate([(5, 0, 0x1), (6, 0x8, 0x5), (7, 0, 0x7)]):
        buf[s, 0:8] = np.array([key], "<i8").view(np.uint8)
        buf[s, 8:16] = np.array([s + 1], "<u8").view(np.uint8)
        buf[s, 16], buf[s, 20], buf[s, 23] = 1, flag20, flag23
    inputs = {"embedding_dims": np.array([dim]), "bucket_sizes": np.array([size]), "table0": buf}
    want = golden.references.reference("EmbeddingHashTableExport")(inputs, {"export_mode": "all"})
    assert want.outputs["keys0"].tolist() == [5, 7]  # 6 is evicted (byte 20)
    assert want.outputs["filter_flags0"].tolist() == [0, 1]
    assert (want.outputs["table0"][:3, 23] == [0x5, 0x5, 0x7]).all()  # EXPORT on first export
    new = golden.references.reference("EmbeddingHashTableExport")(inputs, {"export_mode": "new"})
    assert new.outputs["keys0"].tolist() == [5]


def test_evicted_sits_in_byte_20_where_cann_s_evict_writes_it(tmp_path):
    case = golden.load_case(golden.write_case("EmbeddingHashTableEvict", 0, tmp_path / "e.npz"))
    before, after = case["arrays"]["input_table"], case["arrays"]["output_table"]
    evicted = (after[:, 20] == 0x8) & (before[:, 20] == 0)
    assert evicted.sum() >= 4 and not (after[:, 23] & 0x8).any()
    assert (after[evicted, 23] == before[evicted, 23]).all()  # VALID, EXPORT, FILTER kept
    assert (after[evicted, 8:16] == 0).all()  # counter 0
    moved = after.copy()
    moved[evicted, 23] |= 0x8  # where arch35 Export looks, and the bytes used to have it
    moved[evicted, 20] = 0
    with pytest.raises(OpArgumentError, match=r"EVICTED \(0x8\) in byte 20"):
        ht.cann.from_cann_bytes(moved, 4)
    back = ht.cann.from_cann_bytes(after, 4)
    assert np.array_equal(np.asarray(ht.cann.to_cann_bytes(back)), after)


def test_export_follows_the_kernel_s_lists_and_table_sizes(tmp_path):
    path = golden.write_case("EmbeddingHashTableExport", 0, tmp_path / "x.npz", bin=True)
    case = golden.load_case(path)
    a = case["arrays"]
    assert [d["name"] for d in case["inputs"]][:3] == ["table_sizes", "embedding_dims", "bucket_sizes"]
    for name in ("table_sizes", "embedding_dims", "bucket_sizes"):
        assert a[f"input_{name}"].dtype == np.int64 and a[f"input_{name}"].shape == (2,)
    for i, n in enumerate(a["input_table_sizes"].tolist()):  # InferShape: keys[table_sizes[i]]
        assert a[f"output_keys{i}"].shape == (n,) and a[f"output_keys{i}"].dtype == np.int64
        assert a[f"output_counters{i}"].dtype == np.uint64
        assert a[f"output_filter_flags{i}"].dtype == np.uint8
        assert a[f"output_values{i}"].shape == (n, 4) and a[f"output_values{i}"].dtype == np.float32
        assert n == ht.cann.handle_counters(ht.cann.from_cann_bytes(a[f"input_table{i}"], 4))[2]
    flagged = golden.build_case("EmbeddingHashTableExport", 0, {"filtered_export_flag": True})[0]
    for k in ("output_keys0", "output_values1", "output_table1"):  # the kernel ignores it
        assert np.array_equal(flagged[k], a[k])
    with pytest.raises(OpArgumentError, match="argument 'size'.*table_sizes"):
        golden.build_case("EmbeddingHashTableExport", 0, {"size": 4})
    np.savez(tmp_path / "in.npz", **{k[6:]: v for k, v in a.items() if k.startswith("input_")}
             | {"table_sizes": a["input_table_sizes"] + 1})
    with pytest.raises(OpArgumentError, match="EmbeddingHashTableExport: argument 'table_sizes'"):
        golden.build_case("EmbeddingHashTableExport", input_path=tmp_path / "in.npz")
    again = golden.write_case("EmbeddingHashTableExport", 0, tmp_path / "y.npz",
                              input_path=tmp_path / "x.json")  # the case's own .bin files
    assert golden.check_case(again)


def test_apply_adam_w_takes_cann_s_tensors(tmp_path):
    path = golden.write_case("EmbeddingHashTableApplyAdamW", 0, tmp_path / "a.npz",
                             {"amsgrad": True}, dtype="float16")
    a = golden.load_case(path)["arrays"]
    assert len(np.unique(a["input_keys"])) == a["input_keys"].size  # the proto: deduplicated
    for name in ("m", "v", "max_grad_norm"):  # separate [bucket_size, dim] tensors
        assert a[f"input_{name}"].shape == a[f"output_{name}"].shape == (64, 4)
        assert a[f"output_{name}"].dtype == np.float16
    f = np.float32
    assert a["output_beta1_power"][0] == np.float16(f(a["input_beta1_power"][0]) * f(a["input_beta1"][0]))
    assert (a["output_max_grad_norm"] >= a["input_max_grad_norm"]).all()
    rows = a["output_table"][:, 24:40].copy().view("<f4")
    moved = (a["output_table"] != a["input_table"]).any(axis=1)
    assert moved.any() and np.array_equal(rows[moved].astype(np.float16).astype(np.float32),
                                           rows[moved])  # the kernel writes float(half(w))
    inputs = {k[6:]: v for k, v in a.items() if k.startswith("input_")}
    for keys, fragment in ((np.repeat(inputs["keys"][:6], 2), "distinct keys"),
                           (np.where(np.arange(12) == 3, -1, inputs["keys"]), "keys other than -1")):
        np.savez(tmp_path / "in.npz", **{**inputs, "keys": keys})
        with pytest.raises(OpArgumentError, match=f"EmbeddingHashTableApplyAdamW: argument "
                           f"'keys': expected {fragment}"):
            golden.build_case("EmbeddingHashTableApplyAdamW", input_path=tmp_path / "in.npz")


def test_table_sizes_are_options_and_inputs_are_the_developer_s(tmp_path, capsys):
    out = tmp_path / "i.npz"
    code = cli.main(["golden", "InitEmbeddingHashTable", "--bucket_size", "32",
                     "--embedding_dim", "3", "--out", str(out)])
    table = golden.load_case(out)["arrays"]["output_table"]
    assert code == 0 and table.shape == (32, row_width(3)) == (32, 40)
    assert cli.main(["golden", "check", str(out)]) == 0
    np.savez(tmp_path / "mine.npz", table=table, keys=np.array([3, 3, 2**40], np.int64))
    mine = golden.load_case(golden.write_case(  # 40-byte rows hold dim 3 or 4: say which
        "EmbeddingHashTableLookupOrInsert", 0, tmp_path / "m.npz", {"embedding_dim": 3},
        input_path=tmp_path / "mine.npz"))
    assert mine["seed"] is None and mine["input_file"] == "mine.npz"
    assert mine["arrays"]["output_values"].shape == (3, 3) and mine["attrs"]["bucket_size"] == 32
    assert mine["contract"]["cann_attrs"] == {**mine["contract"]["cann_attrs"],
                                              "bucket_size": 32, "embedding_dim": 3}
    assert golden.check_case(tmp_path / "m.npz")
    for argv, fragment in (
            (["--bucket_size", "0"], "argument 'bucket_size': expected a positive int"),
            (["--embedding_dim", "7", "--input", str(tmp_path / "mine.npz")],
             "argument 'table': expected uint8 buckets [bucket_size, 56] (embedding_dim 7), "
             "got shape [32, 40]"),
            (["--bucket_size", "16", "--input", str(tmp_path / "mine.npz")],
             "argument 'bucket_size': expected 32, the table's buckets, got 16"),
            (["--dtype", "int32"], "argument 'dtype': expected int64"),
            (["--density", "0.5"], "argument 'density'")):
        code = cli.main(["golden", "EmbeddingHashTableLookupOrInsert", *argv,
                         "--out", str(tmp_path / "z.npz")])
        err = capsys.readouterr().err
        assert code == 2 and fragment in err and err.count("\n") == 1, err


@pytest.mark.parametrize("op, output, plant", [
    ("EmbeddingHashTableExport", "table1", lambda a: a.__setitem__((5, 23), a[5, 23] ^ 0x4)),
    ("EmbeddingHashTableLookupOrInsert", "table", lambda a: a.__setitem__((3, 9), a[3, 9] ^ 1)),
    ("EmbeddingHashTableApplyAdamW", "table", lambda a: a.__setitem__(
        (int(np.flatnonzero(a[:, 23] & 1)[0]), 27), 0x40)),
    ("EmbeddingHashTableApplyAdamW", "m", lambda a: a.__setitem__((0, 0), a[0, 0] + 1)),
])
def test_check_refuses_a_planted_wrong_byte(op, output, plant, tmp_path):
    path = golden.write_case(op, 0, tmp_path / "t.npz")
    case = golden.load_case(path)
    arrays = {k: v.copy() for k, v in case["arrays"].items()}
    plant(arrays[f"output_{output}"])
    description = {k: v for k, v in case.items() if k != "arrays"}
    golden.files.write(path, arrays, description)
    with pytest.raises(AssertionError, match=f"output {output}"):
        golden.check_case(path)


def test_compare_reads_bucket_bytes(tmp_path, capsys):
    path = golden.write_case("EmbeddingHashTableApplyAdamW", 0, tmp_path / "g.npz", bin=True)
    assert cli.main(["golden", "compare", str(path), str(tmp_path / "g")]) == 0
    a = golden.load_case(path)["arrays"]
    npu = {k[7:]: v.copy() for k, v in a.items() if k.startswith("output_")}
    rows = npu["table"][:, 24:40].copy().view("<f4")
    npu["table"][:, 24:40] = (rows * np.float32(1 + 2**-18)).view(np.uint8)  # a fused rounding
    np.savez(tmp_path / "npu.npz", **npu)
    assert golden.compare_case(path, tmp_path / "npu.npz").passed
    npu["table"][np.flatnonzero(npu["table"][:, 16])[0], 8] ^= 1  # a counter off by one
    np.savez(tmp_path / "npu.npz", **npu)
    report = golden.compare_case(path, tmp_path / "npu.npz")
    assert not report.passed and "bytes outside the rows: FAIL" in report.outputs[-1].verdict


# The operators whose keys, counters or floats cross the 64-bit words of x64 off (Init
# writes bytes only; Evict's keys take LookupOrInsert's path).
_X64_CASES = [c for c in TABLE_CASES if c[0].endswith(("Insert", "Export", "Import", "AdamW"))
              and c[1] == {}]


def test_table_files_are_the_same_with_x64_off_and_on(tmp_path):
    import jax
    for mode in ("off", "on"):
        (tmp_path / mode).mkdir()
        with jax.enable_x64(mode == "on"):
            for op, attrs, shape, dtype in _X64_CASES:
                golden.write_case(op, 2, tmp_path / mode / f"{op}.npz", attrs, shape, dtype)
    names = sorted(os.listdir(tmp_path / "off"))
    assert names == sorted(os.listdir(tmp_path / "on")) and len(names) == 8
    for name in names:
        assert (tmp_path / "off" / name).read_bytes() == (tmp_path / "on" / name).read_bytes(), name
