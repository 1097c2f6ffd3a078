"""Produce and re-check golden reference cases for an Ascend kernel developer.

For NonZero and for EmbeddingHashTableExport this writes a golden case (``.npz`` + JSON
sidecar: inputs, outputs at their actual shapes in the dtypes of the kernel contract the
case follows, the OP_OUTSHAPE tensor as a CANN kernel writes it, attrs, impl mode; the
export follows the arch35 kernel: its tables as CANN bucket bytes, table_sizes and one
output per table), reads them back, prints what a kernel must reproduce, checks them
against independent references and compares a would-be NPU output with one.
``docs/golden.md`` is the guide.

The same cases come from the command line: ``jaxops golden NonZero --seed 3``,
``jaxops golden check FILE``, ``jaxops golden compare GOLDEN ACTUAL``.

    python examples/golden_data.py [out_dir]
"""

import os
import sys
import tempfile

import numpy as np

from jaxops import golden
from tracing import outshape


def show(path: str) -> None:
    case = golden.load_case(path)
    print(f"{case['op']} (seed {case['seed']}, contract {case['contract']['name']}, impl mode "
          f"{case['impl_mode']['name']}): {path}")
    for d in case["inputs"]:
        print(f"  input  {d['name']:16s} {d['dtype'].get('cann', d['dtype']['numpy']):8s} {d['shape']}")
    for d in case["outputs"]:
        shape = (f"max {d['max_shape']} actual {d['actual_shape']}" if "actual_shape" in d
                 else f"{d['max_shape']}")  # a fixed shape: the kernel's whole output
        print(f"  output {d['name']:16s} {d['dtype'].get('cann', d['dtype']['numpy']):8s} {shape}")
    words = case["arrays"].get("outshape")
    if words is not None:  # data-dependent shapes (the export takes its sizes from table_sizes)
        print(f"  OP_OUTSHAPE {words.dtype} [{words.size}] rank words "
              f"{[hex(int(w)) for w in words[::9]]} → shapes {outshape.decode(words)}")
    for name in case["extra"]:
        print(f"  extra  {name:16s} {case['arrays'][name].dtype} {list(case['arrays'][name].shape)}")


def main(out_dir: str | None = None) -> dict:
    out_dir = out_dir or tempfile.mkdtemp(prefix="jaxops_golden_")
    paths = [golden.write_case("NonZero", seed=3, out=os.path.join(out_dir, "nonzero.npz")),
             golden.write_case("EmbeddingHashTableExport", seed=3,
                               out=os.path.join(out_dir, "export_new.npz"),
                               attrs={"export_mode": "new"})]
    for path in paths:
        show(path)
    # checked against numpy references written from each contract (jaxops/golden/
    # references.py, table_references.py), not against the kernel that wrote the case
    for path in paths:
        print(f"  check {os.path.basename(path)} against the independent reference: "
              f"{'OK' if golden.check_case(path) else 'FAILED'}")
    nz = golden.load_case(paths[0])["arrays"]
    expected = np.stack(np.nonzero(nz["input_x"]))            # numpy's answer, [D, N]
    matches = bool(np.array_equal(nz["output_y"], expected))  # stored at the actual shape
    print(f"NonZero output equals numpy's nonzero ({expected.shape[1]} indices): {matches}")
    npu = os.path.join(out_dir, "npu.npz")                    # what an NPU run might dump
    np.savez(npu, y=golden.max_shape_buffer(golden.load_case(paths[0]), "y"))
    report = golden.compare_case(paths[0], npu)
    print(report.text())
    return {"paths": paths, "nonzero_matches_numpy": matches, "compare_passed": report.passed}


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
