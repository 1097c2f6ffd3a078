"""Non-maximum suppression: ONNX NonMaxSuppression, torchvision nms / batched_nms (BatchedNMS)
and TensorRT EfficientNMS, with the box decoding and overlap test they share.

- :mod:`.suppression` — NonMaxSuppression, BatchedNMS and their user API;
- :mod:`.efficient_nms` — EfficientNMS;
- :mod:`.tiled` — the greedy suppression loop over score-sorted tiles;
- :mod:`.iou` — box decoding and intersection-over-union.

Importing this package registers the three operators.
"""

from jaxops.ops.nms.efficient_nms import EfficientNMSOutput, efficient_nms
from jaxops.ops.nms.suppression import batched_nms, nms, non_max_suppression

__all__ = ["EfficientNMSOutput", "batched_nms", "efficient_nms", "nms", "non_max_suppression"]
