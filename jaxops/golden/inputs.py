"""The developer's own inputs for a golden case (``--input``).

``--input`` takes:

- a ``.npz`` holding each input under its name (``x``, ``mask``, ``boxes``...) or as a
  golden case names it (``input_x``), so a case's own file can be fed back; a 2-byte
  void array (how numpy saves bfloat16) is read as bfloat16;
- a ``.bin`` of raw little-endian values for an operator with one input, shaped by
  ``--shape`` and typed by ``--dtype``;
- a ``.json`` description written with ``--bin``: its inputs are read from its ``.bin``
  files.

>>> import tempfile, os
>>> p = os.path.join(tempfile.mkdtemp(), "x.bin")
>>> np.arange(6, dtype=np.int16).tofile(p)
>>> read_inputs(p, ["x"], shape=(2, 3), dtype="int16")["x"].tolist()
[[0, 1, 2], [3, 4, 5]]
"""

from __future__ import annotations

import json
import math
import os

import ml_dtypes
import numpy as np

from jaxops.core.errors import OpArgumentError
from jaxops.golden.files import load
from jaxops.golden.specs import dtype_named

__all__ = ["read_inputs", "read_named"]


def read_inputs(path: str | os.PathLike, names: list[str], shape=None, dtype=None,
                required: list[str] | None = None) -> dict[str, np.ndarray]:
    """The inputs in ``path``, by input name (see the module docstring).

    Args:
      path: a ``.npz``, ``.bin`` or ``.json`` file.
      names: the operator's input names, in order.
      shape: the shape of a ``.bin`` input (``--shape``).
      dtype: the dtype of a ``.bin`` input (``--dtype``).
      required: the names that must be present (default: all).

    Returns:
      ``{name: array}``.
    """
    path = os.fspath(path)
    required = names if required is None else required
    if not os.path.isfile(path):
        raise OpArgumentError("golden", "input", "an existing .npz, .bin or .json file",
                              repr(path))
    if path.endswith(".npz"):
        found = _from_npz(path, names)
    elif path.endswith(".bin"):
        found = _from_bin(path, names, shape, dtype)
    elif path.endswith(".json"):
        found = _from_json(path, names)
    else:
        raise OpArgumentError("golden", "input", "a .npz, .bin or .json file", repr(path))
    missing = [n for n in required if n not in found]
    if missing:
        raise OpArgumentError("golden", "input", "arrays named " + ", ".join(required),
                              f"{path!r} without {', '.join(missing)}",
                              "Name them as the operator's inputs (jaxops golden OP --help).")
    return found


def _from_npz(path: str, names: list[str]) -> dict[str, np.ndarray]:
    with np.load(path) as z:
        stored = {k: z[k] for k in z.files}
    if "description" in stored:  # a golden case: its own reader restores its dtypes
        stored = load(path)["arrays"]
    found = {}
    for n in names:
        a = stored.get(n, stored.get(f"input_{n}"))
        if a is not None:
            found[n] = a.view(ml_dtypes.bfloat16) if a.dtype.kind == "V" and a.dtype.itemsize == 2 else a
    return found


def _from_bin(path: str, names: list[str], shape, dtype) -> dict[str, np.ndarray]:
    if len(names) != 1:
        raise OpArgumentError("golden", "input", "a .npz or a .json description for an "
                              f"operator with {len(names)} inputs ({', '.join(names)})",
                              repr(path))
    if shape is None or dtype is None:
        raise OpArgumentError("golden", "input", "--shape and --dtype with a .bin file",
                              repr(path))
    dt = dtype_named(dtype)
    raw = np.fromfile(path, dt.newbyteorder("<") if dt.itemsize > 1 else dt)
    if raw.size != math.prod(shape):
        raise OpArgumentError("golden", "input", f"{math.prod(shape)} {dt.name} values "
                              f"(--shape {','.join(map(str, shape))})",
                              f"{raw.size} in {path!r}")
    return {names[0]: raw.astype(dt).reshape(shape)}


def _from_json(path: str, names: list[str]) -> dict[str, np.ndarray]:
    with open(path) as f:
        description = json.load(f)
    base = os.path.dirname(os.path.abspath(path))
    found = {}
    for d in description.get("inputs", []):
        if d["name"] in names and "bin" in d:
            dt = dtype_named(d["dtype"]["numpy"])
            found[d["name"]] = _from_bin(os.path.join(base, d["bin"]), [d["name"]],
                                         tuple(d["shape"]), dt)[d["name"]]
    return found


def read_named(path: str | os.PathLike, op: str) -> dict[str, np.ndarray]:
    """Every input in ``path`` by name (a ``.npz``: each array, ``input_`` stripped, a golden
    case's own file too; a ``.json`` written with ``--bin``: its inputs' ``.bin`` files), for
    the hash-table cases, whose inputs are CANN's and several.

    Examples:
      >>> import tempfile, os
      >>> p = os.path.join(tempfile.mkdtemp(), "in.npz")
      >>> np.savez(p, input_keys=np.arange(3), table=np.zeros((2, 32), np.uint8))
      >>> sorted(read_named(p, "EmbeddingHashTableEvict"))
      ['keys', 'table']
    """
    path = os.fspath(path)
    if not os.path.isfile(path) or not path.endswith((".npz", ".json")):
        raise OpArgumentError(f"golden {op}", "input", "an existing .npz (arrays by CANN's input "
                              "names) or a .json written with --bin", repr(path))
    if path.endswith(".json"):
        with open(path) as f:
            names = [d["name"] for d in json.load(f).get("inputs", [])]
        return _from_json(path, names)
    with np.load(path) as z:
        stored = {k: z[k] for k in z.files}
    if "description" in stored:  # a golden case: its own reader restores its dtypes
        stored = load(path)["arrays"]
    return {k[len("input_"):] if k.startswith("input_") else k: a for k, a in stored.items()
            if not k.startswith(("output_", "outshape", "description"))}
