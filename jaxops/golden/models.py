"""Golden data for a whole model: a folder of node cases and its index.

``jaxops golden --onnx model.onnx --inputs inputs.npz --out DIR`` (:mod:`jaxops.onnx.golden`)
writes, for every data-dependent node of one run, a case in the single-operator format
(format 2: ``node<K>_<Op>.npz`` + ``.json``, ``.bin`` files with ``--bin``) and
``DIR/index.json`` listing the nodes: index in the graph, name, op type, files, and which
graph value each input and output is. This module reads that folder and compares it with
an NPU's dump (:func:`compare_model`); it needs no ONNX.

>>> import tempfile, os, json
>>> d = tempfile.mkdtemp()
>>> with open(os.path.join(d, INDEX), "w") as f:
...     json.dump({"kind": KIND, "nodes": []}, f)
>>> load_index(d)["nodes"]
[]
"""

from __future__ import annotations

import dataclasses
import json
import os

from jaxops.core.errors import OpArgumentError
from jaxops.golden.compare import compare_case

__all__ = ["INDEX", "KIND", "ModelReport", "compare_model", "is_model_folder", "load_index"]

#: The index file of a model's golden folder.
INDEX = "index.json"
#: Its ``kind``.
KIND = "onnx model"


def is_model_folder(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder holding a model's :data:`INDEX`."""
    return os.path.isfile(os.path.join(os.fspath(path), INDEX))


def load_index(folder: str | os.PathLike) -> dict:
    """The index of a model's golden folder (refused, naming the folder, when it has none)."""
    path = os.path.join(os.fspath(folder), INDEX)
    if not os.path.isfile(path):
        raise OpArgumentError("golden", "GOLDEN", f"a model's golden folder holding {INDEX}",
                              repr(os.fspath(folder)))
    with open(path) as f:
        index = json.load(f)
    if index.get("kind") != KIND:
        raise OpArgumentError("golden", "GOLDEN", f"an index of kind {KIND!r}",
                              repr(index.get("kind")))
    return index


@dataclasses.dataclass
class ModelReport:
    """Per node, the :class:`~jaxops.golden.compare.Report` of its case (``None`` where
    ACTUAL has no dump of the node: a failure)."""

    golden: str
    actual: str
    nodes: list  # (index entry, Report or None)

    @property
    def passed(self) -> bool:
        return all(r is not None and r.passed for _, r in self.nodes)

    def text(self) -> str:
        lines = [f"golden model {self.golden}; actual {self.actual}"]
        for entry, report in self.nodes:
            head = f"node {entry['index']} {entry['name']!r} ({entry['op_type']})"
            if report is None:
                lines.append(f"{head}: FAIL: no {entry['stem']}.npz or {entry['stem']}/ in ACTUAL")
                continue
            lines.append(f"{head}: {'PASS' if report.passed else 'FAIL'}")
            lines += ["  " + line for line in report.text().splitlines()[1:-1]]
        failed = sum(1 for _, r in self.nodes if r is None or not r.passed)
        lines.append("PASS" if self.passed else f"FAIL ({failed} of {len(self.nodes)} nodes)")
        return "\n".join(lines)

    def as_dict(self) -> dict:
        return {"golden": self.golden, "actual": self.actual, "passed": self.passed,
                "nodes": [{**{k: e[k] for k in ("index", "name", "op_type", "case")},
                           "report": None if r is None else r.as_dict()}
                          for e, r in self.nodes]}


def compare_model(golden: str | os.PathLike, actual: str | os.PathLike,
                  listed: int = 10) -> ModelReport:
    """Compares an NPU's dump of a model with its golden folder, node by node.

    Args:
      golden: the folder ``jaxops golden --onnx`` wrote.
      actual: a folder holding, per node, what :func:`~jaxops.golden.compare_case` takes,
        named by the node's stem (``node<K>_<Op>``, as in the index): ``<stem>.npz`` (the
        outputs by name, e.g. a second golden folder's cases) or a folder ``<stem>/`` of
        ``<output>.bin`` files, each with its OP_OUTSHAPE (``outshape``) where it has one.
      listed: how many differing elements each output lists.

    Returns:
      The :class:`ModelReport`; a node missing from ACTUAL fails.
    """
    golden, actual = os.fspath(golden), os.fspath(actual)
    index = load_index(golden)
    if not os.path.isdir(actual):
        raise OpArgumentError("golden compare", "ACTUAL", "a folder of per-node dumps "
                              "(<stem>.npz or <stem>/) for a model's golden folder", repr(actual))
    nodes = []
    for entry in index["nodes"]:
        case = os.path.join(golden, entry["case"])
        dump = next((p for p in (os.path.join(actual, entry["stem"] + ".npz"),
                                 os.path.join(actual, entry["stem"])) if os.path.exists(p)), None)
        nodes.append((entry, None if dump is None else compare_case(case, dump, listed)))
    return ModelReport(golden, actual, nodes)

