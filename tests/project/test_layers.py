"""The layers of the design hold: lower layers never import higher ones."""

import ast
import functools
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


@functools.cache
def _import_nodes(path: pathlib.Path) -> tuple:
    """The ``import`` and ``from ... import`` statements of a file, function-local ones
    included (parsed once per file for all the tests here)."""
    return tuple(node for node in ast.walk(ast.parse(path.read_text()))
                 if isinstance(node, (ast.Import, ast.ImportFrom)))


def _project_imports(package: str) -> dict[str, set[str]]:
    """Every project module each file of ``package`` imports, function-local ones included."""
    root = pathlib.Path(__file__).resolve().parents[2]
    found = {}
    for path in sorted((root / package.replace(".", "/")).rglob("*.py")):
        names = set()
        for node in _import_nodes(path):
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


def test_kernel_for_a_misspelt_op_raises_with_the_close_match():
    import jaxops

    jaxops.list_ops()  # loads the library (lazily imported): from then on names are checked at once
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
    root = pathlib.Path(__file__).resolve().parents[2]
    imports = {f: n for f, n in _project_imports("jaxops.ops").items()
               if not f.endswith("__init__.py")}  # a package gathers
    operators = {f[:-3].replace("/", ".") for f in imports
                 if "register_op(" in (root / f).read_text()}
    assert {"jaxops.ops.nonzero", "jaxops.ops.nms.efficient_nms"} <= operators
    bad = {f: sorted(n & operators) for f, n in imports.items() if n & operators}
    assert not bad, bad
    assert _private_part("jaxops.hashtable._ops.inserting") == 2  # the check above can fail


#: The layers of docs/ARCHITECTURE.md, bottom first; a module imports only its own layer and
#: those below. Everything else of ``jaxops`` (the package's face: ``__init__``, cli, demo,
#: errors, embedding, nnx, equinox) is the top layer.
LAYERS = [("jaxops.core",), ("jaxops.backends", "jaxops.native"), ("jaxops.capacity",),
          ("jaxops.ops",), ("jaxops.hashtable",), ("jaxops.golden",), ("tracing",),
          ("jaxops.dynamic",), ("jaxops.onnx",)]


@functools.cache
def _module_graph() -> dict[str, set[str]]:
    """Every module of jaxops and tracing → the project modules it imports (function-local
    imports included; ``from pkg import name`` counts as ``pkg.name`` when that is a
    module)."""
    root = pathlib.Path(__file__).resolve().parents[2]
    paths = {}
    for path in sorted([*(root / "jaxops").rglob("*.py"), *(root / "tracing").rglob("*.py")]):
        parts = path.relative_to(root).with_suffix("").parts
        paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def resolve(name):
        parts = name.split(".")
        while parts and ".".join(parts) not in paths:
            parts.pop()
        return ".".join(parts) or None

    graph = {}
    for name, path in paths.items():
        deps = set()
        for node in _import_nodes(path):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                deps.update(resolve(f"{node.module}.{a.name}") for a in node.names)
            elif isinstance(node, ast.Import):
                deps.update(resolve(a.name) for a in node.names)
        graph[name] = deps - {None, name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_in_jaxops_or_tracing():
    graph = _module_graph()
    assert "jaxops.hashtable._ops.inserting" in graph and len(graph) > 100
    assert not _cycles(graph), _cycles(graph)


def test_a_circle_is_found():  # the check above can fail
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_reaches_a_higher_layer():
    def layer(module):
        for i, prefixes in enumerate(LAYERS):
            if any(module == p or module.startswith(p + ".") for p in prefixes):
                return i
        return len(LAYERS)

    upward = sorted(f"{m} -> {d}" for m, deps in _module_graph().items() for d in deps
                    if layer(d) > layer(m))
    assert not upward, upward


def test_no_module_imports_a_private_name_of_another():
    root = pathlib.Path(__file__).resolve().parents[2]
    bad = []
    for path in sorted([*(root / "jaxops").rglob("*.py"), *(root / "tracing").rglob("*.py")]):
        for node in _import_nodes(path):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                    and node.module.split(".")[0] in ("jaxops", "tracing"):
                bad += [f"{path.relative_to(root)}: {node.module}.{a.name}" for a in node.names
                        if a.name.startswith("_") and not a.name.startswith("__")]
    assert not bad, bad
    assert _private_part("jaxops.hashtable._ops.inserting") == 2  # the check above can fail


#: The hash-table wing's folders, bottom first (docs/ARCHITECTURE.md): a module of the wing
#: imports only its own folder and the folders below it. The public subpackages share the
#: level above the operations; the modules directly in ``jaxops/hashtable/`` (its face:
#: ``__init__``, ``words``) are above them all.
WING = [("_table",), ("_walks",), ("_kernels",), ("_placement",), ("_ops",),
        ("cann", "optim", "checkpoint")]


def _wing_level(module: str) -> int:
    folder = (module.split(".") + [None])[2]  # jaxops.hashtable.<folder or face module>...
    return next((i for i, folders in enumerate(WING) if folder in folders), len(WING))


def test_the_wing_folders_are_its_layers():
    graph = {m: {d for d in deps if d.startswith("jaxops.hashtable.")}
             for m, deps in _module_graph().items() if m.startswith("jaxops.hashtable.")}
    assert {_wing_level(m) for m in graph} == set(range(len(WING) + 1)), sorted(graph)
    upward = sorted(f"{m} -> {d}" for m, deps in graph.items() for d in deps
                    if _wing_level(d) > _wing_level(m))
    assert not upward, upward


def test_the_wings_modules_have_unique_names_and_small_folders():
    root = pathlib.Path(__file__).resolve().parents[2] / "jaxops" / "hashtable"
    modules = [p for p in root.rglob("*.py") if p.name != "__init__.py"]
    names = [p.stem.lstrip("_") for p in modules]
    assert len(set(names)) == len(names), sorted(n for n in names if names.count(n) > 1)
    per_folder = {d: sum(p.parent == d for p in modules) for d in {p.parent for p in modules}}
    assert max(per_folder.values()) <= 12, per_folder


#: White-box tests of private modules (as optax tests its ``_src``): each of these files may
#: import the private modules named, and nothing else outside their package does. The
#: checksums' algebra, the probe-structure check against brute force and forged metadata
#: (the checkpoint adversary) are tested where they are written, not through a save.
WHITE_BOX = {
    "tests/hashtable/checkpoint/test_checkpoint.py": {"jaxops.hashtable.checkpoint._checksums",
                                           "jaxops.hashtable.checkpoint._meta",
                                           "jaxops.hashtable.checkpoint._saved",
                                           "jaxops.hashtable.checkpoint._tree",
                                           "jaxops.hashtable._walks.probe_check"},
    "tests/hashtable/checkpoint/test_guard.py": {"jaxops.hashtable.checkpoint._guard",
                                       "jaxops.hashtable.checkpoint._handler",
                                       "jaxops.hashtable.checkpoint._meta"},
    "tests/native/test_native_hash.py": {"jaxops.hashtable._walks.probe",
                                  "jaxops.hashtable._walks.probe_check"},
    "tests/hashtable/test_window.py": {"jaxops.hashtable._walks.probe"},
    "tests/hashtable/test_table_row_moves.py": {"jaxops.hashtable._table.buffers",
                                                "jaxops.hashtable._walks.row_gather"},
    "tests/hashtable/optim/test_half_rounding.py": {"jaxops.hashtable._table.row_dtype"},
    "benchmarks/hashtable_checkpoint.py": {"jaxops.hashtable.checkpoint._checksums"},
    "benchmarks/checkpoint_adversary.py": {"jaxops.hashtable.checkpoint._meta"},
}


def _private_modules_imported(path: pathlib.Path) -> set[str]:
    """The project modules (or names) with a ``_private`` part that ``path`` imports
    (``from pkg import _mod`` included)."""
    found = set()
    for node in _import_nodes(path):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            if name.split(".")[0] in ("jaxops", "tracing") and _private_part(name) is not None:
                found.add(name)
    return found


def _private_part(name: str) -> int | None:
    """The index of the first ``_private`` part of a dotted name (None: no such part)."""
    return next((i for i, p in enumerate(name.split(".")) if p.startswith("_")
                 and not p.startswith("__")), None)


def test_no_private_module_is_imported_from_outside_its_package():
    # ``a.b._c`` (a module or a folder) is private to ``a.b``: only modules inside ``a.b``
    # import it. Everything else goes through the public face (jaxops.hashtable, its
    # optim / cann / checkpoint / words), except the white-box tests named above.
    root = pathlib.Path(__file__).resolve().parents[2]
    bad = []
    for folder in ("jaxops", "tracing", "tests", "benchmarks", "examples"):
        for path in sorted((root / folder).rglob("*.py")):
            rel = str(path.relative_to(root))
            parts = path.relative_to(root).with_suffix("").parts
            here = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            for private in _private_modules_imported(path):
                if any(f"{private}.".startswith(f"{m}.") for m in WHITE_BOX.get(rel, ())):
                    continue
                package = ".".join(private.split(".")[:_private_part(private)])
                if not (here + ".").startswith(package + "."):
                    bad.append(f"{rel}: {private}")
    assert not bad, bad
    assert _private_part("jaxops.hashtable._ops.inserting") == 2  # the check above can fail
