"""The shared operator test matrix: one row (:class:`OpCase`) per operator configuration.

Every row is checked eagerly, under ``jit``, under ``vmap`` (a batch of independent
inputs), through ``tracing.launch`` with OP_OUTSHAPE, and — when it declares
``grad_argnums`` — under ``jax.grad`` against its numpy gradient reference. Rows live in
``tests/helpers/cases/<op>.py`` as a list ``CASES``.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Callable
from typing import Any

import numpy as np

from tests.helpers.util import expected_truncation


@dataclasses.dataclass
class OpCase:
    """One operator configuration and its numpy reference.

    - ``fn(*inputs, **attrs)``: the functional API; returns DynArrays / arrays (a pytree).
    - ``make_inputs(rng)``: numpy inputs; the shapes must not depend on ``rng``.
    - ``reference(*inputs, **attrs)``: the exact expected result with the structure of
      ``jaxops.refresh(fn(...))``.
    - ``launch_outputs(result)``: maps ``tracing.launch``'s output list to that structure
      (``None``: the row is not launched).
    - ``grad_argnums`` / ``grad_reference(*inputs, cotangent, **attrs)``: for ``jax.grad``
      of ``sum(cotangent * valid data)``; returns the gradient of each argnum.
    """

    id: str
    op: str
    fn: Callable[..., Any]
    make_inputs: Callable[[np.random.Generator], tuple]
    reference: Callable[..., Any]
    attrs: dict = dataclasses.field(default_factory=dict)
    launch_outputs: Callable[[list], Any] | None = lambda outs: outs[0]
    vmap: bool = True
    grad_argnums: tuple[int, ...] = ()
    grad_reference: Callable[..., Any] | None = None
    rtol: float = 0.0  # 0: exact comparison

    def __str__(self) -> str:
        return self.id


def TRUNCATE(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with ``overflow="truncate"``: rows that test a capacity overflow compare the
    truncated result (what jit and launch give) eagerly too, not the "expand" rerun. The
    policy's CapacityOverflowWarning is expected here and silenced (its wording and
    once-per-site rule are asserted in tests/capacity/test_overflow_policies.py); ``truncates``
    marks the row for the launch test, which silences the launch's warning the same way."""
    def truncating(*args, **kwargs):
        with expected_truncation():
            return fn(*args, overflow="truncate", **kwargs)
    truncating.truncates = True
    return truncating



def all_cases() -> list[OpCase]:
    """Every row from every module in ``tests/helpers/cases``."""
    import tests.helpers.cases as pkg

    cases = []
    for mod in pkgutil.iter_modules(pkg.__path__):
        cases.extend(importlib.import_module(f"{pkg.__name__}.{mod.name}").CASES)
    return cases
