"""Benchmarks of the data-dependent-shape operators, side by side with their peers.

Run ``python -m benchmarks.ops [--quick] [--json PATH]``. Each ``benchmarks/cases_*.py``
module (except the hash tables, see ``benchmarks/hashtable.py``) defines
``run(quick: bool) -> list[Result]``; this runner collects them, prints the ratio table and
writes JSON.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil

import benchmarks
from benchmarks.common import Result, ensure_hugepages, report


def case_modules() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(benchmarks.__path__)
                  if m.name.startswith("cases_"))


def run_all(quick: bool = False, only: str | None = None, progress=None) -> list[Result]:
    results: list[Result] = []
    for name in case_modules():
        if only and only not in name:
            continue
        if progress:
            progress(name)
        results.extend(importlib.import_module(f"benchmarks.{name}").run(quick))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats")
    parser.add_argument("--no-hugepages", action="store_true",
                        help="do not re-run under GLIBC_TUNABLES=glibc.malloc.hugetlb=1 "
                             "(see benchmarks.common.ensure_hugepages)")
    parser.add_argument("--only", help="run only case modules whose name contains this")
    parser.add_argument("--json", default="benchmarks/results/ops.json")
    args = parser.parse_args(argv)
    if not args.no_hugepages:
        ensure_hugepages()
    results = run_all(args.quick, args.only, progress=lambda n: print(f"running {n} ...", flush=True))
    report(results, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
