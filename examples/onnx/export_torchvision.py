"""Exports torchvision's detection models to ONNX (opset 17), random weights, no downloads.

torch is NOT a dependency of jaxops, nor a test extra: install it in a separate virtual
environment, outside the repository, and run this script with that environment's python:

    python3 -m venv /tmp/torchenv
    /tmp/torchenv/bin/pip install torch torchvision onnx   # CPU wheels are enough
    /tmp/torchenv/bin/python examples/onnx/export_torchvision.py --out /tmp/onnx_models
    /tmp/torchenv/bin/python examples/onnx/export_torchvision.py --small \\
        --out tests/onnx/data                              # the committed test models

Full size (``--out``, for ``benchmarks/onnx_models.py``): SSDlite320-MobileNetV3,
RetinaNet-ResNet50-FPN, FCOS-ResNet50-FPN and Faster R-CNN MobileNetV3-320-FPN as
torchvision builds them (``weights=None, weights_backbone=None``), their classification
heads then set so that they detect (:data:`_LOGITS`): with torchvision's random
initialisation RetinaNet and FCOS detect nothing and the others only ties, and comparing
empty or tied detections with ONNX Runtime's would check nothing.

Small (``--small``, the test data): the same detection heads and post-processing (anchors,
box coding, score filters, top-k, batched NMS, RoIAlign, the transform's resize), on tiny
backbones (MobileNetV3 at width 0.1; a four-stage ResNet of BasicBlocks 8-32 channels wide)
and 64x64 images (FCOS 128x128), a few hundred kB each. Seeds are fixed, so a rerun gives the same files.
"""

from __future__ import annotations

import argparse
import pathlib
from functools import partial

import torch


def _stand_in_ops() -> None:
    """CPU torch with a torchvision wheel built for CUDA torch cannot load torchvision's C++
    ops; exporting needs only their schemas and shapes (the ONNX graph gets
    NonMaxSuppression and RoiAlign from torchvision's symbolics), so stand-ins are defined
    in Python. A torchvision whose ops load is used as it is."""
    import importlib.util
    import pathlib as _p
    so = _p.Path(importlib.util.find_spec("torchvision").origin).parent / "_C.so"
    try:
        torch.ops.load_library(str(so))
        return
    except OSError:
        pass
    lib = torch.library.Library("torchvision", "DEF")  # noqa: F841 (kept alive below)
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
               "SymInt pooled_width, int sampling_ratio, bool aligned) -> Tensor")

    def nms(dets, scores, iou_threshold):
        order, keep = torch.argsort(scores, descending=True, stable=True), []
        area = (dets[:, 2] - dets[:, 0]) * (dets[:, 3] - dets[:, 1])
        alive = torch.ones(len(order), dtype=torch.bool)
        for a, i in enumerate(order.tolist()):
            if not alive[a]:
                continue
            keep.append(i)
            rest = order[a + 1:]
            lt = torch.maximum(dets[i, :2], dets[rest, :2])
            rb = torch.minimum(dets[i, 2:], dets[rest, 2:])
            inter = (rb - lt).clamp(min=0).prod(dim=1)
            alive[a + 1:] &= inter / (area[i] + area[rest] - inter) <= iou_threshold
        return torch.tensor(keep, dtype=torch.int64)

    def roi_align(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned):
        return input.new_zeros((rois.shape[0], input.shape[1], pooled_height, pooled_width))

    lib.impl("nms", nms, "CPU")
    lib.impl("qnms", nms, "CPU")
    lib.impl("roi_align", roi_align, "CPU")
    _stand_in_ops.lib = lib
    import torchvision.extension
    torchvision.extension._has_ops = _has_ops


def _has_ops() -> bool:  # torch.jit.script reads this function's source
    return True


_stand_in_ops()
import torchvision  # noqa: E402
import sys  # noqa: E402

if getattr(_stand_in_ops, "lib", None) is not None:  # the module took the name at import
    sys.modules["torchvision.ops.roi_align"]._has_ops = _has_ops
from torch import nn  # noqa: E402
from torchvision.models import detection
from torchvision.models.detection import ssdlite
from torchvision.models.detection.anchor_utils import AnchorGenerator, DefaultBoxGenerator
from torchvision.models.detection.backbone_utils import BackboneWithFPN, _mobilenet_extractor
from torchvision.models.detection.faster_rcnn import FastRCNNPredictor, TwoMLPHead
from torchvision.models.resnet import BasicBlock
from torchvision.ops import MultiScaleRoIAlign
from torchvision.ops.feature_pyramid_network import LastLevelMaxPool, LastLevelP6P7

OPSET = 17
SMALL_IMAGE = {"ssdlite": 64, "retinanet": 64, "fcos": 128, "fasterrcnn": 64}  # FCOS: GroupNorm(32) needs P7 > 1x1
FULL_IMAGE = {"ssdlite": 320, "retinanet": 512, "fcos": 512, "fasterrcnn": 320}


class _Body(nn.Module):
    """A ResNet of four BasicBlock stages (``layer1``..``layer4``), narrow: what the FPN
    models' tiny backbones stand on."""

    def __init__(self, widths=(8, 16, 24, 32), pool=True):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, 2, 1, bias=False),
                                  nn.BatchNorm2d(widths[0]), nn.ReLU(inplace=True),
                                  nn.MaxPool2d(3, 2, 1) if pool else nn.Identity())
        inplanes = widths[0]
        for k, w in enumerate(widths):
            stride = 1 if k == 0 else 2
            down = None if stride == 1 and inplanes == w else nn.Sequential(
                nn.Conv2d(inplanes, w, 1, stride, bias=False), nn.BatchNorm2d(w))
            setattr(self, f"layer{k + 1}", BasicBlock(inplanes, w, stride, down))
            inplanes = w


def _tiny_resnet_fpn(extra, returned=(2, 3, 4), out_channels=16, pool=True):
    body = _Body(pool=pool)
    widths = (8, 16, 24, 32)
    return BackboneWithFPN(body, {f"layer{k}": str(v) for v, k in enumerate(returned)},
                           [widths[k - 1] for k in returned], out_channels, extra_blocks=extra)


def _tiny_mobilenet(**kw):
    return torchvision.models.mobilenet_v3_large(weights=None, width_mult=0.1,
                                                 reduced_tail=True, **kw)


def build(name: str, small: bool) -> tuple[nn.Module, int]:
    """The model (eval mode, seeded random weights) and its square image size."""
    torch.manual_seed(0)
    if not small:
        builder = {"ssdlite": detection.ssdlite320_mobilenet_v3_large,
                   "retinanet": detection.retinanet_resnet50_fpn,
                   "fcos": detection.fcos_resnet50_fpn,
                   "fasterrcnn": detection.fasterrcnn_mobilenet_v3_large_320_fpn}[name]
        model = builder(weights=None, weights_backbone=None).eval()
        _detecting(model, name)
        return model, FULL_IMAGE[name]
    size, classes = SMALL_IMAGE[name], 5
    common = dict(min_size=size, max_size=size)
    if name == "ssdlite":
        norm = partial(nn.BatchNorm2d, eps=0.001, momentum=0.03)
        features = _tiny_mobilenet(norm_layer=norm).features
        c4_pos = [i for i, b in enumerate(features) if getattr(b, "_is_cn", False)][-1]
        backbone = ssdlite.SSDLiteFeatureExtractorMobileNet(features, c4_pos, norm,
                                                            width_mult=0.05, min_depth=8)
        anchors = DefaultBoxGenerator([[2, 3] for _ in range(6)], min_ratio=0.2, max_ratio=0.95)
        channels = detection._utils.retrieve_out_channels(backbone, (size, size))
        head = ssdlite.SSDLiteHead(channels, anchors.num_anchors_per_location(), classes, norm)
        model = detection.ssd.SSD(backbone, anchors, (size, size), classes, head=head,
                              score_thresh=0.3, nms_thresh=0.55, detections_per_img=300,
                              topk_candidates=300, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    elif name == "retinanet":
        model = detection.retinanet.RetinaNet(_tiny_resnet_fpn(LastLevelP6P7(16, 16)), classes,
                                    anchor_generator=AnchorGenerator(
                                        tuple((s,) for s in (8, 16, 32, 64, 128)),
                                        ((0.5, 1.0, 2.0),) * 5), score_thresh=0.6,
                                    **common)
    elif name == "fcos":
        model = detection.fcos.FCOS(_tiny_resnet_fpn(LastLevelP6P7(32, 32), out_channels=32, pool=False), classes,  # GroupNorm(32)
                               anchor_generator=AnchorGenerator(
                                   tuple((s,) for s in (8, 16, 32, 64, 128)), ((1.0,),) * 5),
                               score_thresh=0.66, **common)
    elif name == "fasterrcnn":
        body = _mobilenet_extractor(_tiny_mobilenet(), True, 6)
        # the FPN's 256 channels are the model's bulk: rebuild it 16 wide
        fpn_in = [m.in_channels for m in body.fpn.inner_blocks.modules()
                  if isinstance(m, nn.Conv2d)]
        body = BackboneWithFPN(body.body, body.body.return_layers, fpn_in, 16,
                               extra_blocks=LastLevelMaxPool())
        sizes = ((8, 16, 32, 64, 128),) * 3
        model = detection.faster_rcnn.FasterRCNN(
            body, None, rpn_anchor_generator=AnchorGenerator(sizes, ((0.5, 1.0, 2.0),) * 3),
            box_roi_pool=MultiScaleRoIAlign(["0", "1", "pool"], 7, 2),
            box_head=TwoMLPHead(16 * 7 * 7, 32), box_predictor=FastRCNNPredictor(32, classes),
            rpn_pre_nms_top_n_test=150, rpn_post_nms_top_n_test=100, box_score_thresh=0.4,
            **common)
    else:
        raise SystemExit(f"unknown model {name!r}")
    _spread_scores(model)
    if name == "fasterrcnn":  # box deltas near 0: proposals and boxes stay on the image
        for layer in (model.rpn.head.bbox_pred, model.roi_heads.box_predictor.bbox_pred):
            layer.weight.data *= 0.05
        for layer in (model.rpn.head.cls_logits, model.roi_heads.box_predictor.cls_score):
            layer.weight.data *= 0.03  # scores not saturated (no ties at 1.0)
    return model.eval(), size


#: Full size: how the random-weight classification heads are set so that the models detect
#: as a trained one does on a busy photo, with scores spread (no ties), so that "the same
#: detections as ONNX Runtime" means something. torchvision's initialisation detects
#: nothing useful: RetinaNet's and FCOS's heads start at weights N(0, 0.01) and a 0.01
#: prior (bias -log 99), so every logit lies within -4.6 +- 0.3 and no score reaches their
#: thresholds (0.05; FCOS sqrt(p * centerness) > 0.2); Faster R-CNN's box predictor gives
#: every class 1/91 < 0.05; SSDlite's N(0, 0.03) weights shrink the signal to 1e-15 before
#: its head, so all 300 of its detections score exactly 1/91 (ties, in any order). Per
#: model: (a factor on the last classification layer's weights, its bias; for SSDlite the
#: background class's bias, for SSDlite and Faster R-CNN after a variance-preserving
#: initialisation of the whole model, which puts Faster R-CNN's class logits at a std of
#: about 300: the factor brings it to 2). On uniform-noise images (ONNX Runtime, seeds 0-2)
#: RetinaNet keeps 300 detections of 6-7 labels, FCOS 100 of 2, SSDlite 300 of 43-47 and
#: Faster R-CNN 43-46 of 7-12, the nearest two scores at least 4e-5 apart.
_LOGITS = {"retinanet": (3.0, -5.7), "fcos": (3.0, -5.0), "ssdlite": (0.5, 13.0),
           "fasterrcnn": (0.006, 0.0)}


def _detecting(model: nn.Module, name: str) -> None:
    """Sets the full-size classification head (:data:`_LOGITS`)."""
    factor, bias = _LOGITS[name]
    if name == "fasterrcnn":  # as the small model: spread, boxes near their anchors
        _spread_scores(model)
        for layer in (model.rpn.head.bbox_pred, model.roi_heads.box_predictor.bbox_pred):
            layer.weight.data *= 0.05
        model.roi_heads.box_predictor.cls_score.weight.data *= factor
        nn.init.constant_(model.roi_heads.box_predictor.cls_score.bias, bias)
        return
    if name == "ssdlite":
        _spread_scores(model)
        for block in model.head.classification_head.module_list:
            block[1].weight.data *= factor
            block[1].bias.data.view(-1, 91)[:, 0] = bias  # channels: anchor * 91 + class
        return
    layer = model.head.classification_head.cls_logits
    layer.weight.data *= factor
    nn.init.constant_(layer.bias, bias)


def _spread_scores(model: nn.Module) -> None:
    """Variance-preserving random weights (torchvision's heads start at std 0.01 and a
    prior bias, so every random-weight score would be about the same and the tiny models
    would detect nothing, or everything): scores then spread, and counts differ by image."""
    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            fan_in = m.weight[0].numel()
            nn.init.normal_(m.weight, 0.0, (2.0 / fan_in) ** 0.5)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
    head = getattr(getattr(model, "head", None), "classification_head", None)
    if hasattr(head, "cls_logits"):  # logits about N(0, 1) rather than saturated
        head.cls_logits.weight.data *= 0.02


class _Tensors(nn.Module):
    """The model with one batched image in, tensors out (boxes, scores, labels)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, images):
        out = self.model(list(images))[0]
        return out["boxes"], out["scores"], out["labels"]


def export(name: str, small: bool, out: pathlib.Path) -> pathlib.Path:
    model, size = build(name, small)
    path = out / f"{name}{'_small' if small else ''}.onnx"
    image = torch.rand(1, 3, size, size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.onnx.export(_Tensors(model), (image,), str(path), opset_version=OPSET,
                          input_names=["images"], output_names=["boxes", "scores", "labels"],
                          dynamo=False, do_constant_folding=True)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--small", action="store_true", help="the tiny test versions")
    parser.add_argument("--only", nargs="*", default=list(FULL_IMAGE))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.only:
        path = export(name, args.small, args.out)
        print(f"{path}: {path.stat().st_size / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
