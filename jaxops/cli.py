"""The ``jaxops`` command line: the demo, the operator list, golden data and benchmarks.

    jaxops demo                 the main job (detection pipeline + hash-embedding training)
    jaxops ops [NAME] [--json]  registered operators: ports, dtypes, attrs, modes, backends
    jaxops golden OP [...]      a reference case for validating an Ascend kernel
    jaxops bench [--quick]      benchmarks side by side with their peers

User errors (unknown operator, bad attribute value) print one line and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys

from jaxops.core.errors import JaxopsError


class UsageError(Exception):
    """A mistake in the command line: one line on stderr, exit status 2."""


def _format_op(summary: dict) -> str:
    lines = [f"{summary['name']}" + (f" — {summary['doc']}" if summary["doc"] else "")]
    for kind in ("inputs", "outputs"):
        for p in summary[kind]:
            lines.append(f"  {kind[:-1]:6s} {p['name']:24s} {p['kind']:8s} {', '.join(p['dtypes'])}")
    for a in summary["attrs"]:
        default = "required" if a["required"] else f"default {a['default']!r}"
        lines.append(f"  attr   {a['name']:24s} {a['type']:8s} {default}; accepts {a['accepts']}")
    lines.append(f"  impl modes: {', '.join(summary['impl_modes'])}")
    lines.append(f"  backends: {', '.join(summary['backends'])}")
    lines.append(f"  data-dependent output shape: {'yes (OP_OUTSHAPE)' if summary['data_dependent'] else 'no'}")
    return "\n".join(lines)


def cmd_ops(args) -> int:
    import jaxops

    names = [args.name] if args.name else jaxops.list_ops()
    try:
        summaries = [jaxops.get_op(n).summary() for n in names]
    except KeyError as e:
        raise UsageError(str(e)) from None
    if args.json:
        print(json.dumps(summaries if not args.name else summaries[0], indent=2, default=str))
    else:
        print("\n\n".join(_format_op(s) for s in summaries))
    return 0


def cmd_demo(args) -> int:
    from jaxops import demo

    return demo.main(quick=args.quick)


def cmd_golden(args, extra: list[str]) -> int:
    from jaxops import golden

    if args.list:
        for name, doc in golden.list_cases():
            print(f"{name:36s} {doc}")
        return 0
    if not args.op:
        raise UsageError("golden: name an operator (jaxops golden --list shows them)")
    attrs = _parse_attr_args(args.op, extra)
    path = golden.write_case(args.op, seed=args.seed, out=args.out, attrs=attrs)
    print(f"wrote {path} (+ {path.rsplit('.', 1)[0]}.json)")
    return 0


def _parse_attr_args(op: str, argv: list[str]) -> dict:
    """``--name value`` pairs as attrs typed by the OpDef (errors name op and attr)."""
    from jaxops.core.errors import OpArgumentError
    from jaxops.core.registry import get_op

    opdef = get_op(op)  # looked up once for every pair
    attrs = {}
    it = iter(argv)
    for flag in it:
        if not flag.startswith("--"):
            raise OpArgumentError(op, None, "attrs as --name value", repr(flag))
        attr = opdef.attr(flag[2:].replace("-", "_"))  # unknown → "did you mean"
        value = next(it, None)
        if value is None:
            raise OpArgumentError(op, attr.name, "a value after the flag", "nothing")
        attrs[attr.name] = attr.parse_text(op, value)
    return attrs


def cmd_bench(args) -> int:
    from jaxops import bench

    return bench.main(quick=args.quick, json_path=args.json, png_path=args.png, only=args.only,
                      hugepages=not args.no_hugepages)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jaxops", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("demo", help="run the main job on embedded synthetic data")
    p.add_argument("--quick", action="store_true", help="fewer images and training steps")

    p = sub.add_parser("ops", help="list registered operators")
    p.add_argument("name", nargs="?", help="show one operator")
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = sub.add_parser("golden", help="write a golden reference case (.npz + .json) for an op",
                       description="Write a golden case: inputs, outputs in wire layout, the "
                       "OP_OUTSHAPE tensor, attrs and impl mode. Op attrs are given as "
                       "--name value (e.g. --size 16 --transpose true).")
    p.add_argument("op", nargs="?", help="operator name (see --list)")
    p.add_argument("--list", action="store_true", help="list the operators golden data exists for")
    p.add_argument("--seed", type=int, default=0, help="random seed (output is deterministic per seed)")
    p.add_argument("--out", help="output .npz path (default: golden_<OP>_seed<N>.npz)")

    p = sub.add_parser("bench", help="benchmarks side by side with their peers (ratios)")
    p.add_argument("--quick", action="store_true", help="small sizes, few repeats")
    p.add_argument("--only", help="run only benchmark modules whose name contains this")
    p.add_argument("--json", default="benchmarks/results/bench.json", help="where to write JSON")
    p.add_argument("--png", default="benchmarks/results/bench.png",
                   help="where to write the bar chart (needs matplotlib)")
    p.add_argument("--no-hugepages", action="store_true",
                   help="do not re-run under GLIBC_TUNABLES=glibc.malloc.hugetlb=1, which gives "
                        "XLA's large CPU buffers the huge pages numpy uses")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args, extra = parser.parse_known_args(argv)
    try:
        if args.command == "golden":
            return cmd_golden(args, extra)
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        return {"demo": cmd_demo, "ops": cmd_ops, "bench": cmd_bench}[args.command](args)
    except BrokenPipeError:  # `jaxops ops | head`: the reader left; not an error
        sys.stderr.close()
        return 0
    except (UsageError, JaxopsError) as e:
        print(f"jaxops {args.command}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # e.g. an --out path that cannot be written
        print(f"jaxops {args.command}: error: {e.strerror or e}: {e.filename or ''}".rstrip(": "),
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
