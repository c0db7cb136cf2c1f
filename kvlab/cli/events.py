"""``kvlab events write`` and ``kvlab events replay``: event files in and out of an index.

``write --from-json DESC.json OUT.kvev`` makes an event file (format:
:mod:`kvlab.events.files`) from a JSON description of a stream
(:func:`kvlab.events.parse_event_description`). ``replay FILE`` applies a file's messages, in
arrival order, to an index through :class:`kvlab.index.ingest.EventIngestor` (llm-d's event
pool, index_blend.md L17-L19, with sequence numbers checked per publisher) and prints the
blocks (request keys) each pod holds per tier and the sequence gaps found.

``replay --json`` prints one object::

    {"pods": {pod: {tier: blocks}},
     "gaps": [{"pod": ..., "data_parallel_rank": ..., "expected": ..., "got": ...}],
     "batches": {outcome: count},         # applied, gap, restart, duplicate, late
     "errors": [{"message": i, "event": j or null, "error": "..."}]}

``errors`` lists messages that did not decode or whose topic is not ``kv@<pod>@<model>``
(``event`` null) and events the index refused (the rest of their batch was applied). The
replay socket's end markers are skipped. A file whose *structure* is broken (truncated,
wrong magic) is refused before anything is applied: exit status 2.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from kvlab.cli import _positive_int
from kvlab.events import (
    LAYOUTS,
    EventDecodeError,
    decode_frames,
    is_end_of_replay,
    load_event_description,
    read_event_file,
    write_event_file,
)

if TYPE_CHECKING:
    from kvlab.index.base import Index

#: ``--backend`` URL schemes handed to :class:`kvlab.index.redis_index.RedisIndex`.
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def parse_backend(text: str) -> str:
    """``"memory"``, or a Redis URL normalised by :func:`kvlab.index.redis_index.redis_url`.

    Raises:
        argparse.ArgumentTypeError: anything else, or a URL without a host.

    Example:
        >>> parse_backend("memory"), parse_backend("redis://127.0.0.1:6379")
        ('memory', 'redis://127.0.0.1:6379')
    """
    if text == "memory":
        return text
    if not text.startswith(REDIS_SCHEMES):
        raise argparse.ArgumentTypeError(f"expected 'memory' or redis://HOST:PORT, got {text!r}")
    from kvlab.index.redis_index import redis_url

    try:
        return redis_url(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _seq(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer in [0, 2**64), got {text!r}") from None
    if not 0 <= value < 2**64:
        raise argparse.ArgumentTypeError(f"expected an integer in [0, 2**64), got {value}")
    return value


def add_events_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``kvlab events write|replay`` on the ``kvlab`` subcommand set ``sub``."""
    events = sub.add_parser("events", help="KV-event files: write one, replay one into a cluster index")
    actions = events.add_subparsers(dest="events_command", required=True)
    write = actions.add_parser("write", help="make an event file from a JSON description of a stream")
    write.add_argument("--from-json", required=True, metavar="DESC.json", type=Path,
                       help="a JSON list of messages: {pod, model, [seq], [ts], events: [...]} "
                            "(see kvlab.events.parse_event_description)")
    write.add_argument("out", type=Path, metavar="OUT.kvev", help="the event file to write")
    write.add_argument("--layout", choices=LAYOUTS, default="map",
                       help="event layout: map (vLLM 0.33, default) or array (legacy)")
    replay = actions.add_parser("replay", help="apply an event file to an index in arrival order; print blocks "
                                               "per pod and tier, and sequence gaps")
    replay.add_argument("file", type=Path, metavar="FILE", help="an event file (kvlab events write, "
                                                                "kvlab.events.write_event_file)")
    replay.add_argument("--backend", type=parse_backend, default="memory", metavar="memory|redis://HOST:PORT",
                        help="the index: in memory (default) or a Redis server (namespace '', what it already "
                             "holds is counted too)")
    replay.add_argument("--block-size", type=_positive_int, default=16, metavar="TOKENS",
                        help="llm-d's canonical block size: tokens per request key (default 16)")
    replay.add_argument("--initial-seq", type=_seq, default=None, metavar="N",
                        help="the seq each publisher starts from (a higher first seq is a gap); default: its "
                             "first batch sets it")
    replay.add_argument("--json", action="store_true", help="print one JSON object")


def run_events(args: argparse.Namespace) -> None:
    """``kvlab events write|replay``: run the subcommand of ``args``.

    Raises:
        ValueError: bad input (the message names the file and what is wrong); an
            unreachable Redis server.
        FileNotFoundError: a missing input file.
    """
    if args.events_command == "write":
        if not args.from_json.is_file():
            raise FileNotFoundError(f"no JSON description at {args.from_json}")
        if not args.out.parent.is_dir():
            raise ValueError(f"cannot write {args.out}: {args.out.parent} is not an existing folder")
        count = write_event_file(args.out, load_event_description(args.from_json), layout=args.layout)
        print(f"wrote {count} message{'s' if count != 1 else ''} to {args.out}")
        return
    report = replay_event_file(args.file, backend=args.backend, block_size_tokens=args.block_size,
                               initial_seq=args.initial_seq)
    print(json.dumps(report) if args.json else format_report(report, args.file))


def _index(backend: str) -> Index:
    if backend == "memory":
        from kvlab.index.memory import InMemoryIndex

        return InMemoryIndex()
    from kvlab.index.redis_index import RedisIndex

    try:
        return RedisIndex(backend)
    except ConnectionError as err:
        raise ValueError(str(err)) from None


def replay_event_file(path: str | Path, *, backend: str = "memory", block_size_tokens: int = 16,
                      initial_seq: int | None = None) -> dict:
    """Apply an event file to an index in arrival order; the ``--json`` report.

    The in-memory index starts empty; a Redis server's index may already hold entries,
    and ``pods`` counts them too.

    Args:
        path: the event file.
        backend: ``"memory"`` (:class:`~kvlab.index.memory.InMemoryIndex`) or a Redis URL
            (:class:`~kvlab.index.redis_index.RedisIndex`, namespace ``""``).
        block_size_tokens: llm-d's canonical block size.
        initial_seq: passed to :class:`~kvlab.index.ingest.EventIngestor`.

    Returns:
        ``{"pods", "gaps", "batches", "errors"}`` as in the module docstring.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file's structure is broken (nothing is applied then), or the
            Redis server cannot be reached.
    """
    from kvlab.index.ingest import EventIngestor

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no event file at {path}")
    messages = list(read_event_file(path))  # the whole file is checked before the index is touched
    index = _index(backend)
    try:
        ingestor = EventIngestor(index, block_size_tokens=block_size_tokens, initial_seq=initial_seq)
        errors: list[dict] = []
        for i, frames in enumerate(messages):
            if is_end_of_replay(frames):
                continue
            before = len(ingestor.stats.errors)
            try:
                ingestor.ingest(decode_frames(frames))
            except EventDecodeError as err:
                errors.append({"message": i, "event": err.event, "error": err.reason})
            except ValueError as err:  # a topic not of the form kv@<pod>@<model>
                errors.append({"message": i, "event": None, "error": str(err)})
            errors += [{"message": i, "event": e.event_index, "error": e.message}
                       for e in ingestor.stats.errors[before:]]
        stats = ingestor.stats
        return {"pods": index.pod_tier_counts(),
                "gaps": [{"pod": g.pod, "data_parallel_rank": g.data_parallel_rank, "expected": g.expected_seq,
                          "got": g.got_seq} for g in stats.gaps],
                "batches": dict(sorted(stats.batches.items())), "errors": errors}
    finally:
        if hasattr(index, "close"):
            index.close()


def format_report(report: dict, path: str | Path) -> str:
    """The replay report as text: a pod × tier table of blocks, then the gaps and errors."""
    batches = ", ".join(f"{count} {outcome}" for outcome, count in report["batches"].items()) or "no batches"
    lines = [f"{path}: {batches}"]
    tiers = sorted({tier for counts in report["pods"].values() for tier in counts})
    width = max([len("pod"), *map(len, report["pods"])])
    lines.append(f"{'pod':<{width}}" + "".join(f"{tier:>10}" for tier in tiers))
    for pod, counts in report["pods"].items():
        lines.append(f"{pod:<{width}}" + "".join(f"{counts.get(tier, 0):>10,}" for tier in tiers))
    lines.append(f"{len(report['gaps'])} sequence gap{'s' if len(report['gaps']) != 1 else ''}")
    for gap in report["gaps"]:
        rank = "" if gap["data_parallel_rank"] is None else f" (DP rank {gap['data_parallel_rank']})"
        lines.append(f"  {gap['pod']}: expected seq {gap['expected']}, got {gap['got']}{rank}")
    if report["errors"]:
        lines.append(f"{len(report['errors'])} error{'s' if len(report['errors']) != 1 else ''}")
        for error in report["errors"]:
            event = "" if error["event"] is None else f" event {error['event']}"
            lines.append(f"  message {error['message']}{event}: {error['error']}")
    return "\n".join(lines)
