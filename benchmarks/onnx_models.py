"""ONNX detection models (issue 37): jitted jaxops.onnx against ONNX Runtime on the CPU.

The four torchvision models of issue 37 at full size (SSDlite320-MobileNetV3,
RetinaNet-ResNet50-FPN, FCOS-ResNet50-FPN, Faster R-CNN MobileNetV3-320-FPN), exported by
``examples/onnx/export_torchvision.py --out DIR`` (torch in a separate environment; the
script says how) into ``$JAXOPS_ONNX_MODELS`` (default ``~/.cache/jaxops/onnx_models``); a
model not exported there is skipped with a line saying so. ``--quick`` runs the tiny test
versions in ``tests/onnx/data``.

Per model, in one process, each side with its default threads:

- **end to end**: one image, ``jax.jit(jaxops.onnx.load(model))`` against an ONNX Runtime
  CPU session (target <= 2.5x); checked first: the same number of detections and labels,
  boxes and scores within 1e-3 of their scale (a near-tie of random-weight scores that
  flips a kept box fails the check, and says so);
- **backbone**: the same two, asked only for the outputs of the convolutions no other
  convolution follows (the backbone's and the heads' last; XLA drops the rest, ONNX Runtime
  runs only what they need), so the note can state the split: convolutions vs everything
  after them (post-processing with the dual-shape machinery; for Faster R-CNN also the
  RoI heads);
- the compile time (trace and XLA compile), and the memory of the max-shape plan against
  what the image actually used, over every value of the graph: the planned and used bytes,
  the saving rate (1 - used / planned) and the valid-data density of the values whose
  shape depends on the data (valid elements / planned elements);
- the detections ONNX Runtime finds (the check is only as good as they are many: the
  export script sets the random-weight heads so that every model detects), and the memory
  of a capacity plan calibrated on 3 images (``jaxops.onnx.calibrate``) against the
  data-dependent tensors' bounds.
"""

from __future__ import annotations

import math
import os
import pathlib
import time

import jax
import numpy as np

import jaxops
from benchmarks.common import Result, compare
from tests.onnx.node_compare import with_outputs

MODELS = ["ssdlite", "retinanet", "fcos", "fasterrcnn"]
TARGET = 2.5


def _folder(quick: bool) -> pathlib.Path:
    if quick:
        return pathlib.Path(__file__).resolve().parents[1] / "tests" / "onnx" / "data"
    default = pathlib.Path(os.path.expanduser("~/.cache/jaxops/onnx_models"))
    return pathlib.Path(os.environ.get("JAXOPS_ONNX_MODELS", default))


_FLIPS: list[str] = []


def _check(ours, theirs) -> None:
    """The same detections as ONNX Runtime; or, where a near-tie of random-weight scores
    flipped a kept box (recorded for the note), counts within 2% and the same labels for
    at least 95% of the boxes both kept."""
    boxes, scores, labels = jaxops.refresh(ours)
    ref = theirs
    if boxes.shape != ref[0].shape or not np.array_equal(labels, ref[2].astype(labels.dtype)):
        n = min(len(labels), len(ref[2]))
        same = float(np.mean(labels[:n] == ref[2][:n])) if n else 1.0
        assert abs(len(labels) - len(ref[2])) <= max(1, 0.02 * len(ref[2])) and same >= 0.95, \
            f"{len(boxes)} detections, ONNX Runtime {len(ref[0])}; {same:.0%} labels equal"
        _FLIPS.append(f"{len(labels)} vs {len(ref[2])} detections (a near-tie flipped)")
        return
    np.testing.assert_array_equal(labels, ref[2].astype(labels.dtype), err_msg="labels")
    np.testing.assert_allclose(scores, ref[1], rtol=1e-3, atol=1e-4, err_msg="scores")
    scale = max(1.0, float(np.abs(ref[0]).max(initial=0)))
    np.testing.assert_allclose(boxes, ref[0], rtol=1e-3, atol=1e-3 * scale, err_msg="boxes")


def _close(ours, theirs) -> None:
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(np.asarray(a), b, rtol=1e-3,
                                   atol=1e-3 * max(1.0, float(np.abs(b).max(initial=0))))


def _last_convs(model) -> list[str]:
    """The outputs of the Conv nodes from which no other Conv follows: the backbone and
    the heads' convolutions end there, post-processing starts."""
    consumers: dict[str, list] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    feeds_conv: dict[str, bool] = {}
    for n in reversed(model.graph.node):
        below = any(c.op_type == "Conv" or feeds_conv.get(c.output[0], False)
                    for o in n.output for c in consumers.get(o, []))
        for o in n.output:
            feeds_conv[o] = below
    return [n.output[0] for n in model.graph.node
            if n.op_type == "Conv" and not feeds_conv[n.output[0]]]


def _memory(model, image, capacities=None) -> tuple[float, float, float]:
    """(planned MB, used MB, density of the data-dependent values) over every value the
    graph computes at run time (under ``capacities``: a plan)."""
    import jaxops.onnx

    outs = jax.jit(jaxops.onnx.load(model, capacities=capacities).values)(image)
    planned = used = dyn_planned = dyn_valid = 0
    for o in outs.values():
        if isinstance(o, jaxops.DynArray):
            size, valid = math.prod(o.max_shape), int(np.prod(np.asarray(o.actual_shape)))
            dyn_planned += size
            dyn_valid += valid
        else:
            size = valid = int(np.prod(o.shape))
        planned += size * o.dtype.itemsize
        used += valid * o.dtype.itemsize
    return planned / 2**20, used / 2**20, dyn_valid / max(dyn_planned, 1)


def _planned(model, dims, session, feeds) -> str:
    """The capacity plan calibrated on 3 images (jaxops.onnx.calibrate, the 3-sigma rule):
    the whole graph's planned memory under it (the data-dependent tensors and everything
    sized from them), its detections checked against ONNX Runtime's."""
    import jaxops.onnx

    images = [(np.random.RandomState(s).rand(*dims).astype(np.float32),) for s in range(3)]
    plan = jaxops.onnx.calibrate(model, images)
    planned, used, density = _memory(model, images[0][0], plan)
    _check(jax.jit(jaxops.onnx.load(model, capacities=plan))(images[0][0]),
           session.run(None, feeds))
    return (f"under a plan calibrated on 3 images ({len(plan.entries)} data-dependent "
            f"tensors): plan {planned:.1f} MB, density {density:.1%}, same detections")


def _detections(session, feeds) -> str:
    labels = session.run(None, feeds)[2]
    if not len(labels):
        return ("ONNX Runtime detects nothing: the check compares empty outputs (export the "
                "model with examples/onnx/export_torchvision.py, which makes it detect)")
    return f"{len(labels)} detections of {len(np.unique(labels))} labels"


def run(quick: bool) -> list[Result]:
    import onnx
    import onnxruntime as ort

    import jaxops.onnx

    folder = _folder(quick)
    results = []
    for name in MODELS:
        path = folder / (f"{name}_small.onnx" if quick else f"{name}.onnx")
        if not path.exists():
            print(f"onnx_models: {path} not found; export it with "
                  f"examples/onnx/export_torchvision.py --out {folder}")
            continue
        model = onnx.load(str(path))
        dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
        image = np.random.RandomState(0).rand(*dims).astype(np.float32)
        convs = _last_convs(model)
        t0 = time.perf_counter()
        ours = jax.jit(jaxops.onnx.load(model)).lower(image).compile()
        compile_s = time.perf_counter() - t0
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        feeds = {model.graph.input[0].name: image}
        planned, used, density = _memory(model, image)
        temp = ours.memory_analysis().temp_size_in_bytes / 2**20
        backbone = jax.jit(jaxops.onnx.load(model, outputs=convs)).lower(image).compile()
        conv_session = ort.InferenceSession(with_outputs(model, convs).SerializeToString(),
                                            providers=["CPUExecutionProvider"])
        repeats = 3 if quick else 5
        whole = compare(f"onnx {name} end to end", lambda: ours(image), "onnxruntime CPU",
                        lambda: session.run(None, feeds), target=None if quick else TARGET,
                        repeats=repeats, warmup=1, check=_check)
        part = compare(f"onnx {name} backbone and heads' convs", lambda: backbone(image),
                       "onnxruntime CPU", lambda: conv_session.run(None, feeds),
                       repeats=repeats, warmup=1, check=_close)
        rest_ours = max(whole.ours_s - part.ours_s, 0.0)
        rest_peer = max(whole.peer_s - part.peer_s, 0.0)
        flips = "; ".join(_FLIPS)
        _FLIPS.clear()
        whole.note = (f"{_detections(session, feeds)}; {flips + '; ' if flips else ''}"
                      f"compile {compile_s:.1f} s; plan {planned:.1f} MB, used {used:.1f} MB "
                      f"(saving rate {1 - used / planned:.1%}), data-dependent values' density "
                      f"{density:.1%}, XLA temp {temp:.1f} MB; after the backbone: ours "
                      f"{rest_ours * 1e3:.0f} ms, ORT {rest_peer * 1e3:.0f} ms; "
                      f"{_planned(model, dims, session, feeds)}")
        results += [whole, part]
    return results
