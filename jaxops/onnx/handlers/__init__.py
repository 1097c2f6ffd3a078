"""The handlers, one short function per ONNX op, by family; importing registers them all."""

from jaxops.onnx.handlers import (control, data_dependent, elementwise, layout, nn,  # noqa: F401
                                  reductions, resize)
