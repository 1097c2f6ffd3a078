"""Golden reference cases for validating Ascend kernels (``jaxops golden``).

A golden case is what an Ascend operator developer compares a kernel against: the inputs,
the outputs **in wire layout** (each output's buffer at max shape, its valid data a
contiguous row-major prefix, the rest fill — what the kernel leaves in device memory), the
OP_OUTSHAPE tensor exactly as a CANN kernel writes it (int64 words, the uint64 rank flag
set), the attrs and the impl mode. Index outputs are int64 (CANN's and ONNX's type) whether
or not ``jax_enable_x64`` is on. It is one ``.npz`` plus a JSON sidecar describing it;
for the hash-table operators the table before and after in CANN bucket bytes too.
Deterministic for a given seed.

The package sits below ``tracing``: it runs each operator's OpDef directly.

- :mod:`jaxops.golden.specs` — the table of per-operator specs (:func:`golden_case`);
- :mod:`jaxops.golden.cases` — making, writing and reading a case;
- :mod:`jaxops.golden.references` — independent numpy references of the operators;
- :mod:`jaxops.golden.check` — checking a case against its operator's reference;
- ``ops_specs``, ``hashtable_specs`` — the specs themselves (registered on import).

>>> import tempfile, os
>>> path = write_case("NonZero", seed=0, out=os.path.join(tempfile.mkdtemp(), "nz.npz"))
>>> case = load_case(path)
>>> case["op"], sorted(case["arrays"])[:3]
('NonZero', ['input_x', 'output_y', 'outshape'])
>>> check_case(path)   # against an independent numpy reference, not the kernel
True
"""

from jaxops.golden.cases import (FORMAT_VERSION, GoldenRun, build_case, default_path, load_case,
                                 run_opdef, write_case)
from jaxops.golden.check import check_case
from jaxops.golden.specs import GoldenSpec, get_spec, golden_case, list_cases, register_golden
from jaxops.golden import hashtable_specs, ops_specs  # noqa: E402,F401  (register the specs)

__all__ = [
    "FORMAT_VERSION", "GoldenRun", "GoldenSpec", "build_case", "check_case", "default_path",
    "get_spec", "golden_case", "list_cases", "load_case", "register_golden", "run_opdef",
    "write_case",
]
