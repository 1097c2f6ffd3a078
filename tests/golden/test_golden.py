"""The golden package's layering and registration, the attr text parser, the errors' home."""

import ast
import inspect
import json
import pathlib

import numpy as np
import pytest

import jaxops
import jaxops.errors
from jaxops import golden
from jaxops.core import errors as core_errors
from jaxops.core.errors import (DuplicateOpError, OpArgumentError, UnknownAttrError,
                                UnknownOpError)
from jaxops.core.registry import AttrDef, get_op
from tests.helpers.util import expected_truncation

GOLDEN = pathlib.Path(golden.__file__).parent


def _imports(path: pathlib.Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add(node.module)
    return names


def test_golden_sits_below_tracing_and_has_no_circle():
    imported = {p.stem: _imports(p) for p in GOLDEN.glob("*.py")}
    for module, names in imported.items():
        tracing = {n for n in names if n == "tracing" or n.startswith("tracing.")}
        assert not tracing, (module, tracing)
    # specs ← cases ← check; the per-operator specs import them, nothing imports the package
    assert not {n for n in imported["specs"] if n.startswith("jaxops.golden")}
    assert {n for n in imported["cases"] if n.startswith("jaxops.golden")} == {"jaxops.golden.specs"}
    assert "jaxops.golden" not in imported["specs"] | imported["cases"] | imported["check"]


def test_golden_case_for_an_unknown_op_raises_with_a_hint():
    with pytest.raises(UnknownOpError, match="Did you mean: NonZero"):
        golden.golden_case("NonZer0", "typo")(lambda rng, attrs: [])
    with pytest.raises(DuplicateOpError, match="NonZero"):
        golden.register_golden(golden.GoldenSpec("NonZero", "again", lambda rng, attrs: []))
    assert "NonZer0" not in dict(golden.list_cases())


def test_every_golden_spec_makes_inputs_its_opdef_accepts():
    for op, _ in golden.list_cases():
        spec, opdef = golden.get_spec(op), get_op(op)
        rng = np.random.default_rng(0)
        attrs = {**spec.default_attrs}
        inputs = (spec.make_inputs(rng, attrs, spec.shape, spec.dtype) if spec.shape is not None
                  else spec.make_inputs(rng, attrs))
        opdef.check(inputs, attrs)  # raises naming the port when a generator is wrong


@pytest.mark.parametrize("kind, text, want", [
    ("int", "-3", -3), ("float", "0.25", 0.25), ("bool", "Yes", True), ("bool", "off", False),
    ("list_int", "2,3,", (2, 3)), ("list_float", "0.5", (0.5,)), ("str", "new", "new"),
])
def test_attr_parse_text(kind, text, want):
    got = AttrDef("a", kind, default=None, optional=True).parse_text("Doc", text)
    assert got == want and type(got) is type(want)


def test_attr_parse_text_errors_name_op_attr_and_text():
    with pytest.raises(OpArgumentError, match=r"Doc: argument 'flag': expected bool, got 'maybe'"):
        AttrDef("flag", "bool", default=False).parse_text("Doc", "maybe")
    with pytest.raises(OpArgumentError, match=r"'n': expected an int >= 1, got 0"):
        AttrDef("n", "int", 1, check=lambda v: v >= 1, expected="an int >= 1").parse_text("Doc", "0")
    assert AttrDef("s", "int", None, optional=True).parse_text("Doc", "None") is None
    with pytest.raises(OpArgumentError, match="'s': expected int, got 'None'"):
        AttrDef("s", "int", 0).parse_text("Doc", "None")  # not optional: None is no value


def test_opdef_attr_lookup_suggests_close_names():
    assert get_op("NonMaxSuppression").attr("iou_threshold").type == "float"
    with pytest.raises(UnknownAttrError, match="Did you mean iou_threshold"):
        get_op("NonMaxSuppression").attr("iou_treshold")


def test_case_with_chosen_inputs_matches_numpy_and_rechecks(tmp_path):
    path = golden.write_case("Unique", 5, tmp_path / "u.npz", shape=(4, 6), dtype="int8")
    case = golden.load_case(path)
    x = case["arrays"]["input_x"]
    values = np.unique(x)
    assert x.shape == (4, 6) and x.dtype == np.int8
    assert case["outputs"][0]["actual_shape"] == [values.size]
    np.testing.assert_array_equal(case["arrays"]["output_y"][:values.size], values)
    assert golden.check_case(path)


def test_default_cases_record_no_chosen_shape(tmp_path):
    case = golden.load_case(golden.write_case("NonZero", 0, tmp_path))
    assert "input_shape" not in case and "input_dtype" not in case  # files stay as before


def test_outshape_format_lives_in_the_core_and_tracing_reexports_it():
    from jaxops.core import outshape_format
    from tracing import outshape
    for name in outshape_format.__all__:
        assert getattr(outshape, name) is getattr(outshape_format, name)


def test_jaxops_errors_reexports_every_exception_class():
    classes = {name for name, obj in inspect.getmembers(core_errors, inspect.isclass)
               if issubclass(obj, BaseException) and obj.__module__ == core_errors.__name__}
    assert classes <= set(jaxops.errors.__all__)
    for name in classes:
        assert getattr(jaxops.errors, name) is getattr(core_errors, name)
    assert issubclass(core_errors.UsageError, core_errors.JaxopsError)


# Cases of every operator with an independent reference, at attrs and input dtypes that
# change what the reference must model (cuts by size, layouts, box codings, NaN rules).
REFERENCE_CASES = [
    ("NonZero", {}, None, None), ("NonZero", {"transpose": True, "size": 5}, (3, 7), "float16"),
    ("NonZero", {}, (4, 4), "bfloat16"),
    ("Unique", {}, None, None), ("Unique", {"sorted": False, "size": 3}, None, None),
    ("Unique", {"axis": 0}, (6, 3), "int32"), ("Unique", {"equal_nan": False}, (50,), "float16"),
    ("UniqueConsecutive", {}, None, None), ("UniqueConsecutive", {"size": 4}, None, None),
    ("MaskedSelect", {}, None, None), ("MaskedSelect", {"size": 5}, (4, 5), "bfloat16"),
    ("NonMaxSuppression", {}, None, None), ("NonMaxSuppression", {"size": 7}, None, None),
    ("NonMaxSuppression", {"center_point_box": 1}, None, None),
    ("BatchedNMS", {}, None, None),
    ("BatchedNMS", {"max_output_size": 5, "score_threshold": 0.3}, None, None),
    ("EfficientNMS", {}, None, None), ("EfficientNMS", {"class_agnostic": True, "pre_nms_top_k": 20}, None, None),
    ("EfficientNMS", {"box_coding": 1}, None, None),
]


@pytest.mark.parametrize("op, attrs, shape, dtype", REFERENCE_CASES, ids=lambda v: str(v))
def test_cases_agree_with_the_independent_reference(op, attrs, shape, dtype, tmp_path):
    for seed in range(2):
        with expected_truncation():
            path = golden.write_case(op, seed, tmp_path / f"{seed}.npz", attrs, shape, dtype)
        assert golden.check_case(path)


def _rewrite(path, change) -> None:
    """Applies ``change(arrays, description)`` to a written case, in place."""
    case = golden.load_case(path)
    arrays = {k: v.copy() for k, v in case["arrays"].items()}
    description = {k: v for k, v in case.items() if k != "arrays"}
    change(arrays, description)
    np.savez(path, **arrays, description=np.frombuffer(json.dumps(description).encode(), np.uint8))


@pytest.mark.parametrize("op, output", [("NonZero", "y"), ("Unique", "counts"),
                                         ("MaskedSelect", "y"), ("BatchedNMS", "keep")])
def test_check_finds_a_wrong_element_and_wrong_padding(op, output, tmp_path):
    """What the NonZero race wrote (one index replaced by its neighbour's) fails the check,
    and so does a padding element that is not the fill value."""
    path = golden.write_case(op, 0, tmp_path / "c.npz")
    desc = golden.load_case(path)["outputs"]
    n = int(np.prod([d for d in desc if d["name"] == output][0]["actual_shape"]))

    def neighbour(arrays, _):
        flat = arrays[f"output_{output}"].reshape(-1)
        flat[1] = flat[0] if flat[1] != flat[0] else flat[1] + 1

    _rewrite(path, neighbour)
    with pytest.raises(AssertionError, match=f"output {output}: element"):
        golden.check_case(path)
    path = golden.write_case(op, 0, tmp_path / "c.npz")
    _rewrite(path, lambda arrays, _: arrays[f"output_{output}"].reshape(-1).__setitem__(n, 7))
    with pytest.raises(AssertionError, match=f"output {output}: padding element {n}"):
        golden.check_case(path)


def test_check_finds_a_wrong_actual_shape(tmp_path):
    path = golden.write_case("NonZero", 0, tmp_path / "c.npz")

    def shorter(_, description):
        description["outputs"][0]["actual_shape"][1] -= 1

    _rewrite(path, shorter)
    with pytest.raises(AssertionError, match="output y: actual shape"):
        golden.check_case(path)


def test_references_use_no_kernel_of_the_library():
    """The references are other code than the kernels they check: numpy and the library's
    error type only."""
    imported = _imports(GOLDEN / "references.py") - {"__future__"}
    assert imported <= {"numpy", "collections.abc", "typing", "jaxops.core.errors"}, imported


def test_operators_without_a_reference_are_refused_not_passed(tmp_path):
    path = golden.write_case("EmbeddingHashTableExport", 0, tmp_path / "e.npz")
    with pytest.raises(OpArgumentError, match="no independent reference yet"):
        golden.check_case(path)
