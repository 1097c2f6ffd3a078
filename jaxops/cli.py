"""The ``jaxops`` command line: the demo, the operator list and golden data.

    jaxops demo                 the main job (detection pipeline + hash-embedding training)
    jaxops ops [NAME] [--json]  registered operators: ports, dtypes, fill values, attrs,
                                modes, backends
    jaxops golden OP [...]      a reference case for validating an Ascend kernel
                                (jaxops golden OP --help lists OP's attributes)
    jaxops golden --onnx MODEL --inputs NPZ --out DIR
                                every data-dependent node of one run of an ONNX model
    jaxops golden check FILE    check a case against its independent numpy reference
    jaxops golden compare GOLDEN ACTUAL
                                compare an NPU's outputs with a case, or a model's dump
                                with its golden folder (exit 1 on a failure)

The benchmarks are not part of the package: in a source checkout, ``python -m benchmarks``
(``make bench``) runs them.

Every jaxops error (unknown operator, bad attribute value, bad --seed, an --out that
cannot be written) prints one line ``jaxops: error: ...`` and exits with status 2. Only
what a command needs is imported (``jaxops golden`` loads neither the hash tables nor the
Ascend backend).

>>> main(["ops", "NoSuchOp"])
2
"""

from __future__ import annotations

import argparse
import json
import sys

from jaxops.core.errors import JaxopsError, OpArgumentError, UsageError

__all__ = ["build_parser", "main"]

_UNTYPED = "no dtype declared (a non-tensor object)"


def _format_op(summary: dict) -> str:
    lines = [f"{summary['name']}" + (f" — {summary['doc']}" if summary["doc"] else "")]
    for kind in ("inputs", "outputs"):
        for p in summary[kind]:
            dtypes = ", ".join(p["dtypes"]) if p["dtypes"] != ["any"] else (p["doc"] or _UNTYPED)
            fill = f"; fill {p['fill_value']!r}" if "fill_value" in p else ""
            lines.append(f"  {kind[:-1]:6s} {p['name']:24s} {p['kind']:8s} {dtypes}{fill}")
    for a in summary["attrs"]:
        default = "required" if a["required"] else f"default {a['default']!r}"
        lines.append(f"  attr   {a['name']:24s} {a['type']:8s} {default}; accepts {a['accepts']}")
    lines.append(f"  impl modes: {', '.join(summary['impl_modes'])}")
    lines.append(f"  backends: {', '.join(summary['backends'])}")
    lines.append(f"  data-dependent output shape: {'yes (OP_OUTSHAPE)' if summary['data_dependent'] else 'no'}")
    return "\n".join(lines)


def _cmd_ops(args: argparse.Namespace) -> int:
    import jaxops

    names = [args.name] if args.name else jaxops.list_ops()
    summaries = [jaxops.get_op(n).summary() for n in names]  # unknown → UnknownOpError, one line
    if args.json:
        print(json.dumps(summaries if not args.name else summaries[0], indent=2, default=str))
    else:
        print("\n\n".join(_format_op(s) for s in summaries))
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from jaxops import demo

    return demo.main()


def _golden_help(op: str) -> str:
    from jaxops.core.registry import REQUIRED, get_op
    from jaxops.golden import contracts, get_spec

    spec, opdef = get_spec(op), get_op(op)
    fixed, table = spec.shape is None, spec.build is not None
    lines = [f"usage: jaxops golden {op} [--seed N] [--out PATH] [--force] [--bin] "
             + ("[--bucket_size N] [--embedding_dim D] " if table else "")
             + ("" if fixed else "[--shape D,D,...] [--dtype NAME] ")
             + ("[--input FILE] " if table or not fixed else "")
             + "".join(f"[--{t} ...] " for t in spec.takes)
             + ("[--contract NAME] " if contracts.choices(op) else "")
             + "[--impl_mode MODE] [--ATTR VALUE ...]", "", spec.doc, ""]
    if table:
        lines.append(f"inputs (CANN's names): {', '.join(spec.input_names)}; a table is its "
                     "bucket bytes, uint8 [bucket_size, 24 + round_up_8(4 * embedding_dim)]")
        lines.append("table: --bucket_size N (default 64) and --embedding_dim D (default 4), "
                     "CANN's attrs; --input FILE: your inputs, a .npz by those names (or a "
                     "--bin .json; the tables' sizes come from their bytes)")
        if not fixed:
            lines.append(f"--shape: {spec.shape_doc}. Defaults: --shape "
                         f"{','.join(map(str, spec.shape))}, --dtype {spec.dtype}")
    elif not fixed:
        lines.append(f"inputs: --shape is {spec.shape_doc} (default "
                     f"{','.join(map(str, spec.shape))}); --dtype its dtype (default {spec.dtype}); "
                     "--input FILE: your own (.npz by input name, .bin, or a --bin .json)")
    elif not table:
        lines.append("inputs: fixed (no --shape/--dtype/--input)")
    if contracts.choices(op):
        lines.append("contract (--contract): " + ", ".join(contracts.choices(op))
                     + " (the first is the default; docs/golden.md says what each follows)")
    lines.append("impl modes (--impl_mode): " + ", ".join(opdef.summary()["impl_modes"]))
    lines.append("attributes (--name value; lists comma-separated, bools true/false):")
    for a in opdef.attrs:
        default = spec.default_attrs.get(a.name, a.default)
        said = "required" if default is REQUIRED else f"default {default!r}"
        lines.append(f"  --{a.name:30s} {a.type:10s} {said}; accepts {a.describe()}")
    if not opdef.attrs:
        lines.append("  (none)")
    return "\n".join(lines)


def _parse_attr_args(op: str, argv: list[str]) -> dict:
    """``--name value`` pairs as attrs typed by the OpDef (errors name op and attr)."""
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


def _parse_shape(text: str | None) -> tuple[int, ...] | None:
    """``--shape``: comma-separated non-negative ints (``4,5,6``); ``3x4``, ``2,,3`` and an
    empty text are refused."""
    if text is None:
        return None
    parts = text.split(",")
    if not text.strip() or not all(p.strip().isdigit() for p in parts):
        raise OpArgumentError("golden", "shape", "comma-separated non-negative ints such as "
                              "4,5,6", repr(text))
    return tuple(int(p) for p in parts)


def _parse_size(name: str, text: str) -> int:
    """``--bucket_size`` / ``--embedding_dim``: a positive int (the table cases check more)."""
    if not text.strip().isdigit() or int(text) < 1:
        raise OpArgumentError("golden", name, "a positive int such as 64", repr(text))
    return int(text)


def _golden_tool(command: str, argv: list[str]) -> int:
    """``jaxops golden check FILE...`` and ``jaxops golden compare GOLDEN ACTUAL``."""
    from jaxops import golden

    tool = argparse.ArgumentParser(prog=f"jaxops golden {command}")
    if command == "check":
        tool.add_argument("files", nargs="+", help="golden .npz files, or a model's golden "
                          "folders (checked against onnx.reference)")
        tool.add_argument("--onnx", metavar="MODEL", help="a model folder's model (default: "
                          "the path its index records)")
        args = tool.parse_args(argv)
        from jaxops.golden import models
        for path in args.files:
            if models.is_model_folder(path):
                if _check_model(path, args.onnx):
                    return 1
                continue
            try:
                golden.check_case(path)
            except AssertionError as e:
                print(f"{path}: FAIL: {_one_line(str(e))}")
                return 1
            print(f"{path}: ok (equals the independent reference of its contract)")
        return 0
    tool.add_argument("golden", help="the golden case (.npz)")
    tool.add_argument("actual", help="the NPU's outputs: a .npz by output name, or a folder "
                      "of <output>.bin files")
    tool.add_argument("--json", action="store_true", help="the report as JSON")
    tool.add_argument("--listed", type=int, default=10, help="differing elements listed per output")
    args = tool.parse_args(argv)
    from jaxops.golden import models
    if models.is_model_folder(args.golden):
        report = models.compare_model(args.golden, args.actual, listed=args.listed)
        print(json.dumps(report.as_dict(), indent=1, default=str) if args.json else report.text())
        return 0 if report.passed else 1
    report = golden.compare_case(args.golden, args.actual, listed=args.listed)
    from jaxops.golden.compare import report_json
    print(report_json(report) if args.json else report.text())
    return 0 if report.passed else 1


def _check_model(path: str, model: str | None) -> bool:
    """Prints each node's check of a model's golden folder; whether one failed."""
    _need_onnx("--onnx")
    from jaxops.onnx.golden_check import check_model

    results = check_model(path, model)
    for r in results:
        print(f"{path}: {r.line()}")
    return any(r.status == "FAIL" for r in results)


def _need_onnx(flag: str) -> None:
    import importlib.util

    if importlib.util.find_spec("onnx") is None:
        raise OpArgumentError("golden", flag, "the onnx package installed "
                              "(pip install 'jaxops[onnx]')", "no module named 'onnx'")


def _golden_model(args: argparse.Namespace, extra: list[str]) -> int:
    """``jaxops golden --onnx MODEL --inputs NPZ --out DIR [--bin] [--force]``."""
    given = [f"--{k}" for k in ("seed", "shape", "dtype", "input", "density", "special",
                                "contract", "impl_mode", "bucket_size", "embedding_dim")
             if getattr(args, k) not in (None, 0)]
    if args.op or extra or given or args.list:
        raise UsageError("golden --onnx: takes --inputs, --out, --bin and --force only, got "
                         + " ".join([args.op or "", *extra, *given, "--list" * args.list]).strip())
    if not args.onnx:
        raise OpArgumentError("golden", "--onnx", "the model (--inputs goes with --onnx)",
                              "no --onnx")
    if args.inputs is None or args.out is None:
        raise OpArgumentError("golden --onnx", "--inputs" if args.inputs is None else "--out",
                              "a value (--inputs NPZ: the graph inputs by name; --out DIR)",
                              "nothing")
    _need_onnx("--onnx")
    from jaxops.onnx.golden import write_model_golden

    index = write_model_golden(args.onnx, args.inputs, args.out, bin=args.bin, force=args.force)
    print(f"wrote {index}")
    return 0


def _cmd_golden(args: argparse.Namespace, extra: list[str], parser: argparse.ArgumentParser) -> int:
    if args.op in ("check", "compare"):
        return _golden_tool(args.op, extra + (["--help"] if args.help else []))
    from jaxops import golden
    from jaxops.golden.generators import Generation

    if args.help:
        print(_golden_help(args.op) if args.op else parser.format_help())
        return 0
    if args.list:
        for name, doc in golden.list_cases():
            print(f"{name:36s} {doc}")
        return 0
    if args.onnx is not None or args.inputs is not None:
        return _golden_model(args, extra)
    if not args.op:
        raise UsageError("golden: name an operator (jaxops golden --list shows them)")
    special = tuple(k for k in (args.special or "").split(",") if k)
    if args.special is not None and not special:
        raise OpArgumentError("golden", "special", "a comma-separated list of kinds", repr(args.special))
    generation = Generation(args.density, special)
    shape = _parse_shape(args.shape)
    sizes = {name: _parse_size(name, getattr(args, name)) for name in ("bucket_size", "embedding_dim")
             if getattr(args, name) is not None}
    from jaxops.golden import files  # an existing case is refused before JAX even loads
    files.refuse_existing(files.target(args.op, args.seed, args.out), args.bin, args.force)
    golden.get_spec(args.op)  # loads its operators (not the whole library): unknown → hint
    attrs = {**_parse_attr_args(args.op, extra), **sizes}
    path = golden.write_case(args.op, seed=args.seed, out=args.out, attrs=attrs,
                             shape=shape, dtype=args.dtype, force=args.force,
                             bin=args.bin, input_path=args.input, contract=args.contract,
                             impl_mode=args.impl_mode, generation=generation)
    stem = path.rsplit(".", 1)[0]
    print(f"wrote {path} (+ {stem}.json" + (f", {stem}/*.bin" if args.bin else "") + ")")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``jaxops`` argument parser (golden's op attrs pass through).

    >>> build_parser().parse_args(["ops", "Unique", "--json"]).name
    'Unique'
    """
    from jaxops import __version__

    parser = argparse.ArgumentParser(prog="jaxops", description=__doc__.split("\n>>>")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"jaxops {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    # No --quick: compiling dominates the demo (fewer images and steps saved ~1 s of ~20).
    sub.add_parser("demo", help="run the main job on embedded synthetic data")

    p = sub.add_parser("ops", help="list registered operators")
    p.add_argument("name", nargs="?", help="show one operator")
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = sub.add_parser("golden", add_help=False,
                       help="write a golden reference case (.npz + .json) for an op",
                       description="Write a golden case: inputs, outputs in wire layout, the "
                       "OP_OUTSHAPE tensor, attrs and impl mode. Op attrs are given as "
                       "--name value (e.g. --size 16 --transpose true); "
                       "jaxops golden OP --help lists OP's.")
    p.add_argument("op", nargs="?", help="operator name (see --list), or check / compare")
    p.add_argument("-h", "--help", action="store_true",
                   help="show this help, or with OP that operator's attributes and inputs")
    p.add_argument("--list", action="store_true", help="list the operators golden data exists for")
    p.add_argument("--seed", type=int, default=0,
                   help="random seed, a non-negative int (output is deterministic per seed)")
    p.add_argument("--out", help="output .npz path, or an existing directory to write "
                   "golden_<OP>_seed<N>.npz into (default: that name here); a missing "
                   "directory is refused, as ht.save does")
    p.add_argument("--force", action="store_true", help="overwrite an existing case")
    p.add_argument("--bin", action="store_true", help="also write raw little-endian .bin files "
                   "(inputs, outputs, max-shape buffers, OP_OUTSHAPE) into PATH/, named in the .json")
    p.add_argument("--shape", help="input shape, e.g. 4,5,6 (OP --help says which input)")
    p.add_argument("--dtype", help="input dtype, e.g. float16, int8, bool, bfloat16")
    p.add_argument("--input", help="your inputs: a .npz by input name, a .bin (with --shape, "
                   "--dtype) or a .json written with --bin")
    p.add_argument("--density", type=float, help="fraction of non-zero (NonZero, Unique) or "
                   "set (MaskedSelect's mask) elements, 0 to 1")
    p.add_argument("--special", help="special values written over some elements: "
                   "nan,inf,zero,subnormal,extreme or all")
    p.add_argument("--contract", help="the kernel contract where there are several "
                   "(NonMaxSuppression: aclnn, the default, or onnx)")
    p.add_argument("--impl_mode", help="impl mode to run, e.g. high_precision, high_performance")
    p.add_argument("--bucket_size", help="hash-table cases: the table's buckets (CANN's "
                   "bucket_size attr; default 64)")
    p.add_argument("--embedding_dim", help="hash-table cases: floats per row (CANN's "
                   "embedding_dim attr; default 4)")
    p.add_argument("--onnx", metavar="MODEL", help="an ONNX model: write golden cases for every "
                   "data-dependent node of one run into --out DIR, with DIR/index.json")
    p.add_argument("--inputs", metavar="NPZ", help="with --onnx: the graph inputs by name")
    p.set_defaults(subparser=p)  # golden prints its own help (with OP: the op's attributes)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs the command line; returns the exit status (2 for any jaxops error).

    >>> main(["golden", "NonZero", "--seed", "-1"])
    2
    """
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args, extra = parser.parse_known_args(argv)
    try:
        if args.command == "golden":
            return _cmd_golden(args, extra, args.subparser)
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        return {"demo": _cmd_demo, "ops": _cmd_ops}[args.command](args)
    except BrokenPipeError:  # `jaxops ops | head`: the reader left; not an error
        sys.stderr.close()
        return 0
    except JaxopsError as e:
        print(f"jaxops: error: {_one_line(str(e))}", file=sys.stderr)
        return 2
    except MemoryError as e:  # an allocation no estimate foresaw (numpy's ArrayMemoryError)
        print(f"jaxops: error: out of memory: {_one_line(str(e))}", file=sys.stderr)
        return 2
    except OSError as e:  # e.g. an --out path that cannot be written
        print(f"jaxops: error: {e.strerror or e}: {e.filename or ''}".rstrip(": "),
              file=sys.stderr)
        return 2


def _one_line(message: str) -> str:
    return " ".join(message.split("\n"))


if __name__ == "__main__":
    sys.exit(main())
