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
    golden = {m: {n.rsplit(".", 1)[-1] for n in names if n.startswith("jaxops.golden.")}
              | ({"files", "contracts"} if "jaxops.golden" in names else set())
              for m, names in imported.items() if m != "__init__"}
    # the pieces below cases import none of it; nothing imports the package's face
    for bottom in ("generators", "files", "contracts", "references"):
        assert not golden[bottom], (bottom, golden[bottom])
    assert golden["specs"] <= {"generators"} and golden["inputs"] <= {"files", "specs"}
    assert golden["nms_references"] == {"references"}
    assert "cases" not in golden["specs"] | golden["files"] | golden["check"]
    seen, order = set(), []

    def visit(m, path=()):  # depth-first: a module met again on its own path is a circle
        assert m not in path, f"import circle: {' -> '.join(path + (m,))}"
        if m in seen:
            return
        for n in sorted(golden.get(m, ())):
            visit(n, path + (m,))
        seen.add(m)
        order.append(m)

    for m in sorted(golden):
        visit(m)


def test_golden_commands_start_without_the_whole_library():
    """``jaxops golden NonZero`` imports its operators and the native kernels, not the
    hash tables' checkpoints (Orbax), the Ascend backend or the host kernels, and
    ``import jaxops`` imports no JAX at all (issue 40: it took 1.5-1.9 s)."""
    import subprocess
    import sys
    code = ("import sys, tempfile, jaxops; assert 'jax' not in sys.modules; "
            "from jaxops.cli import main; "
            "main(['golden', 'NonZero', '--out', tempfile.mkdtemp()]); "
            "bad = [m for m in sys.modules if m.startswith(('orbax', 'jaxops.backends.ascend', "
            "'jaxops.backends.host', 'jaxops.hashtable'))]; assert not bad, bad; "
            "assert jaxops.nonzero and 'jaxops.backends.ascend_ops' in sys.modules")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_golden_case_for_an_unknown_op_raises_with_a_hint():
    with pytest.raises(UnknownOpError, match="Did you mean: NonZero"):
        golden.golden_case("NonZer0", "typo")(lambda rng, attrs: [])
    with pytest.raises(DuplicateOpError, match="NonZero"):
        golden.register_golden(golden.GoldenSpec("NonZero", "again", lambda rng, attrs: []))
    assert "NonZer0" not in dict(golden.list_cases())


def test_every_golden_spec_makes_inputs_its_opdef_accepts():
    for op, _ in golden.list_cases():
        spec, opdef = golden.get_spec(op), get_op(op)
        if spec.build is not None:  # CANN's inputs by name: tests/golden/test_golden_tables.py
            continue
        inputs, _ = golden.specs.draw_inputs(spec, 0)
        opdef.check(inputs, spec.default_attrs)  # raises naming the port when a generator is wrong


@pytest.mark.parametrize("kind, text, want", [
    ("int", "-3", -3), ("float", "0.25", 0.25), ("bool", "True", True), ("bool", "0", False),
    ("list_int", "2,3,", (2, 3)), ("list_float", "0.5", (0.5,)), ("str", "new", "new"),
])
def test_attr_parse_text(kind, text, want):
    got = AttrDef("a", kind, default=None, optional=True).parse_text("Doc", text)
    assert got == want and type(got) is type(want)


def test_attr_parse_text_errors_name_op_attr_and_text():
    for text in ("maybe", "yes", "on"):  # issue 40: --transpose yes was taken for true
        with pytest.raises(OpArgumentError, match=rf"Doc: argument 'flag': expected true or false, got '{text}'"):
            AttrDef("flag", "bool", default=False).parse_text("Doc", text)
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
    y = case["arrays"]["output_y"]  # the values keep x's dtype (aclnnUnique2's valueOut)
    assert y.dtype == np.int8 and y.shape == (values.size,)
    np.testing.assert_array_equal(y, values)
    assert case["arrays"]["output_inverse_indices"].shape == (4, 6)  # inverseOut: self's shape
    assert golden.check_case(path)


def test_default_cases_record_no_chosen_shape(tmp_path):
    case = golden.load_case(golden.write_case("NonZero", 0, tmp_path))
    assert "input_shape" not in case and "input_dtype" not in case


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


# Cases of every operator with an independent reference, at attrs, input dtypes, contracts
# and modes that change what the reference must model (cuts by size, layouts, box codings,
# NaN rules, the aclnn NMS blocks, high_performance ranking).
REFERENCE_CASES = [
    ("NonZero", {}, None, None, {}), ("NonZero", {"transpose": True, "size": 5}, (3, 7), "float16", {}),
    ("NonZero", {}, (4, 4), "bfloat16", {"generation": golden.Generation(0.5, ("all",))}),
    ("Unique", {}, None, None, {}), ("Unique", {"sorted": False, "size": 3}, None, None, {}),
    ("Unique", {"axis": 0}, (6, 3), "int32", {}), ("Unique", {"equal_nan": False}, (50,), "float16", {}),
    ("Unique", {}, (40,), "float32", {"generation": golden.Generation(special=("all",))}),
    ("UniqueConsecutive", {}, None, None, {}), ("UniqueConsecutive", {"size": 4}, None, None, {}),
    ("MaskedSelect", {}, None, None, {}), ("MaskedSelect", {"size": 5}, (4, 5), "bfloat16", {}),
    ("MaskedSelect", {}, None, None, {"impl_mode": "high_performance"}),
    ("NonMaxSuppression", {}, None, None, {}),
    ("NonMaxSuppression", {"max_output_boxes_per_class": 30}, (2, 3, 40), "float16", {}),
    ("NonMaxSuppression", {"center_point_box": 1, "score_threshold": 0.6}, None, None, {}),
    ("NonMaxSuppression", {"size": 7}, None, None, {"contract": "onnx"}),
    ("NonMaxSuppression", {"center_point_box": 1}, None, None, {"contract": "onnx"}),
    ("NonMaxSuppression", {}, None, None, {"contract": "onnx", "impl_mode": "high_performance"}),
    ("BatchedNMS", {}, None, None, {}),
    ("BatchedNMS", {"max_output_size": 5, "score_threshold": 0.3}, None, None,
     {"impl_mode": "high_performance"}),
    ("EfficientNMS", {}, None, None, {}), ("EfficientNMS", {"class_agnostic": True, "pre_nms_top_k": 20}, None, None, {}),
    ("EfficientNMS", {"box_coding": 1}, None, None, {}),
]


@pytest.mark.parametrize("op, attrs, shape, dtype, options", REFERENCE_CASES, ids=lambda v: str(v))
def test_cases_agree_with_the_independent_reference(op, attrs, shape, dtype, options, tmp_path):
    for seed in range(2):
        with expected_truncation():
            path = golden.write_case(op, seed, tmp_path / f"{seed}.npz", attrs, shape, dtype,
                                     **options)
        assert golden.check_case(path)
        case = golden.load_case(path)
        assert case["impl_mode"]["name"] == options.get("impl_mode", "high_precision")


def _rewrite(path, change) -> None:
    """Applies ``change(arrays, description)`` to a written case, in place."""
    case = golden.load_case(path)
    arrays = {k: v.copy() for k, v in case["arrays"].items()}
    description = {k: v for k, v in case.items() if k != "arrays"}
    change(arrays, description)
    np.savez(path, **{k: (v.view(np.uint16) if v.dtype.name == "bfloat16" else v)
                      for k, v in arrays.items()},
             description=np.frombuffer(json.dumps(description).encode(), np.uint8))


@pytest.mark.parametrize("op, output", [("NonZero", "y"), ("Unique", "counts"),
                                         ("MaskedSelect", "y"), ("BatchedNMS", "keep"),
                                         ("NonMaxSuppression", "selected_indices")])
def test_check_finds_a_wrong_element_and_a_wrong_dtype(op, output, tmp_path):
    """What the NonZero race wrote (one index replaced by its neighbour's) fails the check,
    and so does an output in another dtype than the contract's (issue 40: values widened)."""
    path = golden.write_case(op, 0, tmp_path / "c.npz")

    def neighbour(arrays, _):
        flat = arrays[f"output_{output}"].reshape(-1)
        flat[1] = flat[0] if flat[1] != flat[0] else flat[1] + 1

    _rewrite(path, neighbour)
    with pytest.raises(AssertionError, match=f"output {output}: element"):
        golden.check_case(path)
    path = golden.write_case(op, 0, tmp_path / "c.npz", force=True)

    def widen(arrays, _):
        a = arrays[f"output_{output}"]
        arrays[f"output_{output}"] = a.astype(np.float64 if a.dtype.kind == "i" else np.int64)

    _rewrite(path, widen)
    with pytest.raises(AssertionError, match=f"output {output}: dtype"):
        golden.check_case(path)


def test_check_finds_a_wrong_actual_shape(tmp_path):
    path = golden.write_case("NonZero", 0, tmp_path / "c.npz")

    def shorter(_, description):
        description["outputs"][0]["actual_shape"][1] -= 1

    _rewrite(path, shorter)
    with pytest.raises(AssertionError, match="output y: actual shape"):
        golden.check_case(path)


def test_references_use_no_kernel_of_the_library():
    """The references are other code than the kernels they check: numpy, the library's
    error type and each other only."""
    for name in ("references.py", "nms_references.py", "table_references.py"):
        imported = _imports(GOLDEN / name) - {"__future__"}
        assert imported <= {"numpy", "collections.abc", "typing", "jaxops.core.errors",
                            "jaxops.golden.references"}, (name, imported)


def test_operators_without_a_reference_are_refused_not_passed(tmp_path):
    with pytest.raises(OpArgumentError, match="no independent reference yet"):
        golden.references.reference("NoSuchOp")  # every golden operator has one now
