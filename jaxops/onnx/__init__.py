"""ONNX models with data-dependent shapes as jittable JAX functions (the dual shape through
whole programs).

``jaxops.onnx.load(model)`` turns an ONNX model into a function of its graph inputs; under
``jax.jit`` every input of the same shapes shares one compile, whatever the data. Every
tensor in it is a plain array or a dual-shape value (max shape planned at trace time,
actual shape traced): integer tensors that feed shapes carry static bounds beside their
traced value, so ``Reshape``, ``Expand``, ``Range``, ``TopK``'s ``k`` and the rest get a
static max shape; every op reads only the valid region (:mod:`jaxops.dynamic.rules`); the
data-dependent ops are jaxops' own operators. Outputs come back as arrays or
:class:`~jaxops.DynArray`; :func:`jaxops.refresh` gives exact arrays.

Needs the ``onnx`` package (``pip install jaxops[onnx]``); ``import jaxops`` does not
import it. See ``docs/onnx.md``.
"""

from jaxops.onnx.calibrate import calibrate
from jaxops.onnx.plan import CapacityPlan, SizeReport
from jaxops.onnx.program import OPSETS, Program, load, supported_ops

__all__ = ["OPSETS", "CapacityPlan", "Program", "SizeReport", "calibrate", "load",
           "supported_ops"]
