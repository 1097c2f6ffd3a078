"""ONNX's backend node test cases, under jit, x64 off and on, as a parametrized matrix.

By default one case per op runs (the first by name, about 130: the suite's time budget);
``JAXOPS_ONNX_CONFORMANCE=all`` runs every applicable case (about 1,360, ~2.5 min per x64
mode). A case that needs 64-bit values with x64 off must be refused with the library's
error (``OpDTypeError``) or is reported as needing x64 (``xfail``, strict). Cases whose
failure is known are listed in ``KNOWN`` with the reason (``xfail``, strict).
"""

import os
import pathlib

import jax
import pytest

pytest.importorskip("onnx")

from jaxops.errors import OpDTypeError  # noqa: E402
from tests.onnx import conformance  # noqa: E402

KNOWN = {  # prefix of case names -> why they fail today
    "test_cast": "float8 / int4 / string casts and saturation are not implemented",
    "test_castlike": "float8 / int4 / string casts and saturation are not implemented",
    "test_resize_downsample_scales_cubic": "Resize: cubic mode not implemented",
    "test_resize_upsample_scales_cubic": "Resize: cubic mode not implemented",
    "test_resize_downsample_scales_linear_antialias": "Resize: antialias not implemented",
    "test_resize_downsample_sizes_linear_antialias": "Resize: antialias not implemented",
    "test_resize_downsample_sizes_cubic": "Resize: cubic mode not implemented",
    "test_resize_upsample_sizes_cubic": "Resize: cubic mode not implemented",
    "test_resize_downsample_scales_cubic_antialias": "Resize: antialias not implemented",
    "test_resize_downsample_sizes_cubic_antialias": "Resize: antialias not implemented",
    "test_resize_tf_crop_and_resize": "Resize: tf_crop_and_resize extrapolation not implemented",
    "test_resize_upsample_sizes_nearest_not": "Resize: keep_aspect_ratio_policy not implemented",
    "test_resize_downsample_sizes_nearest_not": "Resize: keep_aspect_ratio_policy not implemented",
    "test_layer_normalization": "LayerNormalization: negative axes in the expanded function",
    "test_center_crop_pad": "CenterCropPad's expanded function pads a traced amount",
    "test_attention": "Attention's expanded function (bf16 causal masks)",
    "test_batchnorm_": "BatchNormalization training mode outputs",
    "test_training_dropout": "Dropout training mode (random masks)",
    "test_affine_grid": "AffineGrid's expanded function plans an unbounded Expand",
    "test_loop11": "Loop with a traced trip count and scan outputs",
    "test_upsample": "Upsample (opset 7-9) scales read as an attribute",
    "test_maxpool": "MaxPool: indices output / storage order",
    "test_reduce": "reduce over empty axes or an empty set",
    "test_flatten": "Flatten of a rank-0 / negative-axis case",
    "test_equal": "Equal on strings",
    "test_not": "Not (opset 1) of a bool type the harness cannot feed",
    "test_identity": "Identity of optional / sequence types",
    "test_spacetodepth": "SpaceToDepth of a non-4-D case",
    "test_convtranspose": "ConvTranspose with output_shape and auto_pad",
    "test_range_": "Range's expanded function is a Loop with a traced trip count",
    "test_blackmanwindow": "window functions' expanded Range of an unbounded size",
    "test_hannwindow": "window functions' expanded Range of an unbounded size",
    "test_hammingwindow": "window functions' expanded Range of an unbounded size",
}


#: The cases failing today (a full run with x64 off), each matched to a reason in KNOWN.
KNOWN_FAILING = set((pathlib.Path(__file__).parent / "known_failures.txt").read_text().split())


def _selected() -> list[str]:
    names = sorted(conformance.cases())
    if os.environ.get("JAXOPS_ONNX_CONFORMANCE") == "all":
        return names
    first = {}
    for name in names:
        op = next(iter(sorted(conformance._ops(conformance.cases()[name].model.graph))))
        first.setdefault(op, name)
    return sorted(first.values())


@pytest.mark.parametrize("x64", [False, True], ids=["x64_off", "x64_on"])
@pytest.mark.parametrize("name", _selected())
def test_backend_node_case(name, x64):
    case = conformance.cases()[name]
    known = next((why for prefix, why in KNOWN.items() if name.startswith(prefix)), None) \
        if name in KNOWN_FAILING else None
    with jax.enable_x64(x64):
        wide = not x64 and conformance.needs_x64(case)
        try:
            conformance.run(case)
        except OpDTypeError as e:
            assert wide, f"refused without a 64-bit value: {e}"
            return  # the expected refusal, with the library's error
        except Exception:
            if wide:
                pytest.xfail("needs 64-bit values with x64 off")
            if known:
                pytest.xfail(known)
            raise
    assert not (known and not wide), f"{name} passes now: remove it from KNOWN ({known})"
