"""Tests of jaxops/ops/nms: the NMS family, its core and the detection options."""
