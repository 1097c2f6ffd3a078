"""The kernel contract each golden case follows, read from CANN's sources.

A case is golden for one kernel: an aclnn API where CANN has one, else the framework
semantics the operator implements (ONNX, torchvision, TensorRT). Its :class:`Contract` says
which, the source files it was read from, which outputs keep an input's dtype (values do;
index outputs are INT64, or INT32 where the kernel writes INT32), the CANN attrs the
jaxops attrs map to, and whether outputs have a data-dependent shape (an OP_OUTSHAPE and
max-shape buffers) or a fixed one whose padding is data (aclnnNonMaxSuppression).

=====================  ==========================  ==========================================
operator               contract (``--contract``)   read from
=====================  ==========================  ==========================================
NonZero                aclnnNonzeroV2 (``[D, N]``) ops-nn ``index/non_zero``: docs, op_api
                       / aclnnNonzero (transpose)  ``aclnn_nonzero_v2.cpp``, ``nonzero.cpp``,
                                                   ``op_host/non_zero_infershape.cpp``
Unique                 aclnnUnique2 (sorted,       ops-nn ``index/unique_consecutive``: docs
                       flattened), else ONNX       ``aclnnUnique2.md``, ``aclnn_unique2.cpp``
UniqueConsecutive      aclnnUniqueConsecutive      ops-nn ``index/unique_consecutive``
MaskedSelect           aclnnMaskedSelect           ops-math ``conversion/masked_select_v3``
NonMaxSuppression      aclnnNonMaxSuppression      ops-cv ``objdetect/non_max_suppression_v6``
                       (``aclnn``) or ONNX         and its TBE kernel (CANN 8.1.RC1
                       (``onnx``)                  ``impl/dynamic/non_max_suppression_v6.py``)
BatchedNMS             torchvision batched_nms     no aclnn kernel
EfficientNMS           TensorRT EfficientNMS_TRT   no aclnn kernel
InitEmbeddingHashTable the arch35 kernels          ops-nn ``hash/<op>``: op_graph proto,
EmbeddingHashTable*    (``arch35``): the bucket    op_kernel/arch35, op_host tiling and
                       bytes the handle points at  infershape (rules in
                                                   :mod:`jaxops.golden.table_contracts`)
=====================  ==========================  ==========================================

>>> c = contract("NonZero", {"transpose": False, "size": None}, None)
>>> c.name, dict(c.cann_attrs)
('aclnnNonzeroV2', {'transpose': True, 'dtype': 'int64'})
>>> contract("NonMaxSuppression", {"max_output_boxes_per_class": 5, "score_threshold": 0.1},
...          "aclnn").fixed_shape
True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from jaxops.core.errors import OpArgumentError

__all__ = ["ACLNN_NMS_MAX_PER_CLASS", "Contract", "GoldenOutput", "check_inputs", "choices",
           "contract", "register_contract", "to_contract"]

_OPS_NN = "hicann/ops-nn"
_NMS_DIR = "hicann/ops-cv objdetect/non_max_suppression_v6/"
_NMS_KERNEL = ("CANN 8.1.RC1 opp/built-in/op_impl/ai_core/tbe/impl/dynamic/"
               "non_max_suppression_v6.py (the TBE kernel behind it)")
#: aclnnNonMaxSuppression refuses a larger maxOutputBoxesPerClass (MAX_VALID_OUTPUT).
ACLNN_NMS_MAX_PER_CLASS = 700


@dataclasses.dataclass(frozen=True)
class Contract:
    """The kernel contract a case follows (see the module docstring).

    ``values_of``: ``(output, input)`` pairs, the output holding that input's dtype.
    ``fixed_shape``: outputs at a fixed shape whose padding is data, no OP_OUTSHAPE.
    ``index_dtype``: the dtype of index outputs. ``notes``: where this case departs from
    the kernel (the table in ``docs/golden.md`` says why).
    """

    name: str
    follows: str
    sources: tuple[str, ...] = ()
    values_of: tuple[tuple[str, str], ...] = ()
    cann_attrs: tuple[tuple[str, Any], ...] = ()
    fixed_shape: bool = False
    index_dtype: str = "int64"
    notes: tuple[str, ...] = ()

    def describe(self) -> dict:
        """The contract as the case's description records it."""
        return {"name": self.name, "follows": self.follows, "sources": list(self.sources),
                "cann_attrs": dict(self.cann_attrs), "fixed_shape": self.fixed_shape,
                "index_dtype": self.index_dtype, "notes": list(self.notes)}


@dataclasses.dataclass
class GoldenOutput:
    """One output of a case: its data at the actual shape, its max (buffer) shape, the
    true shape a capacity would have needed (``None``: none can cut it), its padding value
    (``None``: the output is its whole buffer), and what else its description says
    (``notes``: a bucket table's ``{"buckets": {"embedding_dim": D}}``)."""

    name: str
    data: np.ndarray
    max_shape: tuple
    true_shape: tuple | None = None
    fill_value: Any = None
    notes: dict | None = None

    @property
    def data_dependent(self) -> bool:
        return self.fill_value is not None


_RULES: dict[str, tuple[tuple[str, ...], Callable[[dict, str], Contract]]] = {}


def register_contract(op: str, *names: str):
    """Decorator: ``fn(attrs, choice) -> Contract`` is ``op``'s rule, for the ``--contract``
    values ``names`` (the default first). The hash-table operators' rules are in
    :mod:`jaxops.golden.table_contracts` (registered with their specs)."""
    def register(fn):
        _RULES[op] = (names, fn)
        return fn
    return register


_rule = register_contract


def choices(op: str) -> tuple[str, ...]:
    """The ``--contract`` values ``op`` takes, the default first (``()``: no rule here).

    >>> choices("NonMaxSuppression")
    ('aclnn', 'onnx')
    """
    return _RULES.get(op, ((), None))[0]


def contract(op: str, attrs: dict, choice: str | None) -> Contract:
    """The contract of ``op``'s case with ``attrs`` (``choice``: a ``--contract`` value,
    ``None`` for the default). Attrs the contract cannot take raise, naming it."""
    names, rule = _RULES[op]
    if choice is None:
        choice = names[0]
    if choice not in names:
        raise OpArgumentError(f"golden {op}", "contract", "one of " + ", ".join(names),
                              repr(choice))
    return rule(attrs, choice)


def _capacity_note(attrs: dict) -> tuple[str, ...]:
    return (("size: a jaxops capacity the kernel does not have (its buffer is the max "
             "shape); the case is cut to it",) if attrs.get("size") is not None else ())


@_rule("NonZero", "aclnn")
def _nonzero(attrs: dict, _: str) -> Contract:
    rows = bool(attrs.get("transpose"))  # jaxops' transpose=True is CANN's transpose=false
    return Contract(
        "aclnnNonzero" if rows else "aclnnNonzeroV2",
        ("[N, D]" if rows else "[D, N]") + " INT64 coordinates of the non-zero elements, "
        "row-major; out buffer at max shape, refreshed to the actual shape",
        (f"{_OPS_NN} index/non_zero/docs/aclnnNonzero{'' if rows else 'V2'}.md",
         f"{_OPS_NN} index/non_zero/op_api/aclnn_nonzero{'' if rows else '_v2'}.cpp",
         f"{_OPS_NN} index/non_zero/op_api/nonzero.cpp",
         f"{_OPS_NN} index/non_zero/op_host/non_zero_infershape.cpp"),
        cann_attrs=(("transpose", not rows), ("dtype", "int64")), notes=_capacity_note(attrs))


@_rule("Unique", "aclnn")
def _unique(attrs: dict, _: str) -> Contract:
    aclnn = attrs.get("sorted", True) and attrs.get("axis") is None and attrs.get("equal_nan", True)
    notes = _capacity_note(attrs) + ("indices (first occurrences, ONNX's) is a jaxops output "
                                     "aclnnUnique2 does not have",)
    if aclnn:
        return Contract(
            "aclnnUnique2", "valueOut (self's dtype) ascending, inverseOut INT64 of self's "
            "shape, countsOut INT64; sorted=True, returnInverse=True, returnCounts=True",
            (f"{_OPS_NN} index/unique_consecutive/docs/aclnnUnique2.md",
             f"{_OPS_NN} index/unique_consecutive/op_api/aclnn_unique2.cpp",
             f"{_OPS_NN} index/unique_consecutive/op_api/unique_common.cpp"),
            values_of=(("y", "x"),), notes=notes,
            cann_attrs=(("sorted", True), ("returnInverse", True), ("returnCounts", True)))
    return Contract(
        "onnx", "ONNX Unique (sorted=False: first-occurrence order; axis: slices; "
        "equal_nan=False: NaNs distinct); aclnnUnique2 has no such configuration",
        ("onnx/docs/Operators.md#Unique",), values_of=(("y", "x"),), notes=notes)


@_rule("UniqueConsecutive", "aclnn")
def _unique_consecutive(attrs: dict, _: str) -> Contract:
    axis = attrs.get("axis")
    return Contract(
        "aclnnUniqueConsecutive", "valueOut (self's dtype), inverseOut and countsOut INT64 "
        "(the kernel takes INT32 or INT64, one dtype for both)",
        (f"{_OPS_NN} index/unique_consecutive/docs/aclnnUniqueConsecutive.md",
         f"{_OPS_NN} index/unique_consecutive/op_api/unique_consecutive.cpp"),
        values_of=(("y", "x"),), notes=_capacity_note(attrs),
        cann_attrs=(("returnInverse", True), ("returnCounts", True),
                    ("dim", 1000 if axis is None else axis)))


@_rule("MaskedSelect", "aclnn")
def _masked_select(attrs: dict, _: str) -> Contract:
    return Contract(
        "aclnnMaskedSelect", "out: the elements of self (its dtype) where the broadcast "
        "mask is set, row-major, 1-D",
        ("hicann/ops-math conversion/masked_select_v3/docs/aclnnMaskedSelect.md",
         "hicann/ops-math conversion/masked_select_v3/op_api/aclnn_masked_select.cpp",
         "hicann/ops-math conversion/masked_select_v3/op_api/masked_select.cpp"),
        values_of=(("y", "x"),), notes=_capacity_note(attrs))


@_rule("NonMaxSuppression", "aclnn", "onnx")
def _nms(attrs: dict, choice: str) -> Contract:
    if choice == "onnx":
        return Contract(
            "onnx", "ONNX NonMaxSuppression (opset 11, as ONNX Runtime runs it): the "
            "selected [batch, class, box] rows, INT64, compacted, with an OP_OUTSHAPE",
            ("onnx/docs/Operators.md#NonMaxSuppression",), notes=_capacity_note(attrs))
    for name in ("size", "max_detections", "pre_nms_top_k"):
        if attrs.get(name) is not None:
            raise OpArgumentError("golden NonMaxSuppression", name, "None: aclnnNonMaxSuppression "
                                  "has no such attr", repr(attrs[name]), "Use --contract onnx.")
    most = attrs.get("max_output_boxes_per_class", 0)
    if not 0 <= most <= ACLNN_NMS_MAX_PER_CLASS:
        raise OpArgumentError("golden NonMaxSuppression", "max_output_boxes_per_class",
                              f"an int in [0, {ACLNN_NMS_MAX_PER_CLASS}] (aclnnNonMaxSuppression "
                              "refuses more)", repr(most), "Use --contract onnx for more.")
    score = attrs.get("score_threshold")
    if score is None or not 0.0 <= score <= 1.0:
        raise OpArgumentError("golden NonMaxSuppression", "score_threshold", "a float in [0, 1] "
                              "(aclnnNonMaxSuppression's scoreThreshold)", repr(score))
    return Contract(
        "aclnnNonMaxSuppression", "selectedIndices INT32 [B*C*maxOutputBoxesPerClass, 3]: "
        "block b*C+c holds that batch and class's selected [b, c, box] rows by score, then "
        "rows of -1; no shape tensor; boxes (y1, x1, y2, x2) with y1<=y2, x1<=x2 "
        "(center_point_box=0) or (x_center, y_center, w, h); IoU > iouThreshold suppresses; "
        "score > scoreThreshold selects",
        (_NMS_DIR + "docs/aclnnNonMaxSuppression.md",
         _NMS_DIR + "op_host/op_api/aclnn_non_max_suppression.cpp",
         _NMS_DIR + "op_graph/non_max_suppression_v6_proto.h", _NMS_KERNEL),
        fixed_shape=True, index_dtype="int32",
        cann_attrs=(("maxOutputBoxesPerClass", [most]), ("centerPointBox",
                    attrs.get("center_point_box", 0)), ("max_boxes_size", None)),
        notes=("ties in score: the lower box index first (ONNX Runtime's order); the kernel's "
               "hardware sort leaves ties unspecified",
               "float16: IoU in float32 on the float16 values; the kernel works in float16 on "
               "coordinates scaled by 0.01 (its docs warn of differences)"))


@_rule("BatchedNMS", "torchvision")
def _batched(attrs: dict, _: str) -> Contract:
    return Contract("torchvision", "torchvision.ops.batched_nms: kept box indices by "
                    "decreasing score, INT64; CANN has no aclnn kernel for it (SortedNMS in "
                    "ops-cv is a graph op on sorted boxes)",
                    ("torchvision/ops/boxes.py", "hicann/ops-cv objdetect/sorted_nms/README.md"))


@_rule("EfficientNMS", "tensorrt")
def _efficient(attrs: dict, _: str) -> Contract:
    return Contract("tensorrt", "TensorRT EfficientNMS_TRT: fixed-shape, zero-padded outputs; "
                    "CANN has no aclnn kernel for it",
                    ("TensorRT plugin/efficientNMSPlugin/README.md",),
                    values_of=(("detection_boxes", "boxes"), ("detection_scores", "scores")),
                    index_dtype="int32")


def check_inputs(op: str, c: Contract, inputs: list, attrs: dict) -> None:
    """Refuses inputs the kernel's contract leaves undefined (named in the error).

    Examples:
      >>> c = contract("NonMaxSuppression", {"max_output_boxes_per_class": 1,
      ...                                     "score_threshold": 0.0}, "aclnn")
      >>> check_inputs("NonMaxSuppression", c, [np.array([[[0, 0, -1, 1]]], np.float32),
      ...               np.ones((1, 1, 1), np.float32)], {"center_point_box": 0})
      Traceback (most recent call last):
      ...
      jaxops.core.errors.OpArgumentError: golden NonMaxSuppression: argument 'boxes': expected boxes with y1 <= y2 and x1 <= x2 (aclnnNonMaxSuppression reads (y1, x1, y2, x2) and does not reorder), got box [0, 0] = [ 0.  0. -1.  1.].
    """
    if c.name != "aclnnNonMaxSuppression":
        return
    boxes, scores = (np.asarray(a) for a in inputs[:2])
    where = "golden NonMaxSuppression"
    for name, a in (("boxes", boxes), ("scores", scores)):
        if a.dtype not in (np.float16, np.float32):
            raise OpArgumentError(where, name, "float16 or float32 (aclnnNonMaxSuppression)",
                                  str(a.dtype), "Use --contract onnx.")
        if a.size and not np.isfinite(a.astype(np.float32)).all():
            raise OpArgumentError(where, name, "finite values (aclnnNonMaxSuppression defines "
                                  "no NaN or inf)", "a non-finite value", "Use --contract onnx.")
    if boxes.dtype != scores.dtype:
        raise OpArgumentError(where, "scores", f"boxes' dtype {boxes.dtype} (the kernel "
                              "requires one dtype)", str(scores.dtype))
    if attrs.get("center_point_box", 0) == 0 and boxes.size:
        bad = (boxes[..., 0] > boxes[..., 2]) | (boxes[..., 1] > boxes[..., 3])
        if bad.any():
            at = tuple(int(i[0]) for i in np.nonzero(bad))
            raise OpArgumentError(where, "boxes", "boxes with y1 <= y2 and x1 <= x2 "
                                  "(aclnnNonMaxSuppression reads (y1, x1, y2, x2) and does not "
                                  f"reorder)", f"box {list(at)} = {boxes[at]}")


def to_contract(op: str, c: Contract, outputs: list[GoldenOutput], inputs: dict,
                index_ports: set[str]) -> list[GoldenOutput]:
    """The outputs in the contract's dtypes and layout: values in their input's dtype,
    index outputs (``index_ports``) in ``c.index_dtype``, Unique's inverse in x's shape
    (aclnnUnique2's inverseOut), aclnnNonMaxSuppression's fixed blocks.

    Examples:
      >>> out = GoldenOutput("y", np.array([3, 5], np.int32), (8,), (2,), 0)
      >>> to_contract("MaskedSelect", contract("MaskedSelect", {}, None), [out],
      ...             {"x": np.zeros(8, np.int64)}, set())[0].data.dtype
      dtype('int64')
    """
    keep = dict(c.values_of)
    for out in outputs:
        if out.name in keep:
            out.data = out.data.astype(inputs[keep[out.name]].dtype, copy=False)
        elif out.name in index_ports:
            out.data = out.data.astype(c.index_dtype, copy=False)
    if c.name == "aclnnUnique2":
        inverse = next(o for o in outputs if o.name == "inverse_indices")
        shape = inputs["x"].shape
        inverse.data, inverse.max_shape = inverse.data.reshape(shape), shape
        inverse.true_shape = None
    if c.name == "aclnnNonMaxSuppression":
        return [_nms_blocks(outputs[0], inputs["scores"].shape, dict(c.cann_attrs))]
    return outputs


def _nms_blocks(rows: GoldenOutput, scores_shape: tuple, cann: dict) -> GoldenOutput:
    """ONNX's compacted rows (by batch, class, then selection) as the kernel's blocks: row
    ``r`` of batch ``b``, class ``c`` at ``(b*C + c)*M + r``; the rest -1, INT32."""
    b, c = scores_shape[:2]
    most = cann["maxOutputBoxesPerClass"][0]
    out = np.full((b * c * most, 3), -1, np.int32)
    sel = rows.data.astype(np.int64).reshape(-1, 3)
    if sel.size:
        block = sel[:, 0] * c + sel[:, 1]
        first = np.searchsorted(block, block, side="left")  # rows come grouped by block
        out[block * most + (np.arange(len(sel)) - first)] = sel
    return GoldenOutput(rows.name, out, out.shape, None, None)
