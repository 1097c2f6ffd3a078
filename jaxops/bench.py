"""``jaxops bench``: runs ``python -m benchmarks`` from the source checkout.

The benchmarks live in the checkout's ``benchmarks/`` folder, beside the ``jaxops``
package (``benchmarks/__main__.py`` finds the modules, runs them, reports ratios, writes
results to ``--out``). This command finds that folder relative to the installed package and
runs the runner there in a child process (no ``sys.path`` editing); arguments pass through,
so ``jaxops bench --help`` lists the modules ``--only`` accepts. An installed jaxops
without its checkout says so in one line.

>>> (benchmarks_root() / "benchmarks" / "__main__.py").is_file()  # in a source checkout
True
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jaxops
from jaxops.core.errors import BenchmarksNotFound

__all__ = ["benchmarks_root", "main"]


def benchmarks_root() -> Path:
    """The source checkout holding ``benchmarks/`` (the folder above the ``jaxops`` package).

    Returns:
      The checkout's root directory.

    Raises:
      BenchmarksNotFound: jaxops is installed without its source checkout.
    """
    root = Path(jaxops.__file__).resolve().parents[1]
    if not (root / "benchmarks" / "__main__.py").is_file():
        raise BenchmarksNotFound(f"the benchmarks live in a source checkout's benchmarks/ "
                                 f"folder, and there is none beside jaxops ({root}); run "
                                 "jaxops bench from a clone of the repository")
    return root


def main(argv: list[str]) -> int:
    """Runs ``python -m benchmarks ARGV`` in the checkout; returns its exit status.

    A relative ``--out`` is taken from the caller's directory, not the checkout's.
    """
    root = benchmarks_root()
    return subprocess.run([sys.executable, "-m", "benchmarks", *_absolute_out(argv)],
                          cwd=root).returncode


def _absolute_out(argv: list[str]) -> list[str]:
    out, it = [], iter(argv)
    for arg in it:
        if arg == "--out":
            value = next(it, None)
            out += [arg] if value is None else [arg, os.path.abspath(value)]
        elif arg.startswith("--out="):
            out.append("--out=" + os.path.abspath(arg[len("--out="):]))
        else:
            out.append(arg)
    return out
