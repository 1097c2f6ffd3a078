"""torchvision's detection models (tiny versions, committed in tests/onnx/data, exported by
examples/onnx/export_torchvision.py --small): under jit, one compile for images whose
detection counts differ, every node's output equal to ONNX Runtime's (exact for integers,
1e-4 for floats)."""

import pathlib

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from tests.onnx.node_compare import compare  # noqa: E402

DATA = pathlib.Path(__file__).parent / "data"


def _images(model, n=2):
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return [{"images": np.random.RandomState(s).rand(*dims).astype(np.float32)} for s in range(n)]


@pytest.mark.parametrize("name", ["ssdlite", "retinanet", "fcos", "fasterrcnn"])
def test_every_node_equals_onnxruntime_under_one_compile(name):
    """Three images, one compile; every value of the graph (the detections among them)
    equals ONNX Runtime's; the images' detection counts differ."""
    model = onnx.load(str(DATA / f"{name}_small.onnx"))
    compiles, rows, theirs = compare(model, _images(model, 3))
    assert compiles == 1
    bad = [r for r in rows if not r[3]]
    assert not bad, bad[:5]
    counts = [len(t["scores"]) for t in theirs.values()]
    assert len(set(counts)) > 1, counts
