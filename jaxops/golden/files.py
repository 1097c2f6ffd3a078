"""Golden files: the ``.npz``, its JSON description and the raw ``.bin`` files.

A case written to ``PATH.npz`` is (format 2):

- ``PATH.npz``: ``input_<name>``, ``output_<name>`` **at the actual shape** (what the kernel
  must produce; ``y[:, :n]``-style cuts are not needed), ``outshape`` (the OP_OUTSHAPE
  words) and ``description`` (the JSON below, as bytes). bfloat16 tensors are stored as
  their uint16 bits (plain numpy has no bfloat16): ``a.view(ml_dtypes.bfloat16)``;
- ``PATH.json``: the description: op, contract, attrs, impl mode, and per tensor its shape,
  dtype (numpy name, CANN name, ``ge::DataType`` code), for outputs the max shape, actual
  shape, fill value and the OP_OUTSHAPE words;
- with ``bin=True``, ``PATH/``: one raw little-endian ``.bin`` per tensor, named as in the
  ``.npz``, and ``output_<name>.buffer.bin``: the output's max-shape buffer as a kernel
  leaves it (the actual-shape data as a row-major prefix, then the fill value). The
  description names each file (``"bin"``, ``"buffer_bin"``).

An existing file is never overwritten unless ``force`` is given.

>>> import json, tempfile, os
>>> d = tempfile.mkdtemp()
>>> desc = {"inputs": [describe_tensor("x", np.arange(3, dtype=np.int8))], "outputs": []}
>>> write(os.path.join(d, "c.npz"), {"input_x": np.arange(3, dtype=np.int8)}, desc, bin=True)
'...c.npz'
>>> np.fromfile(os.path.join(d, "c", "input_x.bin"), np.int8).tolist()
[0, 1, 2]
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import ml_dtypes
import numpy as np

from jaxops.core.dtypes import DataType
from jaxops.core.errors import OpArgumentError, UnsupportedDTypeError

__all__ = ["default_path", "describe_tensor", "load", "max_shape_buffer", "refuse_existing", "target",
           "targets", "write"]

_BF16 = np.dtype(ml_dtypes.bfloat16)


def describe_tensor(name: str, a: np.ndarray) -> dict:
    """A tensor's entry in the description: name, shape and dtype (numpy name, CANN name
    and ``ge::DataType`` code; ``stored_as`` where the ``.npz`` holds other bits).

    Examples:
      >>> describe_tensor("x", np.zeros((2, 3), np.float16))["dtype"]
      {'numpy': 'float16', 'cann': 'FLOAT16', 'cann_code': 1}
    """
    dtype: dict[str, Any] = {"numpy": str(a.dtype)}
    try:
        code = DataType.from_dtype(a.dtype)
        dtype.update(cann=code.name, cann_code=int(code))
    except UnsupportedDTypeError:
        pass
    if a.dtype == _BF16:
        dtype["stored_as"] = "uint16"
    return {"name": name, "shape": list(a.shape), "dtype": dtype}


def default_path(op: str, seed: int) -> str:
    """The file name of a case when ``--out`` names none: ``golden_<OP>_seed<N>.npz``.

    Examples:
      >>> default_path("NonZero", 3)
      'golden_NonZero_seed3.npz'
    """
    return f"golden_{op}_seed{seed}.npz"


def target(op: str, seed: int, out: str | os.PathLike | None) -> str:
    """The ``.npz`` path ``out`` asks for: a file (``.npz`` appended when missing) in an
    existing directory, or an existing directory to write :func:`default_path` into
    (default: the current directory); a missing directory is refused, as ``ht.save``
    refuses it. Checked before any work is done.

    Examples:
      >>> target("NonZero", 2, None), target("NonZero", 2, "/tmp/case")
      ('golden_NonZero_seed2.npz', '/tmp/case.npz')
    """
    if out is None:
        return default_path(op, seed)
    path = os.fspath(out)
    if os.path.isdir(path):
        return os.path.join(path, default_path(op, seed))
    if not path.endswith(".npz"):
        path += ".npz"
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise OpArgumentError("golden", "out", "a file in an existing directory (it is not "
                              "created, as ht.save does not)", repr(os.fspath(out)),
                              f"Create {parent} first.")
    return path


def targets(path: str, bin: bool) -> list[str]:
    """The paths a case at ``path`` (``.npz``) writes: itself, its ``.json``, its ``.bin``
    folder when asked.

    Examples:
      >>> targets("d/c.npz", bin=True)
      ['d/c.npz', 'd/c.json', 'd/c']
    """
    stem = path[:-4]
    return [path, stem + ".json"] + ([stem] if bin else [])


def refuse_existing(path: str, bin: bool, force: bool) -> None:
    """Refuses to overwrite a case (or its ``.json`` / ``.bin`` folder) unless ``force``.

    Examples:
      >>> import tempfile
      >>> refuse_existing(tempfile.mkdtemp() + "/c.npz", bin=True, force=False)  # nothing there
      >>> refuse_existing(tempfile.mkdtemp(), bin=False, force=False)
      Traceback (most recent call last):
      ...
      jaxops.core.errors.OpArgumentError: golden: argument 'out': expected a path where no case is yet, got '/tmp/...'. Pass --force (force=True) to overwrite it, or choose another --out.
    """
    if force:
        return
    there = [p for p in targets(path, bin) if os.path.exists(p)]
    if there:
        raise OpArgumentError("golden", "out", "a path where no case is yet", repr(there[0]),
                              "Pass --force (force=True) to overwrite it, or choose another --out.")


def _stored(a: np.ndarray) -> np.ndarray:
    """What the ``.npz`` and ``.bin`` files hold: little-endian, bfloat16 as uint16 bits."""
    if a.dtype == _BF16:
        return a.view(np.uint16)
    if a.dtype.byteorder == ">":
        return a.astype(a.dtype.newbyteorder("<"))
    return a


def write(path: str, arrays: dict[str, np.ndarray], description: dict, bin: bool = False,
          buffers: dict[str, np.ndarray] | None = None) -> str:
    """Writes the ``.npz``, the ``.json`` and (``bin``) the ``.bin`` folder; returns ``path``.

    Args:
      path: the ``.npz`` path (checked by the caller: :func:`refuse_existing`).
      arrays: name → array for the ``.npz`` (and the ``.bin`` files).
      description: the JSON description; with ``bin`` each tensor entry gets its file names.
      bin: also write the raw ``.bin`` files.
      buffers: output name → its max-shape buffer (``.buffer.bin`` files).
    """
    if bin:
        folder = path[:-4]
        os.makedirs(folder, exist_ok=True)
        rel = os.path.basename(folder)
        entries = {f"{kind[:-1]}_{d['name']}": d for kind in ("inputs", "outputs")
                   for d in description.get(kind, [])}
        for key, a in arrays.items():
            _stored(np.ascontiguousarray(a)).tofile(os.path.join(folder, key + ".bin"))
            if key in entries:
                entries[key]["bin"] = f"{rel}/{key}.bin"
        for name, buf in (buffers or {}).items():
            _stored(np.ascontiguousarray(buf)).tofile(os.path.join(folder, f"output_{name}.buffer.bin"))
            entries[f"output_{name}"]["buffer_bin"] = f"{rel}/output_{name}.buffer.bin"
        if "outshape" in arrays and description.get("outshape"):
            description["outshape"]["bin"] = f"{rel}/outshape.bin"
    text = json.dumps(description, indent=1)
    np.savez(path, **{k: _stored(a) for k, a in arrays.items()},
             description=np.frombuffer(text.encode(), np.uint8))
    with open(path[:-4] + ".json", "w") as f:
        f.write(text)
    return path


def load(path: str | os.PathLike) -> dict[str, Any]:
    """Reads a case: the description's fields plus ``"arrays"`` (dtypes restored; a format-1
    file's max-shape outputs cut to their actual shapes, as format 2 stores them).

    Examples:
      >>> import tempfile, os, ml_dtypes
      >>> p = os.path.join(tempfile.mkdtemp(), "c.npz")
      >>> x = np.ones(2, ml_dtypes.bfloat16)
      >>> _ = write(p, {"input_x": x}, {"inputs": [describe_tensor("x", x)], "outputs": []})
      >>> load(p)["arrays"]["input_x"].dtype
      dtype(bfloat16)
    """
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files if k != "description"}
        description = json.loads(z["description"].tobytes().decode())
    named = {f"{kind[:-1]}_{d['name']}": d for kind in ("inputs", "outputs")
             for d in description.get(kind, [])}
    for key, a in arrays.items():
        entry = named.get(key)
        if entry is not None and (a.dtype.kind == "V" or "stored_as" in entry["dtype"]):
            arrays[key] = a.view(_BF16 if entry["dtype"]["numpy"] == "bfloat16"
                                 else np.dtype(entry["dtype"]["numpy"]))
    if description.get("format_version", 1) == 1:
        for d in description.get("outputs", []):
            if "actual_shape" in d:
                flat = arrays[f"output_{d['name']}"].reshape(-1)
                arrays[f"output_{d['name']}"] = flat[:math.prod(d["actual_shape"])].reshape(
                    d["actual_shape"])
    return {**description, "arrays": arrays}


def max_shape_buffer(case: dict, name: str) -> np.ndarray:
    """Output ``name`` of a loaded case as the kernel's max-shape buffer: its data as a
    row-major prefix, then its fill value (an output without padding is itself).

    Examples:
      >>> case = {"outputs": [{"name": "y", "max_shape": [2, 4], "fill_value": -1}],
      ...         "arrays": {"output_y": np.array([[1, 2, 3]])}}
      >>> max_shape_buffer(case, "y").tolist()
      [[1, 2, 3, -1], [-1, -1, -1, -1]]
    """
    desc = next(d for d in case["outputs"] if d["name"] == name)
    data = case["arrays"][f"output_{name}"]
    if desc.get("fill_value") is None or list(data.shape) == list(desc["max_shape"]):
        return data
    buf = np.full(math.prod(desc["max_shape"]), desc["fill_value"], data.dtype)
    buf[:data.size] = data.reshape(-1)
    return buf.reshape(desc["max_shape"])
