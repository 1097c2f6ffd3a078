"""ONNX's backend node test cases, under jit, x64 off and on, as a parametrized matrix.

By default one case per op runs (the first by name, about 140: the suite's time budget),
listed in ``selected_cases.txt`` so that collecting them does not run ONNX's case generators
(~8 s, which every xdist worker would pay); ``test_the_selection_covers_every_op`` checks the
list against the generated cases. ``JAXOPS_ONNX_CONFORMANCE=all`` runs every applicable case
(about 1,360, ~2.5 min per x64 mode). The module's tests share one xdist group: under
``--dist loadgroup`` one worker generates the cases and compiles them (``make test`` keeps
xdist's default distribution, which balanced the whole suite better in one measured run). A case that needs 64-bit values with x64 off must be refused with the library's
error (``OpDTypeError``), or pass (within the case's tolerance). Cases whose
combination jaxops.onnx does not implement are refused at load, naming the node
(``REFUSED``, checked for every such case); every other case must pass.
"""

import os
import pathlib

import jax
import pytest

pytest.importorskip("onnx")

from jaxops.errors import OpDTypeError  # noqa: E402
from tests.onnx import conformance  # noqa: E402

#: Why a case is refused at load (prefix of its name -> reason): these op / attribute / type
#: combinations are not implemented, and load says so naming the node, the argument, what
#: is supported and what was given; nothing runs. Every other applicable case passes.
REFUSED = {
    "test_cast": "float8 e8m0 (its rounding modes) and strings",
    "test_equal_string": "strings",
    "test_identity_opt": "optional values",
    "test_identity_sequence": "sequence values",
    "test_training_dropout": "Dropout in training mode with a ratio > 0 (random masks)",
}

#: The cases refused at load (a full run, x64 off and on), each matched to a reason above.
REFUSED_CASES = set((pathlib.Path(__file__).parent / "refused_at_load.txt").read_text().split())


#: Run by default beside the first case of each op: the narrow types' conversions.
ALSO = {"test_cast_FLOAT_to_FLOAT8E4M3FN", "test_cast_no_saturate_FLOAT_to_FLOAT8E5M2",
        "test_cast_FLOAT_to_INT4", "test_cast_FLOAT8E5M2FNUZ_to_FLOAT",
        "test_cast_FLOAT_to_FLOAT4E2M1", "test_castlike_FLOAT_to_UINT2"}


pytestmark = pytest.mark.xdist_group("onnx_conformance")

SELECTED = pathlib.Path(__file__).parent / "selected_cases.txt"


def _op(name) -> str:
    return next(iter(sorted(conformance._ops(conformance.cases()[name].model.graph))))


def _selected() -> list[str]:
    if os.environ.get("JAXOPS_ONNX_CONFORMANCE") == "all":
        return sorted(conformance.cases())
    return SELECTED.read_text().split()


def _first_case_per_op() -> list[str]:
    """The default selection's rule: the first case by name of each op, and ``ALSO``."""
    first = {}
    for name in sorted(conformance.cases()):
        first.setdefault(_op(name), name)
    return sorted(set(first.values()) | ALSO)


def test_the_selection_covers_every_op():
    """``selected_cases.txt`` names applicable cases only, and every op that has an
    applicable case (with this onnx) has one there. Rewrite it after an onnx upgrade with
    ``python -c "from tests.onnx import test_conformance as t; t.write_selection()"``."""
    applicable = conformance.cases()
    listed = SELECTED.read_text().split()
    assert not set(listed) - set(applicable), sorted(set(listed) - set(applicable))
    missing = {_op(n) for n in applicable} - {_op(n) for n in listed}
    assert not missing, f"ops with no selected case: {sorted(missing)}; run write_selection()"


def write_selection() -> None:
    SELECTED.write_text("\n".join(_first_case_per_op()) + "\n")


def _refused(name) -> str:
    """Loads ``name``'s model, which must be refused; returns the refusal's message."""
    from jaxops.errors import JaxopsError

    with pytest.raises(JaxopsError) as refusal:
        conformance.load(conformance.cases()[name])
    msg = str(refusal.value)
    assert msg.startswith("ONNX node ") and "expected" in msg and "got" in msg, msg
    return msg


def test_refusals_are_at_load_naming_the_node():
    """Every case of REFUSED_CASES is refused by load (no compile), naming its node, and
    each has a reason in REFUSED."""
    for name in sorted(REFUSED_CASES):
        assert any(name.startswith(p) for p in REFUSED), name
        _refused(name)


_RESULTS: dict = {}  # x64 -> {case name: None or its exception}: one compile per mode


def _result(name: str, x64: bool):
    if x64 not in _RESULTS:
        _RESULTS[x64] = conformance.run_many([n for n in _selected() if n not in REFUSED_CASES])
    return _RESULTS[x64][name]


@pytest.mark.parametrize("x64", [False, True], ids=["x64_off", "x64_on"])
@pytest.mark.parametrize("name", _selected())
def test_backend_node_case(name, x64):
    if name in REFUSED_CASES:
        _refused(name)
        return
    with jax.enable_x64(x64):
        wide = not x64 and conformance.needs_x64(conformance.cases()[name])
        error = _result(name, x64)
    if isinstance(error, OpDTypeError):
        assert wide, f"refused without a 64-bit value: {error}"
        return  # the expected refusal, with the library's error
    if error is not None:
        raise error
