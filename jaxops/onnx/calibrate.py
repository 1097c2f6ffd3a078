"""``calibrate(model, samples)``: a model's capacity plan from the sizes its data-dependent
tensors had over sample inputs (:class:`~jaxops.onnx.CapacityPlan`).

>>> import numpy as np, jaxops.onnx
>>> from onnx import helper, TensorProto as T
>>> g = helper.make_graph([helper.make_node("NonZero", ["x"], ["idx"])], "g",
...     [helper.make_tensor_value_info("x", T.FLOAT, [64])],
...     [helper.make_tensor_value_info("idx", T.INT64, [1, "n"])])
>>> model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
>>> rng = np.random.default_rng(0)
>>> samples = [(np.where(rng.random(64) < 0.1, 1.0, 0.0).astype(np.float32),) for _ in range(20)]
>>> plan = jaxops.onnx.calibrate(model, samples)
>>> plan.entries["idx"].bound, plan.capacities["idx"] <= 24
(64, True)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import jax

from jaxops.capacity import CapacityStats, recommend
from jaxops.core.errors import OpArgumentError
from jaxops.onnx.plan import CapacityPlan, PlanEntry
from jaxops.onnx.program import Program, load

__all__ = ["calibrate"]


def calibrate(model: Any, samples: Iterable, *, policy: str = "sigma", k: float = 3.0,
              q: float = 0.999, round_to: str | int | None = 8) -> CapacityPlan:
    """Runs ``model`` (a path, an ``onnx.ModelProto`` or a loaded :class:`Program`) at its
    bounds on every sample (a tuple of the graph inputs in order, or a dict by name), under
    jit (one compile per input shape), records the size every data-dependent tensor needed,
    and plans each a capacity: ``policy="sigma"`` mean + ``k``·σ (the 3σ rule), or
    ``"quantile"`` the ``q`` quantile; rounded up to a multiple of ``round_to`` (or a power
    of two: ``"pow2"``; ``None``: not rounded), never above the tensor's bound
    (:func:`jaxops.capacity.recommend`). Save it with :meth:`CapacityPlan.save`; run under
    it with ``jaxops.onnx.load(model, capacities=plan)``."""
    if isinstance(model, Program):
        program = Program(model.proto, model.folder, model.opset, None, None, model.fill_value)
    else:
        program = load(model)
    run = jax.jit(program.sized)
    stats: dict[str, CapacityStats] = {}
    info: dict[str, tuple] = {}
    count = 0
    for sample in samples:
        args, kwargs = ((), dict(sample)) if isinstance(sample, Mapping) else (tuple(sample), {})
        program.check_inputs(*args, **kwargs)
        _, report = run(*args, **kwargs)
        for name, size in jax.device_get(report.needed).items():
            op, _, bound, row = report.info[name]
            info[name] = (op, max(bound, info.get(name, (op, 0, 0))[1]), row)
            stats.setdefault(name, CapacityStats(name)).record(int(size))
        count += 1
    if not count:
        raise OpArgumentError("jaxops.onnx.calibrate", "samples", "at least one sample "
                              "(a tuple of the graph inputs, or a dict by name)", "none")
    entries = {}
    for name, s in stats.items():
        op, bound, row = info[name]
        cap = recommend(s, policy=policy, k=k, q=q, round_to=round_to,
                        theoretical_max=max(bound, 1))
        entries[name] = PlanEntry(op, row, bound, cap, [int(v) for v in s.sizes])
    rule = {"policy": policy, "k": k} if policy == "sigma" else {"policy": policy, "q": q}
    return CapacityPlan(entries, {**rule, "round_to": round_to})
