"""Capacities planned from statistics for a whole model: :class:`CapacityPlan` (what
:func:`jaxops.onnx.calibrate` makes, saved as a JSON file next to the model) and
:class:`SizeReport` (what each data-dependent tensor needed in one run, against its
capacity: returned by :meth:`jaxops.onnx.Program.sized`, jittable).

A plan gives each data-dependent tensor (the outputs of ``NonZero``, ``NonMaxSuppression``,
``Unique`` and ``Compress``, by output name) a capacity from the sizes it had over sample
inputs: mean + k·σ (the 3σ rule by default) or a quantile, rounded up, never above the
tensor's bound (its max shape without a plan). Under a plan an overflow is never silent:
inside ``jit`` the :class:`SizeReport` says which tensor and how much was lost (and the
outputs downstream carry it in their ``true_shape``); outside ``jit`` the program's
overflow policy applies (:func:`apply_policy`).

>>> plan = CapacityPlan({"idx": PlanEntry("NonZero", row_bytes=8, bound=64, capacity=8,
...                                         sizes=[3, 5, 4])})
>>> plan.capacities, plan.entries["idx"].summary()["max"]
({'idx': 8}, 5)
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxops.capacity.policy import KEEP, check_policy, settle, warn_once
from jaxops.core.errors import CapacityOverflowError, OpArgumentError

__all__ = ["FORMAT", "POLICIES", "CapacityPlan", "PlanEntry", "SizeReport", "apply_policy"]

#: The plan file's format tag (checked at load).
FORMAT = "jaxops.onnx.CapacityPlan/1"
#: What an eager call under a plan does when a tensor overflowed (jaxops.capacity's names):
#: ``"expand"`` reruns with the overflowed tensors at their bound, ``"truncate"`` warns and
#: keeps the result, ``"error"`` raises.
POLICIES = ("expand", "truncate", "error")


def _mb(n: float) -> str:
    return f"{n / 2 ** 20:.2f}"


@dataclasses.dataclass
class PlanEntry:
    """One tensor of a plan: its op, ``capacity``, ``bound`` (its max size without a plan),
    ``row_bytes`` (the bytes of the node's outputs per unit of size) and the ``sizes`` it
    had in calibration."""

    op: str
    row_bytes: int
    bound: int
    capacity: int
    sizes: list[int]

    def summary(self) -> dict:
        s = np.asarray(self.sizes, np.float64)
        return {"mean": float(s.mean()), "std": float(s.std()), "max": int(s.max()),
                "overflow_rate": float(np.mean(s > self.capacity))}


class CapacityPlan:
    """Capacities of a model's data-dependent tensors, by output name (see the module doc).
    ``load(model, capacities=plan)`` runs the model under it."""

    def __init__(self, entries: dict[str, PlanEntry], rule: dict | None = None):
        self.entries = dict(entries)
        self.rule = dict(rule or {})

    @property
    def capacities(self) -> dict[str, int]:
        return {name: e.capacity for name, e in self.entries.items()}

    def save(self, path: str | os.PathLike) -> None:
        """Writes the plan as JSON."""
        doc = {"format": FORMAT, "rule": self.rule,
               "tensors": {n: dataclasses.asdict(e) for n, e in self.entries.items()}}
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)

    @classmethod
    def load(cls, path: str | os.PathLike) -> CapacityPlan:
        """Reads a plan :meth:`save` wrote; anything else is refused naming the file."""
        where = "jaxops.onnx.CapacityPlan.load"
        try:
            with open(path) as f:
                doc = json.load(f)
            if doc.get("format") != FORMAT:
                raise ValueError(f"format {doc.get('format')!r}")
            entries = {}
            for name, e in doc["tensors"].items():
                entry = PlanEntry(str(e["op"]), int(e["row_bytes"]), int(e["bound"]),
                                  int(e["capacity"]), [int(s) for s in e["sizes"]])
                if not 1 <= entry.capacity <= max(entry.bound, 1):
                    raise ValueError(f"tensor {name!r}: capacity {entry.capacity} outside "
                                     f"[1, {entry.bound}]")
                entries[name] = entry
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise OpArgumentError(where, "path", f"a capacity plan file ({FORMAT})",
                                  f"{os.fspath(path)!r} ({type(e).__name__}: {e})") from e
        return cls(entries, doc.get("rule"))

    def report(self, file=None) -> str:
        """Prints (and returns) memory planned against the bound and against what the
        calibration samples used (their mean), per tensor and in total (MiB)."""
        head = (f"{'tensor':28s} {'op':17s} {'bound':>8s} {'capacity':>8s} {'mean':>8s} "
                f"{'max':>7s} {'bound MiB':>9s} {'plan MiB':>8s} {'used MiB':>8s} "
                f"{'saving':>7s} {'density':>7s} {'overflow':>8s}")
        lines, total = [head, "-" * len(head)], np.zeros(3)
        for name, e in self.entries.items():
            s = e.summary()
            mem = np.array([e.bound, e.capacity, min(s["mean"], e.capacity)]) * e.row_bytes
            total += mem
            lines.append(f"{name[:28]:28s} {e.op[:17]:17s} {e.bound:8d} {e.capacity:8d} "
                         f"{s['mean']:8.1f} {s['max']:7d} {_mb(mem[0]):>9s} {_mb(mem[1]):>8s} "
                         f"{_mb(mem[2]):>8s} {1 - mem[1] / max(mem[0], 1):7.1%} "
                         f"{mem[2] / max(mem[1], 1):7.1%} {s['overflow_rate']:8.1%}")
        lines.append(f"{'total':28s} {'':17s} {'':8s} {'':8s} {'':8s} {'':7s} "
                     f"{_mb(total[0]):>9s} {_mb(total[1]):>8s} {_mb(total[2]):>8s} "
                     f"{1 - total[1] / max(total[0], 1):7.1%} "
                     f"{total[2] / max(total[1], 1):7.1%}")
        text = "\n".join(lines)
        print(text, file=file)
        return text

    def __repr__(self) -> str:
        return f"CapacityPlan({len(self.entries)} tensors, rule={self.rule})"


@jax.tree_util.register_pytree_node_class
class SizeReport:
    """What each data-dependent tensor of one run needed (``needed``: name -> int32 size
    along its capacity axis, traced inside jit) against the ``capacity`` it ran at, its
    ``bound`` and ``row_bytes``. Jittable (a pytree)."""

    def __init__(self, needed: dict[str, Any], info: dict[str, tuple]):
        self.needed, self.info = dict(needed), dict(info)  # info: (op, capacity, bound, row)

    def tree_flatten(self):
        names = tuple(self.needed)
        return tuple(self.needed[n] for n in names), (names, tuple(self.info[n] for n in names))

    @classmethod
    def tree_unflatten(cls, aux, children):
        names, info = aux
        return cls(dict(zip(names, children)), dict(zip(names, info)))

    def capacity(self, name: str) -> int:
        return self.info[name][1]

    def lost(self) -> dict[str, Any]:
        """Per tensor, the results an overflow cut (``needed - capacity``, at least 0):
        traced inside jit."""
        return {n: jnp.maximum(jnp.asarray(v) - self.capacity(n), 0)
                for n, v in self.needed.items()}

    def overflowed(self) -> Any:
        """Whether any tensor overflowed (a bool, traced inside jit)."""
        flags = [jnp.asarray(v) > self.capacity(n) for n, v in self.needed.items()]
        return jnp.any(jnp.stack(flags)) if flags else jnp.asarray(False)

    def cut(self) -> dict[str, tuple[int, int]]:
        """Host side: ``{tensor: (capacity, needed)}`` of the tensors that overflowed."""
        needed = jax.device_get(self.needed)
        return {n: (self.capacity(n), int(v)) for n, v in needed.items()
                if int(v) > self.capacity(n)}

    def table(self, file=None) -> str:
        """Host side: prints (and returns) memory planned against used, per tensor and in
        total (MiB), with what each overflow lost."""
        needed = jax.device_get(self.needed)
        head = (f"{'tensor':28s} {'op':17s} {'capacity':>8s} {'bound':>8s} {'needed':>7s} "
                f"{'lost':>6s} {'plan MiB':>8s} {'used MiB':>8s} {'bound MiB':>9s}")
        lines, total = [head, "-" * len(head)], np.zeros(3)
        for n, (op, cap, bound, row) in self.info.items():
            v = int(needed[n])
            mem = np.array([cap, min(v, cap), bound]) * row
            total += mem
            lines.append(f"{n[:28]:28s} {op[:17]:17s} {cap:8d} {bound:8d} {v:7d} "
                         f"{max(v - cap, 0):6d} {_mb(mem[0]):>8s} {_mb(mem[1]):>8s} "
                         f"{_mb(mem[2]):>9s}")
        lines.append(f"{'total':28s} {'':17s} {'':8s} {'':8s} {'':7s} {'':6s} "
                     f"{_mb(total[0]):>8s} {_mb(total[1]):>8s} {_mb(total[2]):>9s}")
        text = "\n".join(lines)
        print(text, file=file)
        return text


def check_plan_policy(policy: str) -> str:
    """``policy`` among :data:`POLICIES` (jaxops.capacity's names; ``"host"`` has no
    meaning for a whole model)."""
    check_policy("jaxops.onnx.load", policy)
    if policy not in POLICIES:
        raise OpArgumentError("jaxops.onnx.load", "overflow", "one of " + ", ".join(
            repr(p) for p in POLICIES) + " under a capacity plan", repr(policy))
    return policy


def apply_policy(attempt: Callable[[dict], tuple[Any, SizeReport]], capacities: dict,
                 policy: str) -> Any:
    """Runs ``attempt(capacities) -> (outputs, report)`` outside jit and applies ``policy``
    to the tensors that overflowed: ``"expand"`` reruns with them at their bound (again
    while a tensor downstream of them overflows in turn), ``"truncate"`` warns once per
    call site, ``"error"`` raises :class:`~jaxops.errors.CapacityOverflowError` naming the
    tensor. Returns the outputs."""
    def shortfall(result):
        report = result[1]
        return report if report.cut() else None

    def remedy(caps, report):
        cut = report.cut()
        name, (cap, needed) = next(iter(cut.items()))
        lost = sum(n - c for c, n in cut.values())
        if policy == "error":
            raise CapacityOverflowError(
                f"jaxops.onnx: tensor {name!r}", cap, needed,
                f"({len(cut)} tensors over their planned capacity: {sorted(cut)}). Rerun "
                "with overflow='expand', or calibrate the plan on more samples.",
                lost_results=lost)
        if policy == "truncate":
            warn_once(f"jaxops.onnx: {len(cut)} tensors overflowed their planned capacity "
                      f"(first {name!r}: capacity {cap}, needed {needed}); {lost} results "
                      "lost (SizeReport.lost() tells them inside jit).")
            return KEEP
        return {**caps, **{n: report.info[n][2] for n in cut}}  # each at its bound

    outs, _ = settle(attempt, dict(capacities), shortfall=shortfall, remedy=remedy,
                     tries=max(len(capacities), 1))
    return outs
