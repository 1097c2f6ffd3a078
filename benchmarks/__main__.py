"""``python -m benchmarks``: every benchmark module beside its peers, as ratios.

A benchmark module is any module of this folder (helpers excepted) that defines
``run(quick: bool) -> list[Result]``; its docstring's first line describes it. The runner
finds them, runs the chosen ones with a progress line, prints the table of ratios and writes
``bench.json`` (and, with matplotlib, ``bench.png``) into ``--out``: by default
``$XDG_CACHE_HOME/jaxops/bench`` (``~/.cache/jaxops/bench``), never the current directory.
Run it from the source checkout (``make bench`` does).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import os
import pkgutil
import sys
import time
from pathlib import Path

import benchmarks

_HELPERS = {"common", "__main__"}  # modules of this folder that are not benchmarks


def discover() -> dict[str, str]:
    """``{module name: first docstring line}`` of every benchmark module, read without
    importing them (their imports are heavy: onnxruntime, large inputs).

    >>> "cases_nms" in discover() and "common" not in discover()
    True
    """
    found = {}
    for info in sorted(pkgutil.iter_modules(benchmarks.__path__), key=lambda m: m.name):
        if info.name in _HELPERS or info.name.startswith("_"):
            continue
        tree = ast.parse((Path(benchmarks.__path__[0]) / f"{info.name}.py").read_text())
        if any(isinstance(n, ast.FunctionDef) and n.name == "run" for n in tree.body):
            found[info.name] = (ast.get_docstring(tree) or "").split("\n")[0]
    return found


def default_out() -> Path:
    """Where results go unless ``--out`` says: ``$XDG_CACHE_HOME/jaxops/bench``.

    >>> default_out().parts[-2:]
    ('jaxops', 'bench')
    """
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "jaxops" / "bench"


def _parser(modules: dict[str, str]) -> argparse.ArgumentParser:
    listing = "\n".join(f"  {name:16s} {doc}" for name, doc in modules.items())
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__,
        epilog=f"benchmark modules (--only accepts these names):\n{listing}",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats")
    parser.add_argument("--only", action="append", metavar="NAME",
                        help="run only this module (repeatable, or comma-separated; a unique "
                             "part of a name is enough)")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"directory for bench.json / bench.png (default: {default_out()})")
    parser.add_argument("--no-plot", action="store_true", help="do not write bench.png")
    parser.add_argument("--hugepages", action="store_true",
                        help="re-run under GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (XLA's large "
                             "CPU buffers get the huge pages numpy uses). Off by default: users "
                             "run with default allocator settings, and targets are judged so")
    return parser


def _choose(parser: argparse.ArgumentParser, modules: dict[str, str], only: list[str] | None
            ) -> list[str]:
    if not only:
        return list(modules)
    chosen = []
    for want in (w for arg in only for w in arg.split(",") if w):
        matches = [m for m in modules if m == want] or [m for m in modules if want in m]
        if len(matches) != 1:
            parser.error(f"--only {want!r}: expected one of {', '.join(modules)}"
                         + (f" (matches {', '.join(matches)})" if matches else ""))
        chosen += [m for m in matches if m not in chosen]
    return chosen


class _Progress:
    """A redrawn bar on a terminal; one plain line per step otherwise (logs, pipes)."""

    def __init__(self, total: int):
        self.total, self.started = total, time.perf_counter()
        self.tty = sys.stdout.isatty()

    def show(self, done: int, label: str) -> None:
        elapsed = time.perf_counter() - self.started
        if not self.tty:
            print(f"[{done}/{self.total}] {label} ({elapsed:.1f}s)", flush=True)
            return
        filled = 24 * done // max(self.total, 1)
        print(f"\r[{'#' * filled}{'.' * (24 - filled)}] {done}/{self.total} {label:<28s} "
              f"{elapsed:6.1f}s", end="" if done < self.total else "\n", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Runs the chosen benchmark modules; returns the exit status."""
    modules = discover()
    parser = _parser(modules)
    args = parser.parse_args(argv)
    chosen = _choose(parser, modules, args.only)
    out = args.out or default_out()
    try:  # before any work; the default cache dir is made, a given one's parent must exist
        out.mkdir(parents=args.out is None, exist_ok=True)
    except (FileExistsError, FileNotFoundError, NotADirectoryError):
        parser.error(f"--out {out}: expected a directory (or a new one in an existing "
                     "directory)")
    from benchmarks import common  # after parsing: --help stays quick

    if args.hugepages:
        common.ensure_hugepages()
    print(f"GLIBC huge pages for large buffers: {'on' if common.hugepages_enabled() else 'off'}")
    progress, results = _Progress(len(chosen)), []
    for i, name in enumerate(chosen):
        progress.show(i, name)
        results.extend(importlib.import_module(f"benchmarks.{name}").run(args.quick))
    progress.show(len(chosen), "done")
    common.report(results, str(out / "bench.json"))
    if not args.no_plot and common.plot_ratios(results, str(out / "bench.png")):
        print(f"wrote {out / 'bench.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
