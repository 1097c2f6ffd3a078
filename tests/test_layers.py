"""The layers of the design hold: lower layers never import higher ones."""

import ast
import pathlib
import subprocess
import sys

import pytest


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


def test_import_jaxops_does_not_import_tracing():
    # tracing is the launch protocol on top of jaxops; the library below must not need it.
    done = _run("import jaxops, sys; "
                "assert not any(m == 'tracing' or m.startswith('tracing.') for m in sys.modules), "
                "sorted(m for m in sys.modules if m.startswith('tracing'))")
    assert done.returncode == 0, done.stderr


def _project_imports(package: str) -> dict[str, set[str]]:
    """Every project module each file of ``package`` imports, function-local ones included."""
    root = pathlib.Path(__file__).resolve().parents[1]
    found = {}
    for path in sorted((root / package.replace(".", "/")).rglob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
            elif isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
        found[str(path.relative_to(root))] = {n for n in names
                                              if n.split(".")[0] in ("jaxops", "tracing")}
    return found


@pytest.mark.parametrize("package, allowed", [
    ("jaxops.core", ("jaxops.core",)),
    ("jaxops.capacity", ("jaxops.core", "jaxops.capacity")),
    ("jaxops.backends", ("jaxops.core", "jaxops.backends")),
])
def test_lower_layers_import_only_below(package, allowed):
    bad = {f: sorted(n for n in names if not n.startswith(allowed))
           for f, names in _project_imports(package).items()}
    assert not {f: n for f, n in bad.items() if n}, bad


def test_old_capacity_paths_are_the_same_objects():
    from jaxops import capacity
    from tracing import capacity as old_stats, overflow as old_policy

    assert old_policy.run_with_policy is capacity.run_with_policy
    assert old_policy.CapacityOverflowWarning is capacity.CapacityOverflowWarning
    assert old_stats.get_stats is capacity.get_stats


def test_kernel_for_a_misspelt_op_raises_with_the_close_match():
    from jaxops.backends.ascend_ops import aclnn_kernel_for
    from jaxops.backends.callback import HOST_KERNELS, host_kernel_for
    from jaxops.errors import UnknownOpError

    with pytest.raises(UnknownOpError, match="host kernel registered for unknown operator "
                                             "'MaskedSelct'. Did you mean: MaskedSelect"):
        host_kernel_for("MaskedSelct")(lambda x, mask, *, size: (x,))
    with pytest.raises(UnknownOpError, match="ascend kernel .* 'Uniqe'. Did you mean: Unique"):
        aclnn_kernel_for("Uniqe", "Unique2", frozenset())(lambda x: [])
    assert "MaskedSelct" not in HOST_KERNELS


def test_registration_before_its_op_is_deferred_then_checked(monkeypatch):
    from jaxops.core import registry
    from jaxops.core.dtypes import FLOATING
    from jaxops.errors import UnknownOpError

    monkeypatch.setattr(registry, "_sealed", False)  # as while `import jaxops` runs
    monkeypatch.setattr(registry, "_PENDING", {})
    attached = []
    registry.on_op("LayersLater", attached.append, "test kernel")
    registry.on_op("LayersLatr", attached.append, "test kernel")
    op = registry.OpDef("LayersLater", [registry.Input("x", FLOATING)],
                        [registry.Output("y", FLOATING)])
    registry.register_op(op)
    try:
        assert attached == [op]
        with pytest.raises(UnknownOpError, match="test kernel registered for unknown operator "
                                                 "'LayersLatr'. Did you mean: LayersLater"):
            registry.check_pending()
        assert registry._sealed and not registry._PENDING
    finally:
        registry.unregister_op("LayersLater")


def test_no_operator_file_imports_another():
    # Shared conventions come from jaxops.ops._conventions, shared pieces (compaction,
    # grouping, iou, ...) from their own modules; an operator file (one that registers an
    # OpDef) never imports another one.
    root = pathlib.Path(__file__).resolve().parents[1]
    imports = {f: n for f, n in _project_imports("jaxops.ops").items()
               if "/hashtable/" not in f and not f.endswith("__init__.py")}  # a package gathers
    operators = {f[:-3].replace("/", ".") for f in imports
                 if "register_op(" in (root / f).read_text()}
    assert {"jaxops.ops.nonzero", "jaxops.ops.nms.efficient_nms"} <= operators
    bad = {f: sorted(n & operators) for f, n in imports.items() if n & operators}
    assert not bad, bad
