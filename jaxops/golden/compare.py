"""Comparing an NPU's outputs with a golden case (``jaxops golden compare GOLDEN ACTUAL``).

ACTUAL is a ``.npz`` holding the case's outputs by name (``y`` or ``output_y``), or a folder
of raw little-endian ``.bin`` files named the same (``y.bin`` / ``output_y.bin``, typed by
the golden description). An output may be given at its actual shape or as the whole
max-shape buffer the kernel wrote; a buffer is cut by the NPU's own OP_OUTSHAPE when ACTUAL
holds one (``outshape`` / ``outshape.bin``, int64 words), else by the golden actual shape.

- Integer, bool and index outputs must be equal, element for element.
- Float outputs follow CANN's precision standard for operators (opbase,
  ``docs/en/ops_precision_standard/experimental_standard.md``, which ops-nn's
  CONTRIBUTING.md requires of new operators): with ``rel = |actual - golden| /
  (|golden| + 1e-7)``, MERE = mean(rel) must be below the dtype's threshold T and MARE =
  max(rel) below 10·T; T = 2^-10 (float16), 2^-7 (bfloat16), 2^-13 (float32). The standard
  has no float64 row: float64 takes float32's T. Where the golden value is NaN or ±inf the
  actual value must be the same (the standard does not say; a relative error is undefined).
- A hash table's bucket bytes (the table cases' ``table`` outputs): every byte equal but
  the rows', which are float32 under the standard (ApplyAdamW computes them).

>>> import tempfile, os
>>> from jaxops.golden.cases import write_case, load_case
>>> d = tempfile.mkdtemp()
>>> golden = write_case("MaskedSelect", 0, out=os.path.join(d, "g.npz"))
>>> y = load_case(golden)["arrays"]["output_y"]
>>> np.savez(os.path.join(d, "npu.npz"), y=y * np.float32(1 + 2**-20))
>>> compare_case(golden, os.path.join(d, "npu.npz")).passed
True
>>> np.savez(os.path.join(d, "npu.npz"), y=y * np.float32(1.01))
>>> print(compare_case(golden, os.path.join(d, "npu.npz")).outputs[0].verdict)
FAIL: MERE 1.00e-02 >= 1.22e-04 or MARE 1.00e-02 >= 1.22e-03 (float32, T = 2^-13)
"""

from __future__ import annotations

import dataclasses
import json
import math
import os

import ml_dtypes
import numpy as np

from jaxops.core.errors import OpArgumentError
from jaxops.core.outshape_format import decode
from jaxops.golden.files import load

__all__ = ["EPSILON", "THRESHOLDS", "OutputReport", "Report", "compare_case", "report_json"]

#: T per float dtype, from opbase's experimental_standard.md (float64: float32's, see above).
THRESHOLDS = {"float16": 2**-10, "bfloat16": 2**-7, "float32": 2**-13, "float64": 2**-13}
#: The epsilon the standard adds to |golden| in the relative error.
EPSILON = 1e-7
_BF16 = np.dtype(ml_dtypes.bfloat16)


@dataclasses.dataclass
class OutputReport:
    """One output's comparison: ``verdict`` starts with PASS or FAIL; ``worst`` lists the
    elements furthest off as ``(index, golden, actual, error)``."""

    name: str
    dtype: str
    shape: tuple
    rule: str
    passed: bool
    verdict: str
    differing: int = 0
    worst: list = dataclasses.field(default_factory=list)
    mere: float | None = None
    mare: float | None = None


@dataclasses.dataclass
class Report:
    """The comparison of every output; ``passed`` when all pass."""

    golden: str
    actual: str
    op: str
    contract: str
    outputs: list

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)

    def text(self) -> str:
        """The report as lines of text (what the CLI prints).

        Examples:
          >>> print(Report("g.npz", "a.npz", "NonZero", "aclnnNonzeroV2",
          ...              [OutputReport("y", "int64", (2, 3), "exact", True, "PASS")]).text())
          golden g.npz (NonZero, contract aclnnNonzeroV2); actual a.npz
            output y int64 [2, 3] [exact]: PASS
          PASS
        """
        lines = [f"golden {self.golden} ({self.op}, contract {self.contract}); actual {self.actual}"]
        for o in self.outputs:
            lines.append(f"  output {o.name} {o.dtype} {list(o.shape)} [{o.rule}]: {o.verdict}")
            for index, want, got, err in o.worst:
                lines.append(f"    at {list(index)}: golden {want!r}, actual {got!r}"
                             + (f", rel. error {err:.3g}" if err is not None else ""))
        lines.append("PASS" if self.passed else "FAIL")
        return "\n".join(lines)

    def as_dict(self) -> dict:
        """The report as JSON-ready data."""
        return {"golden": self.golden, "actual": self.actual, "op": self.op,
                "contract": self.contract, "passed": self.passed,
                "outputs": [dataclasses.asdict(o) | {"shape": list(o.shape)} for o in self.outputs]}


def _actual_arrays(path: str, outputs: list[dict]) -> tuple[dict, np.ndarray | None]:
    """ACTUAL's outputs by name (raw ``.bin`` typed by the golden) and its OP_OUTSHAPE."""
    found: dict[str, np.ndarray] = {}
    if os.path.isdir(path):
        for d in outputs:
            for stem in (d["name"], f"output_{d['name']}"):
                file = os.path.join(path, stem + ".bin")
                if os.path.isfile(file):
                    dt = _BF16 if d["dtype"]["numpy"] == "bfloat16" else np.dtype(d["dtype"]["numpy"])
                    found[d["name"]] = np.fromfile(file, dt.newbyteorder("<") if dt.itemsize > 1
                                                   and dt != _BF16 else dt).astype(dt)
                    break
        file = os.path.join(path, "outshape.bin")
        words = np.fromfile(file, "<i8").astype(np.int64) if os.path.isfile(file) else None
        return found, words
    if not (os.path.isfile(path) and path.endswith(".npz")):
        raise OpArgumentError("golden compare", "ACTUAL", "a .npz file or a folder of .bin "
                              "files named as the case's outputs", repr(path))
    with np.load(path) as z:
        stored = {k: z[k] for k in z.files}
    for d in outputs:
        a = stored.get(d["name"], stored.get(f"output_{d['name']}"))
        if a is not None:
            if d["dtype"]["numpy"] == "bfloat16" and a.dtype.itemsize == 2 and a.dtype.kind in "Vu":
                a = a.view(_BF16)
            found[d["name"]] = a
    return found, stored.get("outshape")


def _cut(name: str, got: np.ndarray, desc: dict, npu_shape) -> tuple[np.ndarray | None, str]:
    """``got`` at the shape to compare: as given, or its buffer's prefix of the NPU's (else
    the golden's) actual shape; ``None`` and why when it cannot be."""
    want = tuple(desc.get("actual_shape", desc["max_shape"]))
    if npu_shape is not None and tuple(npu_shape) != want:
        return None, f"FAIL: the NPU's OP_OUTSHAPE says {list(npu_shape)}, the golden {list(want)}"
    if got.size == math.prod(want):
        return got.reshape(want), ""
    if got.size == math.prod(desc["max_shape"]):
        return got.reshape(-1)[:math.prod(want)].reshape(want), ""
    return None, (f"FAIL: {got.size} elements, expected the actual shape {list(want)} or the "
                  f"max-shape buffer {desc['max_shape']}")


def _exact(o: OutputReport, want: np.ndarray, got: np.ndarray, listed: int) -> None:
    differs = want != got
    o.differing = int(differs.sum())
    o.passed = o.differing == 0
    o.verdict = (f"PASS ({want.size} elements equal)" if o.passed else
                 f"FAIL: {o.differing} of {want.size} elements differ")
    where = np.argwhere(differs)[:listed]
    o.worst = [(tuple(int(i) for i in at), want[tuple(at)].item(), got[tuple(at)].item(), None)
               for at in where]


def _precision(o: OutputReport, want: np.ndarray, got: np.ndarray, listed: int) -> None:
    t = THRESHOLDS[o.dtype]
    w, g = want.astype(np.float64), got.astype(np.float64)
    finite = np.isfinite(w)
    special_wrong = ~finite & ~((np.isnan(w) & np.isnan(g)) | (w == g))
    rel = np.zeros(w.shape)
    rel[finite] = np.abs(g[finite] - w[finite]) / (np.abs(w[finite]) + EPSILON)
    rel[special_wrong] = np.inf
    rel = np.where(np.isnan(rel), np.inf, rel)  # a NaN where the golden is finite
    o.mere = float(rel[finite].mean()) if finite.any() else 0.0
    o.mare = float(rel.max()) if rel.size else 0.0
    o.differing = int((rel > t).sum())
    o.passed = o.mere < t and o.mare < 10 * t
    exp = int(round(math.log2(t)))
    o.verdict = ((f"PASS: MERE {o.mere:.2e} < {t:.2e}, MARE {o.mare:.2e} < {10 * t:.2e}"
                  if o.passed else f"FAIL: MERE {o.mere:.2e} >= {t:.2e} or MARE {o.mare:.2e} "
                  f">= {10 * t:.2e}") + f" ({o.dtype}, T = 2^{exp})")
    order = np.argsort(-rel.reshape(-1), kind="stable")[:listed]
    o.worst = [(tuple(int(i) for i in np.unravel_index(k, w.shape)), want.reshape(-1)[k].item(),
                got.reshape(-1)[k].item(), float(rel.reshape(-1)[k]))
               for k in order if rel.reshape(-1)[k] > t]


def _buckets(o: OutputReport, want: np.ndarray, got: np.ndarray, dim: int, listed: int) -> None:
    """Bucket bytes: exact outside the rows (bytes 24 to 24 + 4·dim), the rows by precision."""
    rows = np.zeros(want.shape[1], bool)
    rows[24:24 + 4 * dim] = True
    _exact(o, want[:, ~rows], got[:, ~rows], listed)
    exact = dataclasses.replace(o)
    values = OutputReport(o.name, "float32", (want.shape[0], dim), "precision", False, "")
    as_rows = lambda a: np.ascontiguousarray(a[:, rows]).view("<f4")  # noqa: E731
    _precision(values, as_rows(want), as_rows(got), listed)
    o.passed = exact.passed and values.passed
    o.differing, o.mere, o.mare = exact.differing + values.differing, values.mere, values.mare
    o.verdict = (("PASS" if o.passed else "FAIL") + f": bytes outside the rows: {exact.verdict}; "
                 f"rows: {values.verdict}")
    byte = np.flatnonzero(~rows)  # the compared bytes' offsets in the bucket
    o.worst = [((b, int(byte[c])), w, g, e) for (b, c), w, g, e in exact.worst] + values.worst


def compare_case(golden: str | os.PathLike, actual: str | os.PathLike,
                 listed: int = 10) -> Report:
    """Compares an NPU's outputs (ACTUAL) with a golden case (see the module docstring).

    Args:
      golden: the case's ``.npz``.
      actual: a ``.npz`` or a folder of ``.bin`` files.
      listed: how many differing elements each output lists.

    Returns:
      The :class:`Report` (``passed``, per output its verdict and worst elements).
    """
    case = load(golden)
    found, words = _actual_arrays(os.fspath(actual), case["outputs"])
    npu_shapes = decode(np.asarray(words, np.int64)) if words is not None else None
    reports = []
    for k, desc in enumerate(case["outputs"]):
        want = case["arrays"][f"output_{desc['name']}"]
        dtype = str(want.dtype)
        dim = desc.get("buckets", {}).get("embedding_dim")
        rule = "buckets" if dim else ("precision" if dtype in THRESHOLDS else "exact")
        o = OutputReport(desc["name"], dtype, want.shape, rule, False, "")
        got = found.get(desc["name"])
        if got is None:
            o.verdict = "FAIL: not in ACTUAL"
        elif got.dtype != want.dtype:
            o.verdict = f"FAIL: dtype {got.dtype}, the golden's {want.dtype}"
        else:
            shape = npu_shapes[k] if npu_shapes is not None and k < len(npu_shapes) else None
            got, why = _cut(desc["name"], got, desc, shape if "actual_shape" in desc else None)
            if got is None:
                o.verdict = why
            elif rule == "buckets":
                _buckets(o, want, got, dim, listed)
            elif want.dtype.kind in "biu" or rule == "exact":
                _exact(o, want, got, listed)
            else:
                _precision(o, want, got, listed)
        reports.append(o)
    return Report(os.fspath(golden), os.fspath(actual), case["op"],
                  (case.get("contract") or {}).get("name", "?"), reports)


def report_json(report: Report) -> str:
    """The report as JSON text (``--json``).

    Examples:
      >>> r = Report("g.npz", "a.npz", "NonZero", "aclnnNonzeroV2",
      ...            [OutputReport("y", "int64", (2, 3), "exact", True, "PASS")])
      >>> json.loads(report_json(r))["passed"]
      True
    """
    return json.dumps(report.as_dict(), indent=1, default=str)
