"""Golden reference cases for validating Ascend kernels (``jaxops golden``).

A golden case is what an Ascend operator developer compares a kernel against: the inputs
(generated from a seed, with densities and special values, or the developer's own), every
output at its actual shape in the dtypes of the kernel contract the case follows (e.g.
aclnnNonzeroV2, aclnnUnique2, aclnnNonMaxSuppression), its max (buffer) shape and padding,
the OP_OUTSHAPE tensor exactly as a CANN kernel writes it (int64 words, the uint64 rank
flag set), the attrs and the impl mode. It is one ``.npz`` plus a JSON description, and
with ``bin=True`` raw little-endian ``.bin`` files; it is the same with ``jax_enable_x64``
off and on. ``docs/golden.md`` is the developer's guide.

The package sits below ``tracing``: it runs each operator's OpDef directly.

- :mod:`jaxops.golden.specs` — the table of per-operator specs (:func:`golden_case`);
- :mod:`jaxops.golden.contracts` — which kernel contract each case follows, from CANN's sources;
- :mod:`jaxops.golden.generators`, :mod:`jaxops.golden.inputs` — generated or given inputs;
- :mod:`jaxops.golden.cases`, :mod:`jaxops.golden.files` — making, writing and reading a case;
- :mod:`jaxops.golden.references` (and ``nms_references``, ``table_references``) —
  independent numpy references;
- :mod:`jaxops.golden.check` — checking a case against its contract's reference;
- :mod:`jaxops.golden.compare` — comparing an NPU's outputs with a case (CANN's precision
  standard);
- :mod:`jaxops.golden.models` — a whole model's golden folder (its index, written by
  :mod:`jaxops.onnx.golden`) compared with an NPU's dump, node by node;
- ``ops_specs``, ``hashtable_specs`` — the specs themselves (imported on first use; the
  hash-table cases' inputs and contracts in ``table_inputs``, ``table_contracts``).

>>> import tempfile, os
>>> from jaxops.golden import check_case, load_case, write_case
>>> path = write_case("NonZero", seed=0, out=os.path.join(tempfile.mkdtemp(), "nz.npz"))
>>> case = load_case(path)
>>> case["op"], case["contract"]["name"], sorted(case["arrays"])[:3]
('NonZero', 'aclnnNonzeroV2', ['input_x', 'output_y', 'outshape'])
>>> check_case(path)   # against an independent numpy reference, not the kernel
True
"""

from jaxops.core import loading as _loading

__all__ = [
    "FORMAT_VERSION", "Generation", "GoldenRun", "GoldenSpec", "build_case", "check_case",
    "compare_case", "default_path", "get_spec", "golden_case", "list_cases", "load_case",
    "max_shape_buffer", "register_golden", "run_opdef", "write_case",
]

#: Where each name lives: imported on first use (PEP 562), so ``jaxops golden`` can draw a
#: case's inputs while JAX loads.
_HOMES = {
    "FORMAT_VERSION": "cases", "GoldenRun": "cases", "build_case": "cases",
    "default_path": "files", "load_case": "cases", "max_shape_buffer": "cases",
    "run_opdef": "cases", "write_case": "cases", "check_case": "check",
    "compare_case": "compare", "Generation": "generators", "GoldenSpec": "specs",
    "get_spec": "specs", "golden_case": "specs", "list_cases": "specs",
    "register_golden": "specs",
}


__getattr__, __dir__ = _loading.lazy_attributes(
    __name__, {name: f"{__name__}.{home}" for name, home in _HOMES.items()}, globals())
