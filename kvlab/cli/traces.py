"""The trace arguments every ``kvlab`` command shares (``TRACE``, ``--format``, ``--block-size``,
``--trace-option``, ``--synthesize-prefix``), and ``kvlab info`` / ``kvlab convert``."""

from __future__ import annotations

import argparse
import inspect
import json
from pathlib import Path

from kvlab.paths import BUNDLED_TRACES


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _scalar(text: str) -> object:
    """``"3"`` → 3, ``"0.5"`` → 0.5, ``"true"``/``"false"`` (any case) → a bool, anything else stays a
    string."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text.replace("_", ""))
        except ValueError:
            pass
    return text


def parse_key_values(text: str) -> dict[str, object]:
    """``"a=1,b=0.5,c=x"`` → ``{"a": 1, "b": 0.5, "c": "x"}`` (``""`` → ``{}``).

    Raises:
        argparse.ArgumentTypeError: a part without ``=`` or with an empty name.

    Example:
        >>> parse_key_values("rate_per_s=2.5,seed=7,replace_keys=true")
        {'rate_per_s': 2.5, 'seed': 7, 'replace_keys': True}
    """
    out: dict[str, object] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise argparse.ArgumentTypeError(f"expected KEY=VALUE[,KEY=VALUE...], got {part!r} in {text!r}")
        if key.strip() in out:
            raise argparse.ArgumentTypeError(f"{key.strip()} given twice in {text!r}")
        out[key.strip()] = _scalar(value.strip())
    return out


def _format_name(text: str) -> str:
    from kvlab.traces import FORMATS

    if text not in FORMATS:
        raise argparse.ArgumentTypeError(f"unknown trace format {text!r}; known: {', '.join(FORMATS)}")
    return text


def add_trace_arguments(parser: argparse.ArgumentParser) -> None:
    """``TRACE`` and the options that say how to read it (every command that reads a trace)."""
    parser.add_argument("trace", help="trace file or folder in any supported format (kvlab formats), a "
                                      "bundled name (" + ", ".join(sorted(BUNDLED_TRACES)) + "), or - for stdin")
    parser.add_argument("--format", type=_format_name, default=None, metavar="NAME",
                        help="read TRACE as this format instead of detecting it from the content")
    parser.add_argument("--block-size", type=positive_int, default=None, metavar="TOKENS",
                        help="tokens per block id, for formats that do not record it (Mooncake default 512)")
    parser.add_argument("--trace-option", type=parse_key_values, action="append", default=[], metavar="K=V[,K=V]",
                        help="a loader option (e.g. rate_per_s=2.0,seed=1 for ServeGen's synthesized arrivals)")
    parser.add_argument("--synthesize-prefix", type=parse_key_values, nargs="?", const={}, default=None,
                        metavar="K=V[,K=V]",
                        help="give a trace without block identity (Azure, Vidur CSV) a stated synthetic sharing "
                             "model (kvlab.traces.synthesize_prefix; its parameters, defaults if none given, are "
                             "echoed in the trace's source and every summary)")


def load_trace_from_args(args: argparse.Namespace) -> object:
    """The :class:`~kvlab.traces.Trace` the trace arguments name (``--synthesize-prefix`` applied).

    Raises:
        ValueError, FileNotFoundError: as :func:`kvlab.traces.load_trace`; an unknown
            ``--synthesize-prefix`` parameter.
    """
    from kvlab.cli.files import load_trace_argument

    options: dict[str, object] = {}
    for group in args.trace_option:
        for key, value in group.items():
            if key in options and options[key] != value:
                raise ValueError(f"--trace-option {key} given twice ({options[key]!r}, {value!r})")
            options[key] = value
    if args.block_size is not None:
        if options.get("block_size", args.block_size) != args.block_size:
            raise ValueError(f"--block-size {args.block_size} and --trace-option block_size={options['block_size']} "
                             "disagree")
        options["block_size"] = args.block_size
    trace = load_trace_argument(args.trace, format=args.format, **options)
    if args.synthesize_prefix is not None:
        from kvlab.traces import synthesize_prefix

        known = [p for p in inspect.signature(synthesize_prefix).parameters if p != "trace"]
        unknown = sorted(set(args.synthesize_prefix) - set(known))
        if unknown:
            raise ValueError(f"--synthesize-prefix: unknown parameter(s) {', '.join(unknown)}; "
                             f"known: {', '.join(known)}")
        trace = synthesize_prefix(trace, **args.synthesize_prefix)
    return trace


def formats_table() -> str:
    """One line per format :func:`kvlab.traces.load_trace` knows, in detection order, with its options."""
    from kvlab.traces import FORMATS

    width = max(len(name) for name in FORMATS)
    return "\n".join(f"{name:<{width}}  {fmt.description}" + (f" [options: {', '.join(fmt.options)}]"
                                                             if fmt.options else "")
                     for name, fmt in FORMATS.items())


def add_info_and_convert_parsers(sub: argparse._SubParsersAction) -> None:
    """Register ``kvlab formats``, ``kvlab info`` and ``kvlab convert``."""
    sub.add_parser("formats", help="list the trace formats kvlab reads, in the order they are detected")
    info = sub.add_parser("info", help="print a trace's format, block size, sessions and statistics")
    add_trace_arguments(info)
    info.add_argument("--json", action="store_true", help="print one JSON object (statistics and provenance)")

    conv = sub.add_parser("convert", help="read a trace in any supported format, write it as kvlab Parquet",
                          description="The Parquet file keeps the columns, block size, source and provenance "
                                      "(format, path, loader options, notes); load_trace reads it back unchanged.")
    add_trace_arguments(conv)
    conv.add_argument("out", type=Path, metavar="OUT.parquet", help="the file to write (suffix .parquet)")


def cmd_info(args: argparse.Namespace) -> None:
    """``kvlab info TRACE``: :meth:`kvlab.traces.Trace.describe`, its provenance notes."""
    from dataclasses import replace

    from kvlab.traces import detect_format

    trace = load_trace_from_args(args)
    stats = trace.describe()
    path = Path(args.trace)
    if args.format is None and path.exists() and args.trace != "-":
        detected = detect_format(path).name
        if detected != trace.provenance.get("format"):  # kvlab Parquet converted from another format
            stats = replace(stats, format=f"{detected} (converted from {stats.format})")
    if args.json:
        print(json.dumps({**stats.to_dict(), "provenance": dict(trace.provenance)}))
        return
    print(stats)
    for note in trace.provenance.get("notes", []):
        print(f"note: {note}")


def cmd_convert(args: argparse.Namespace) -> None:
    """``kvlab convert TRACE OUT.parquet``.

    Raises:
        ValueError: ``OUT`` does not end in ``.parquet``, is the input itself, or is a folder.
    """
    out = args.out
    if out.suffix.lower() != ".parquet":
        raise ValueError(f"the output {out} must end in .parquet (kvlab Parquet, read back by load_trace)")
    if out.is_dir():
        raise ValueError(f"the output {out} is a folder; give a file name ending in .parquet")
    if Path(args.trace).exists() and out.exists() and out.resolve() == Path(args.trace).resolve():
        raise ValueError(f"the output {out} is the input; choose another file name")
    if not out.parent.is_dir():
        raise ValueError(f"cannot write {out}: folder {out.parent} does not exist")
    trace = load_trace_from_args(args)
    trace.write_parquet(out)
    print(f"wrote {out}: {len(trace):,} requests, {trace.block_size}-token blocks, "
          f"format {trace.provenance.get('format', 'in memory')}, {out.stat().st_size:,} bytes")
