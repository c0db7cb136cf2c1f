"""The ``kvlab`` command: ``kvlab info``, ``convert``, ``formats``, ``replay``, ``sweep``, ``simulate``,
``figures``, ``demo``, ``events``, ``dashboard``, ``warmup``.

TRACE arguments are a file or folder in any format :func:`kvlab.traces.load_trace` reads
(``kvlab formats`` lists them), the name of a bundled trace (``conversation``, ``synthetic``)
when no such file exists, or ``-`` for a trace piped to stdin (:mod:`kvlab.cli.traces`). Errors in
the input go to stderr as ``kvlab: error: ...`` with exit status 2; an output folder (``--out``)
is created and checked writable before any work. A stdout closed before the output is written
(``kvlab ... | head``) ends the command quietly with status 141, as SIGPIPE would.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kvlab import __version__
from kvlab.cli.files import EXIT_BROKEN_PIPE, prepare_out, silence_stdout
from kvlab.cli.traces import (
    add_info_and_convert_parsers,
    add_trace_arguments,
    cmd_convert,
    cmd_info,
    formats_table,
    load_trace_from_args,
    positive_int,
)
from kvlab.core.semantics import TOUCH_ORDERS
from kvlab.policies import POLICIES
from kvlab.tiers.store import WRITE_POLICIES


def _capacity(text: str) -> int | None:
    if text.lower() in ("unbounded", "inf", "none"):
        return None
    try:
        value = int(text.replace("_", "").replace(",", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of blocks or 'unbounded', got {text!r}") from None
    if not 0 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"capacity must be in [0, 2**63) blocks, got {value}")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"warm-up fraction must be in [0, 1), got {value}")
    return value


def _scheduler_address(text: str) -> str:
    from kvlab.sim.executors import is_scheduler_address

    try:
        ok = is_scheduler_address(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    if not ok:
        raise argparse.ArgumentTypeError(f"expected a Dask scheduler address like tcp://HOST:PORT, got {text!r}")
    return text


def parse_capacities(text: str) -> list[int | None]:
    """``"1000:100000:20"`` → 20 log-spaced capacities from 1,000 to 100,000 (inclusive,
    rounded, duplicates dropped); ``"1000,5000,unbounded"`` → that list.

    Raises:
        argparse.ArgumentTypeError: a malformed spec.

    Example:
        >>> parse_capacities("10:1000:3"), parse_capacities("5,unbounded")
        ([10, 100, 1000], [5, None])
    """
    import numpy as np

    if text.count(":") == 2:
        try:
            low, high, count = (int(part.replace("_", "")) for part in text.split(":"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected START:STOP:COUNT integers, got {text!r}") from None
        if not 1 <= low <= high or count < 1:
            raise argparse.ArgumentTypeError(f"need 1 <= START <= STOP and COUNT >= 1, got {text!r}")
        grid = np.unique(np.rint(np.geomspace(low, high, count)).astype(np.int64))
        return [int(c) for c in grid]
    if ":" in text:
        raise argparse.ArgumentTypeError(f"expected START:STOP:COUNT (three integers) or a comma list, got {text!r}")
    return [_capacity(part) for part in text.split(",") if part.strip()] or [_capacity(text)]


def parse_tier(text: str) -> tuple[str, int | None, str | None]:
    """``"GPU=2000"`` → ``("GPU", 2000, "lru")``; ``"CPU=8000:s3fifo"``, ``"NVMe=unbounded:none"``
    (``none``: never evict).

    Raises:
        argparse.ArgumentTypeError: a malformed spec or capacity.

    Example:
        >>> parse_tier("CPU=8_000:fifo"), parse_tier("remote=unbounded")
        (('CPU', 8000, 'fifo'), ('remote', None, 'lru'))
    """
    name, sep, rest = text.partition("=")
    if not sep or not name.strip() or not rest:
        raise argparse.ArgumentTypeError(f"expected NAME=CAPACITY_BLOCKS[:POLICY], got {text!r}")
    capacity, colon, policy = rest.partition(":")
    if colon and not policy.strip():
        raise argparse.ArgumentTypeError(f"empty POLICY after ':' in {text!r} (a policy name, or 'none')")
    policy = policy.strip() or "lru"
    return name.strip(), _capacity(capacity.strip()), None if policy == "none" else policy


def _out_dir(text: str) -> Path:
    path = Path(text)
    if not text:
        raise argparse.ArgumentTypeError("the output folder path is empty")
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} exists and is not a folder")
    for parent in path.parents:
        if parent.exists() and not parent.is_dir():
            raise argparse.ArgumentTypeError(f"cannot create {text}: {parent} is a file, not a folder")
    return path


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``kvlab`` command."""
    parser = argparse.ArgumentParser(prog="kvlab", description="KV-cache lab: replay LLM-serving traces "
                                                                "through prefix caches.")
    parser.add_argument("--version", action="version", version=f"kvlab {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    add_info_and_convert_parsers(sub)
    rep = sub.add_parser("replay", help="replay a trace through a prefix cache")
    add_trace_arguments(rep)
    rep.add_argument("--policy", default=None, choices=sorted(POLICIES), help="eviction policy (default lru)")
    rep.add_argument("--capacity-blocks", type=_capacity, default=None, metavar="N",
                     help="cache capacity in blocks, or 'unbounded' (default)")
    rep.add_argument("--warmup-fraction", type=_fraction, default=0.0, metavar="F",
                     help="fraction of leading requests excluded from the statistics (default 0)")
    rep.add_argument("--touch-order", choices=TOUCH_ORDERS, default="head_most_recent",
                     help="which end of a request is most recently used afterwards (default head_most_recent)")
    rep.add_argument("--mode", choices=("prefix", "vllm", "omlx"), default=None,
                     help="prefix: every block a cache entry (default); vllm: vLLM v1's block pool one request at a "
                          "time (full blocks only, last-token rule); omlx: oMLX's paged cache (vLLM's pool plus "
                          "an elastic pool and a paged SSD store)")
    rep.add_argument("--free-order", choices=("classic", "current"), default=None,
                     help="vLLM free-queue order, with --mode vllm or omlx only (default current)")
    rep.add_argument("--ssd-capacity-blocks", type=_capacity, default=argparse.SUPPRESS, metavar="N",
                     help="--mode omlx: oMLX's paged-SSD-only mode with an SSD store of N blocks (or 'unbounded')")
    rep.add_argument("--window-requests", type=positive_int, default=None, metavar="N",
                     help="window of the rolling hit ratio in the timeline (default 1000)")
    rep.add_argument("--tier", type=parse_tier, action="append", metavar="NAME=CAPACITY_BLOCKS[:POLICY]",
                     help="a storage tier, fastest first (repeat: --tier GPU=2000 --tier CPU=8000:s3fifo); "
                          "POLICY 'none' never evicts; replaces --capacity-blocks/--policy")
    rep.add_argument("--write-policy", choices=WRITE_POLICIES, default=None,
                     help="with --tier: where computed blocks and victims go (default write_back)")
    rep.add_argument("--no-promote", action="store_true", help="with --tier: serve lower-tier hits in place")
    rep.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    rep.add_argument("--out", type=_out_dir, metavar="DIR",
                     help="write requests.parquet, timeline.parquet, summary.json and occupancy charts "
                          "(with --tier: requests.parquet, tier_counters.csv, summary.json)")

    swp = sub.add_parser("sweep", help="hit ratio of several policies over a grid of capacities")
    add_trace_arguments(swp)
    swp.add_argument("--policies", default="lru", metavar="P1,P2",
                     help="comma-separated policy names (default lru); known: " + ", ".join(sorted(POLICIES)))
    swp.add_argument("--capacities", type=parse_capacities, default=parse_capacities("1000:100000:8"),
                     metavar="SPEC", help="START:STOP:COUNT (log-spaced) or a comma list, 'unbounded' allowed "
                                          "(default 1000:100000:8)")
    swp.add_argument("--touch-order", choices=TOUCH_ORDERS, default="head_most_recent",
                     help="which end of a request is most recently used afterwards (default head_most_recent)")
    swp.add_argument("--warmup-fraction", type=_fraction, default=0.0, metavar="F",
                     help="fraction of leading requests excluded from the statistics (default 0)")
    swp.add_argument("--hit-semantics", choices=("prefix", "independent"), default="prefix",
                     help="prefix: a request hits its longest run of cached leading blocks (default); "
                          "independent: every block looked up on its own (an object cache, as libCacheSim)")
    swp.add_argument("--mode", choices=("prefix", "vllm"), default="prefix",
                     help="prefix: every block a cache entry (default); vllm: vLLM v1's block pool one request "
                          "at a time (full blocks only, last-token rule; requests larger than the pool are "
                          "rejected, column rejected_requests)")
    where = swp.add_mutually_exclusive_group()
    where.add_argument("--serial", action="store_true", help="run in this process (default: all CPUs)")
    where.add_argument("--scheduler", type=_scheduler_address, metavar="tcp://HOST:PORT",
                       help="run on the workers of this Dask scheduler, the trace sent to each once "
                            "(each worker needs this kvlab version; docs/sweeps.md)")
    swp.add_argument("--json", action="store_true", help="print the rows as one JSON array")
    swp.add_argument("--out", type=_out_dir, metavar="DIR",
                     help="write sweep.parquet, sweep.csv and hit_ratio_vs_capacity.png/.html")

    figs = sub.add_parser("figures", help="recompute the Mooncake paper figures on the bundled traces (PNG, SVG)")
    figs.add_argument("--out", type=_out_dir, default=Path("out/figures"), metavar="DIR",
                      help="default out/figures")

    demo = sub.add_parser("demo", help="replay the bundled Mooncake traces; print the table, write figures")
    demo.add_argument("--out", type=_out_dir, default=Path("out/demo"), metavar="DIR", help="default out/demo")

    from kvlab.cli.dashboard import add_dashboard_parser
    from kvlab.cli.events import add_events_parser
    from kvlab.cli.simulate import add_simulate_parser
    from kvlab.cli.warmup import add_warmup_parser

    add_simulate_parser(sub)
    add_events_parser(sub)
    add_dashboard_parser(sub)
    add_warmup_parser(sub)
    return parser


def summary_json(summary: object, indent: int | None = None) -> str:
    """The JSON of a run's summary, one shape for every mode: ``summary.to_dict()``
    (:meth:`kvlab.core.RunSummary.to_dict`: ``driver``, ``source``, ``config``, then the totals)."""
    from kvlab.core.result import to_jsonable

    return json.dumps(to_jsonable(summary), indent=indent)


def check_replay_options(args: argparse.Namespace) -> None:
    """Refuse ``kvlab replay`` options that would be ignored: tier options without ``--tier``,
    single-cache options with it, ``--free-order`` outside ``--mode vllm``/``omlx``.

    Raises:
        ValueError: naming the options.
    """
    if not args.tier and (args.write_policy is not None or args.no_promote):
        raise ValueError("--write-policy and --no-promote apply to tiers: add --tier NAME=CAPACITY_BLOCKS[:POLICY]")
    if args.tier:
        single = {"--capacity-blocks": args.capacity_blocks, "--policy": args.policy, "--mode": args.mode,
                  "--free-order": args.free_order, "--window-requests": args.window_requests}
        given = [name for name, value in single.items() if value is not None]
        if given:
            raise ValueError(f"--tier gives each tier its capacity and policy: drop {', '.join(given)} "
                             f"(options of the single-cache replay)")
    elif args.free_order is not None and args.mode in (None, "prefix"):
        raise ValueError("--free-order applies to vLLM's free queue: add --mode vllm (or --mode omlx)")


def cmd_replay_tiered(args: argparse.Namespace, trace: object) -> None:
    """``kvlab replay TRACE --tier ...``: tiered storage (:func:`kvlab.tiers.replay.replay_tiered`)."""
    from kvlab.tiers.replay import replay_tiered

    result = replay_tiered(trace, args.tier, write_policy=args.write_policy or "write_back",
                           promote=not args.no_promote,
                           touch_order=args.touch_order, warmup_fraction=args.warmup_fraction)
    if args.out is not None:
        result.requests.write_parquet(args.out / "requests.parquet")
        result.tier_counters.write_csv(args.out / "tier_counters.csv")
        (args.out / "summary.json").write_text(summary_json(result.summary, indent=2) + "\n")
        if not args.json:
            print(f"wrote {args.out}/ (requests.parquet, tier_counters.csv, summary.json)")
    if args.json:
        print(summary_json(result.summary))
        return
    s, c = result.summary, result.config
    print(f"tiered replay ({c.write_policy}, promote={c.promote}, {c.touch_order}): {s.requests:,} "
          f"requests, block hit ratio {s.block_hit_ratio:.4f}, token hit ratio {s.token_hit_ratio:.4f}")
    print(f"{'tier':<10}{'capacity':>12}{'policy':>10}{'hit blocks':>12}{'written':>10}{'evicted':>10}"
          f"{'demoted':>10}{'promoted':>10}")
    for row in result.tier_counters.iter_rows(named=True):
        cap = "unbounded" if row["capacity_blocks"] is None else f"{row['capacity_blocks']:,}"
        print(f"{row['tier']:<10}{cap:>12}{str(row['policy']):>10}{row['hit_blocks']:>12,}"
              f"{row['written_blocks']:>10,}{row['evicted_blocks']:>10,}{row['demoted_out_blocks']:>10,}"
              f"{row['promoted_in_blocks']:>10,}")


def cmd_replay(args: argparse.Namespace) -> None:
    """``kvlab replay TRACE ...``."""
    from kvlab.sim import ReplayConfig, replay

    check_replay_options(args)
    prepare_out(args.out)
    trace = load_trace_from_args(args)
    if args.tier:
        cmd_replay_tiered(args, trace)
        return
    config = ReplayConfig(policy=args.policy or "lru", capacity_blocks=args.capacity_blocks,
                          touch_order=args.touch_order, warmup_fraction=args.warmup_fraction,
                          window_requests=args.window_requests or 1000, mode=args.mode or "prefix",
                          free_order=args.free_order, ssd_only=hasattr(args, "ssd_capacity_blocks"),
                          ssd_capacity_blocks=getattr(args, "ssd_capacity_blocks", None))
    result = replay(trace, config, progress=sys.stderr.isatty() and trace.block_refs > 5_000_000)
    if args.out is not None:
        from kvlab.viz import occupancy_chart, save_chart

        result.requests.write_parquet(args.out / "requests.parquet")
        result.timeline.write_parquet(args.out / "timeline.parquet")
        (args.out / "summary.json").write_text(summary_json(result.summary, indent=2) + "\n")
        measured = result.requests.filter("measured")["arrival_s"] if config.warmup_fraction > 0 else None
        cap = "unbounded" if config.capacity_blocks is None else f"{config.capacity_blocks:,} blocks"
        title = (f"{Path(trace.source).name}: {config.policy}, {cap}, {config.touch_order}, "
                 f"warm-up {config.warmup_fraction:g}")
        chart = occupancy_chart(result, title=title,
                                warmup_end_s=measured[0] if measured is not None and len(measured) else None)
        save_chart(chart, args.out, "occupancy")
    if args.json:
        print(summary_json(result.summary))
    else:
        print(result.summary)
        if args.out is not None:
            print(f"wrote {args.out}/ (requests.parquet, timeline.parquet, summary.json, occupancy.png/.html)")


def cmd_sweep(args: argparse.Namespace) -> None:
    """``kvlab sweep TRACE ...``."""
    from kvlab.sim import sweep

    prepare_out(args.out)
    trace = load_trace_from_args(args)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    executor = args.scheduler or ("serial" if args.serial else None)
    try:
        frame = sweep(trace, args.capacities, policies, touch_order=args.touch_order,
                      warmup_fraction=args.warmup_fraction, mode=args.mode, hit_semantics=args.hit_semantics,
                      executor=executor, progress=sys.stderr.isatty())
    except OSError as err:  # the scheduler unreachable (a timeout is an OSError too)
        if args.scheduler is None:
            raise
        raise ValueError(f"--scheduler {args.scheduler}: {err}") from err
    if args.out is not None:
        from kvlab.viz import hit_ratio_curve, save_chart

        frame.write_parquet(args.out / "sweep.parquet")
        frame.write_csv(args.out / "sweep.csv")
        save_chart(hit_ratio_curve(frame, title=f"{Path(trace.source).name}: token hit ratio vs capacity"),
                   args.out, "hit_ratio_vs_capacity")
    if args.json:
        print(json.dumps(frame.to_dicts()))
        return
    print(format_sweep_table(frame))


def format_sweep_table(frame: object) -> str:
    """A sweep frame (:func:`kvlab.sim.sweep`) as the text table ``kvlab sweep`` prints: policy,
    capacity, block and token hit ratios, requests rejected (never admitted: misses), evictions."""
    lines = [f"{'policy':<16}{'capacity (blocks)':>18}{'block hit':>11}{'token hit':>11}{'rejected':>10}"
             f"{'evictions':>12}"]
    for row in frame.iter_rows(named=True):
        cap = "unbounded" if row["capacity_blocks"] is None else f"{row['capacity_blocks']:,}"
        lines.append(f"{row['policy']:<16}{cap:>18}{row['block_hit_ratio']:>11.4f}{row['token_hit_ratio']:>11.4f}"
                     f"{row['rejected_requests']:>10,}{row['evictions']:>12,}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``kvlab`` command; returns the exit status (0 done, 1 a ``--strict``
    events replay that did not index everything, 2 bad input, 141 stdout closed early)."""
    try:
        status = run_command(argv)
        sys.stdout.flush()  # here, not at exit: a closed pipe is then still ours to handle
    except BrokenPipeError:
        silence_stdout()
        return EXIT_BROKEN_PIPE
    return status


def run_command(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run its command; the exit status (errors in the input: 2)."""
    args = build_parser().parse_args(argv)
    status = 0
    try:
        if args.command == "info":
            cmd_info(args)
        elif args.command == "formats":
            print(formats_table())
        elif args.command == "convert":
            cmd_convert(args)
        elif args.command == "replay":
            cmd_replay(args)
        elif args.command == "sweep":
            cmd_sweep(args)
        elif args.command == "simulate":
            from kvlab.cli.simulate import run_simulate

            run_simulate(args)
        elif args.command == "figures":
            from kvlab.cli.figures import run_figures

            prepare_out(args.out)
            run_figures(args.out, progress=True)
        elif args.command == "events":
            from kvlab.cli.events import run_events

            status = run_events(args)
        elif args.command == "dashboard":
            from kvlab.cli.dashboard import run_dashboard

            status = run_dashboard(args)
        elif args.command == "warmup":
            from kvlab.cli.warmup import run_warmup

            status = run_warmup(args)
        else:
            from kvlab.cli.demo import run_demo

            prepare_out(args.out)
            run_demo(args.out, progress=True)
    except (ValueError, FileNotFoundError) as err:
        print(f"kvlab: error: {err}", file=sys.stderr)
        return 2
    return status

