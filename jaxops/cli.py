"""The ``jaxops`` command line (the demo, operator listing, golden data, benchmarks)."""

from __future__ import annotations

import argparse
import sys

import jaxops


def _cmd_ops(args) -> int:
    for name in jaxops.list_ops():
        op = jaxops.get_op(name)
        print(f"{name:32s} backends={','.join(op.backends())} data_dependent={op.data_dependent}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jaxops", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("ops", help="list registered operators")
    sub.add_parser("demo", help="run the main demo")
    args = parser.parse_args(argv)
    if args.command in ("ops", "demo"):
        return _cmd_ops(args)
    return 1


if __name__ == "__main__":
    sys.exit(main())
