"""Non-maximum suppression: ONNX NonMaxSuppression, torchvision nms / batched_nms (BatchedNMS)
and TensorRT EfficientNMS, with the pieces they share.

- :mod:`.suppression` — NonMaxSuppression and its user API;
- :mod:`.batched` — BatchedNMS, ``batched_nms`` and ``nms``;
- :mod:`.efficient_nms` — EfficientNMS;
- :mod:`.pipeline` — one image's xla NMS, start to end;
- :mod:`.candidates` — the score filter, the candidate cut by score, the orders and limits;
- :mod:`.bitmask` — greedy suppression from a blocked IoU bitmask (torchvision's CUDA scheme);
- :mod:`.iou` — box decoding and intersection-over-union.

Importing this package registers the three operators.
"""

from jaxops.ops.nms.batched import batched_nms, nms
from jaxops.ops.nms.efficient_nms import EfficientNMSOutput, efficient_nms
from jaxops.ops.nms.suppression import non_max_suppression

__all__ = ["EfficientNMSOutput", "batched_nms", "efficient_nms", "nms", "non_max_suppression"]
