"""``jaxops bench``: every benchmark beside its peer, in one process, as ratios.

The benchmarks live in the source checkout's ``benchmarks/`` folder (``benchmarks/ops.py``
and its ``cases_*.py`` modules, ``benchmarks/hashtable.py``); each module's
``run(quick) -> list[Result]`` times jaxops and the peer interleaved on the same inputs.
This command runs them with a progress bar, prints the table of ratios, writes JSON and,
when matplotlib is installed, a PNG bar chart of the ratios against their targets.
"""

from __future__ import annotations

import importlib
import os
import sys
import time

from jaxops.core.errors import JaxopsError


class BenchmarksNotFound(JaxopsError):
    """``benchmarks/`` is not importable (jaxops installed without its source checkout)."""


def _import_benchmarks():
    try:
        return importlib.import_module("benchmarks.ops"), importlib.import_module("benchmarks.common")
    except ImportError:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        if os.path.isdir(os.path.join(root, "benchmarks")) and root not in sys.path:
            sys.path.insert(0, root)
            return _import_benchmarks()
        raise BenchmarksNotFound("the benchmarks live in the source checkout's benchmarks/ "
                                 "folder; run jaxops bench from a clone of the repository") from None


def _modules(ops_module, only: str | None) -> list[str]:
    names = [f"benchmarks.{m}" for m in ops_module.case_modules()]
    try:
        importlib.import_module("benchmarks.hashtable")
        names.append("benchmarks.hashtable")
    except ImportError:
        pass
    return [n for n in names if not only or only in n]


def _progress(done: int, total: int, label: str, started: float) -> None:
    width = 24
    filled = int(width * done / max(total, 1))
    bar = "#" * filled + "." * (width - filled)
    print(f"\r[{bar}] {done}/{total} {label:<28s} {time.perf_counter() - started:6.1f}s",
          end="" if done < total else "\n", flush=True)


def plot_ratios(results, path: str) -> str | None:
    """Bar chart of ratios with target markers; ``None`` (and a note) without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(no matplotlib: skipping the PNG chart; pip install 'jaxops[plot]')")
        return None
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(results) + 1.5))
    names = [r.name for r in results]
    colours = ["#55a868" if r.meets_target in (True, None) else "#c44e52" for r in results]
    ax.barh(names, [r.ratio for r in results], color=colours)
    for i, r in enumerate(results):
        if r.target is not None:
            ax.plot([r.target, r.target], [i - 0.4, i + 0.4], color="black", linewidth=2)
    ax.axvline(1.0, color="grey", linestyle=":")
    ax.set_xlabel("time ratio jaxops / peer (lower is better; black tick = target)")
    ax.invert_yaxis()
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(quick: bool = False, json_path: str | None = None, png_path: str | None = None,
         only: str | None = None, hugepages: bool = True) -> int:
    ops_module, common = _import_benchmarks()
    if hugepages:
        common.ensure_hugepages()
    print(f"GLIBC huge pages for large buffers: {'on' if common.hugepages_enabled() else 'off'}")
    modules = _modules(ops_module, only)
    if not modules:
        raise BenchmarksNotFound(f"no benchmark module matches {only!r}")
    results, started = [], time.perf_counter()
    for i, name in enumerate(modules):
        _progress(i, len(modules), name.split(".")[-1], started)
        results.extend(importlib.import_module(name).run(quick))
    _progress(len(modules), len(modules), "done", started)
    common.report(results, json_path)
    if png_path and plot_ratios(results, png_path):
        print(f"wrote {png_path}")
    return 0
