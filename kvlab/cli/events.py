"""``kvlab events write`` and ``kvlab events replay``: event files in and out of an index.

``write --from-json DESC.json OUT.kvev`` makes an event file (format:
:mod:`kvlab.events.files`) from a JSON description of a stream
(:func:`kvlab.events.parse_event_description`). ``replay FILE`` applies a file's messages, in
arrival order, to an index through :class:`kvlab.index.ingest.EventIngestor` (llm-d's event
pool, index_blend.md L17-L19, with sequence numbers checked per publisher) and prints the
batches (messages) by outcome, the blocks (request keys) each pod holds per tier, the events
applied and skipped, the sequence gaps found, and every event that was not indexed as
published. Batches and events are counted apart: a batch is one message, holding any number
of events.

``replay --json`` prints one object::

    {"pods": {pod: {tier: blocks}},
     "gaps": [{"pod": ..., "data_parallel_rank": ..., "expected": ..., "got": ...}],
     "batches": {outcome: count},         # applied, gap, restart, duplicate, late
     "applied": {kind: count},            # BlockStored, tier_update, BlockRemoved, AllBlocksCleared
     "skipped": {reason: count},          # unknown_parent, partial_block, unresolved_tier_update, empty, error
     "unresolved_engine_keys": n,         # tier-update engine keys no request key maps (not indexed)
     "unmapped_engine_keys": n,           # stored engine keys past the last full canonical block
     "extra_keys_ignored": n,             # stores whose extra_keys were not hashed
     "errors": [{"message": i, "event": j or null, "error": "..."}]}

(the counters are :class:`kvlab.index.ingest.IngestStats`'). ``errors`` lists messages
that did not decode or whose topic is not ``kv@<pod>@<model>`` (``event`` null) and events
the index refused (the rest of their batch was applied; each is also a ``skipped`` "error").
The replay socket's end markers are skipped.

Exit status (:data:`EXIT_STATUS`): 0 replayed; 1 with ``--strict`` when anything may not
have been indexed as published (a sequence gap — the missing batches were lost —, a late
batch not applied, an error, a skipped event, an unresolved or unmapped engine key, ignored
extra_keys; duplicates, re-sent batches, do not count); 2 bad arguments or input —
a missing file, a file whose *structure* is broken (truncated, wrong magic: refused before
anything is applied), a Redis backend that cannot be reached.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from kvlab.cli.files import STDIN_NAME, input_path
from kvlab.cli.traces import positive_int
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

#: The exit statuses of ``kvlab events`` (the help's epilog).
EXIT_STATUS = ("exit status: 0 done (events not indexed are reported); 1 with --strict when a sequence gap was "
               "found or a late batch not applied, any event was refused or skipped, an engine key was not indexed "
               "or extra_keys were ignored; 2 bad arguments or input "
               "(a missing or broken file, an output path that is a folder or the input) or a Redis backend that "
               "cannot be reached")
_HOST_PORT = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):[0-9]{1,5}(/[0-9]+)?")


def parse_backend(text: str) -> str:
    """``"memory"``, or a Redis address normalised by :func:`kvlab.index.redis_index.redis_url`:
    ``HOST:PORT[/DB]``, or a ``redis://``, ``rediss://``, ``valkey://``, ``valkeys://`` or
    ``unix://`` URL (llm-d's forms, rule L13).

    Raises:
        argparse.ArgumentTypeError: anything else (e.g. a typo of ``memory``, a host without
            a port), or a URL without a host.

    Example:
        >>> parse_backend("memory"), parse_backend("127.0.0.1:6379"), parse_backend("valkey://cache:6380")
        ('memory', 'redis://127.0.0.1:6379', 'redis://cache:6380')
    """
    if text == "memory":
        return text
    from kvlab.index.redis_index import REDIS_URL_SCHEMES, redis_url

    if not text.lower().startswith(REDIS_URL_SCHEMES) and not _HOST_PORT.fullmatch(text):
        raise argparse.ArgumentTypeError(f"expected 'memory', HOST:PORT or a URL ({', '.join(REDIS_URL_SCHEMES)}), "
                                         f"got {text!r}")
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
    events = sub.add_parser("events", help="KV-event files: write one, replay one into a cluster index",
                            epilog=EXIT_STATUS)
    actions = events.add_subparsers(dest="events_command", required=True)
    write = actions.add_parser("write", help="make an event file from a JSON description of a stream",
                               epilog=EXIT_STATUS)
    write.add_argument("--from-json", required=True, metavar="DESC.json", type=Path,
                       help="a JSON list of messages: {pod, model, [seq], [ts], events: [...]}, or - for stdin; a "
                            'tier update is a BlockStored with "token_ids": [] (see README, '
                            "kvlab.events.parse_event_description)")
    write.add_argument("out", type=Path, metavar="OUT.kvev", help="the event file to write (not a folder, not "
                                                                  "DESC.json)")
    write.add_argument("--layout", choices=LAYOUTS, default="map",
                       help="event layout: map (vLLM 0.33, default) or array (legacy)")
    replay = actions.add_parser("replay", help="apply an event file to an index in arrival order; print blocks "
                                               "per pod and tier, sequence gaps and events not indexed",
                                epilog=EXIT_STATUS)
    replay.add_argument("file", type=Path, metavar="FILE", help="an event file (kvlab events write, "
                                                                "kvlab.events.write_event_file), or - for stdin")
    replay.add_argument("--backend", type=parse_backend, default="memory", metavar="memory|HOST:PORT|URL",
                        help="the index: in memory (default, starts empty) or a Redis server, HOST:PORT or a "
                             "redis://, rediss://, valkey://, valkeys:// or unix:// URL; what the namespace "
                             "already holds is counted too (see --flush)")
    replay.add_argument("--namespace", default=None, metavar="NS",
                        help="with a Redis backend: the prefix of the index's keys, e.g. 'replay:' (default '', "
                             "llm-d's)")
    replay.add_argument("--flush", action="store_true",
                        help="with a Redis backend and a non-empty --namespace: delete the namespace's index keys "
                             "before replaying, so a second replay does not merge with the first")
    replay.add_argument("--block-size", type=positive_int, default=16, metavar="TOKENS",
                        help="llm-d's canonical block size: tokens per request key (default 16)")
    replay.add_argument("--initial-seq", type=_seq, default=None, metavar="N",
                        help="the seq each publisher starts from (a higher first seq is a gap); default: its "
                             "first batch sets it")
    replay.add_argument("--strict", action="store_true",
                        help="exit 1 when a sequence gap was found or a late batch not applied, any event was "
                             "refused or skipped, an engine key was not indexed or extra_keys were ignored (the "
                             "report is printed all the same)")
    replay.add_argument("--json", action="store_true", help="print one JSON object")


def run_events(args: argparse.Namespace) -> int:
    """``kvlab events write|replay``: run the subcommand of ``args``; the exit status (0, or
    1 for a ``--strict`` replay that did not index everything, see :func:`not_indexed`).

    Raises:
        ValueError: bad input (the message names the file and what is wrong): an output
            path that is a folder or the input description, an unreadable or unwritable
            file, a broken event file; ``--namespace``/``--flush`` misused; an unreachable
            Redis server.
        FileNotFoundError: a missing input file.
    """
    if args.events_command == "write":
        with input_path(args.from_json, "--from-json", "cat desc.json | kvlab events write --from-json - "
                                                       "OUT.kvev") as description:
            write_description(description, args.out, layout=args.layout)
        return 0
    with input_path(args.file, "FILE", "cat stream.kvev | kvlab events replay -") as path:
        report = replay_event_file(path, backend=args.backend, block_size=args.block_size,
                                   initial_seq=args.initial_seq, namespace=args.namespace, flush=args.flush)
    print(json.dumps(report) if args.json else format_report(report, STDIN_NAME if path != args.file else path))
    missed = not_indexed(report)
    if args.strict and missed:
        print(f"kvlab: --strict: not everything was indexed: {', '.join(missed)}", file=sys.stderr)
        return 1
    return 0


def write_description(description: Path, out: Path, *, layout: str = "map") -> None:
    """``kvlab events write``: the JSON description's messages as the event file ``out``.

    Raises:
        FileNotFoundError: no description file.
        ValueError: ``out`` is a folder, is the description itself, or its folder does
            not exist; a file that cannot be read or written (the OS reason); a bad
            description (as :func:`kvlab.events.load_event_description`).
    """
    if not description.is_file():
        raise FileNotFoundError(f"no JSON description at {description}")
    if out.is_dir():
        raise ValueError(f"cannot write {out}: it is a folder (give a file path, e.g. {out / 'stream.kvev'})")
    if out.exists() and out.samefile(description):
        raise ValueError(f"cannot write {out}: it is the JSON description being read (give another OUT.kvev)")
    if not out.parent.is_dir():
        raise ValueError(f"cannot write {out}: {out.parent} is not an existing folder")
    try:
        messages = load_event_description(description)
    except (PermissionError, IsADirectoryError) as err:
        raise ValueError(f"cannot read {description}: {err.strerror}") from None
    try:
        count = write_event_file(out, messages, layout=layout)
    except PermissionError as err:
        raise ValueError(f"cannot write {out}: {err.strerror}") from None
    print(f"wrote {count} message{'s' if count != 1 else ''} to {out}")


def _index(backend: str, namespace: str | None, flush: bool) -> Index:
    if backend == "memory":
        given = [flag for flag, used in (("--namespace", namespace is not None), ("--flush", flush)) if used]
        if given:
            raise ValueError(f"{' and '.join(given)} apply to a Redis backend; the memory backend starts empty")
        from kvlab.index.memory import InMemoryIndex

        return InMemoryIndex()
    if flush and not namespace:
        raise ValueError("--flush needs a non-empty --namespace (e.g. --namespace replay:): it would delete the "
                         "index keys of namespace '' (llm-d's, maybe shared)")
    from kvlab.index.redis_index import RedisIndex

    try:
        index = RedisIndex(backend, namespace=namespace or "")
    except ConnectionError as err:
        raise ValueError(str(err)) from None
    if flush:
        index.flush()
    return index


def replay_event_file(path: str | Path, *, backend: str = "memory", block_size: int = 16,
                      initial_seq: int | None = None, namespace: str | None = None, flush: bool = False) -> dict:
    """Apply an event file to an index in arrival order; the ``--json`` report.

    The in-memory index starts empty; a Redis server's index may already hold entries,
    and ``pods`` counts them too, unless ``flush`` empties the namespace first.

    Args:
        path: the event file.
        backend: ``"memory"`` (:class:`~kvlab.index.memory.InMemoryIndex`) or a Redis URL
            (:class:`~kvlab.index.redis_index.RedisIndex`).
        block_size: llm-d's canonical block size.
        initial_seq: passed to :class:`~kvlab.index.ingest.EventIngestor`.
        namespace: the Redis index's key prefix (``None``: ``""``, llm-d's); Redis only.
        flush: delete the namespace's index keys (:meth:`RedisIndex.flush`) after the
            file is read and before it is applied; Redis only, with a non-empty namespace.

    Returns:
        The report of the module docstring: ``pods``, ``gaps``, ``batches``, ``applied``,
        ``skipped``, ``unresolved_engine_keys``, ``unmapped_engine_keys``,
        ``extra_keys_ignored``, ``errors``.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the path is a folder or unreadable, the file's structure is broken
            (nothing is applied then), ``namespace`` or ``flush`` with the memory
            backend, ``flush`` without a namespace, a bad namespace, or the Redis server
            cannot be reached.
    """
    from kvlab.index.ingest import EventIngestor

    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a folder, not an event file")
    if not path.is_file():
        raise FileNotFoundError(f"no event file at {path}")
    try:
        messages = list(read_event_file(path))  # the whole file is checked before the index is touched
    except PermissionError as err:
        raise ValueError(f"cannot read {path}: {err.strerror}") from None
    index = _index(backend, namespace, flush)
    try:
        ingestor = EventIngestor(index, block_size=block_size, initial_seq=initial_seq)
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
                "batches": dict(sorted(stats.batches.items())), "applied": dict(sorted(stats.applied.items())),
                "skipped": dict(sorted(stats.skipped.items())),
                "unresolved_engine_keys": stats.unresolved_engine_keys,
                "unmapped_engine_keys": stats.unmapped_engine_keys, "extra_keys_ignored": stats.extra_keys_ignored,
                "errors": errors}
    finally:
        if hasattr(index, "close"):
            index.close()


def _plural(count: int, noun: str, plural: str | None = None) -> str:
    return f"{count:,} {noun if count == 1 else plural or noun + 's'}"


def not_indexed(report: dict) -> list[str]:
    """What a replay report says may not have been indexed as published, as phrases (empty:
    all was): sequence gaps (the batches in them never arrived), late batches (not applied),
    errors, skipped events other than refused ones (those are the event errors), unresolved
    and unmapped engine keys, stores with ignored extra_keys. ``--strict`` exits 1 when it
    is not empty.

    Example:
        >>> not_indexed({"gaps": [{"pod": "p", "data_parallel_rank": 0, "expected": 2, "got": 5}],
        ...              "batches": {"applied": 2, "gap": 1}, "errors": [], "skipped": {"partial_block": 2},
        ...              "unresolved_engine_keys": 1, "unmapped_engine_keys": 0, "extra_keys_ignored": 0})
        ['1 sequence gap', '2 events skipped (2 partial_block)', '1 unresolved engine key']
    """
    missed = []
    if report["gaps"]:
        missed.append(_plural(len(report["gaps"]), "sequence gap"))
    if report["batches"].get("late"):
        missed.append(f"{_plural(report['batches']['late'], 'late batch', 'late batches')} not applied")
    if report["errors"]:
        missed.append(_plural(len(report["errors"]), "error"))
    skipped = {reason: count for reason, count in report["skipped"].items() if reason != "error"}
    if skipped:
        reasons = ", ".join(f"{count:,} {reason}" for reason, count in skipped.items())
        missed.append(f"{_plural(sum(skipped.values()), 'event')} skipped ({reasons})")
    for key, one, many in (("unresolved_engine_keys", "unresolved engine key", "unresolved engine keys"),
                           ("unmapped_engine_keys", "unmapped engine key", "unmapped engine keys"),
                           ("extra_keys_ignored", "store with extra_keys ignored", "stores with extra_keys ignored")):
        if report[key]:
            missed.append(f"{report[key]:,} {one if report[key] == 1 else many}")
    return missed


#: How the text report names each batch outcome (:data:`kvlab.index.ingest.BATCH_OUTCOMES`).
BATCH_OUTCOME_TEXT = {"applied": "applied", "gap": "applied after a sequence gap",
                      "restart": "applied after a publisher restart (pod cleared)",
                      "duplicate": "duplicate not applied", "late": "late not applied"}


def format_report(report: dict, path: str | Path) -> str:
    """The replay report as text: the batches (messages) by outcome, a pod × tier table of
    blocks (or "no blocks indexed"), the events applied and skipped, engine keys not
    indexed, then the gaps and errors. Batches and events are counted apart."""
    batches = report["batches"]
    outcomes = ", ".join(f"{count:,} {BATCH_OUTCOME_TEXT.get(outcome, outcome)}" for outcome, count in
                         sorted(batches.items(), key=lambda item: list(BATCH_OUTCOME_TEXT).index(item[0])
                                if item[0] in BATCH_OUTCOME_TEXT else len(BATCH_OUTCOME_TEXT)))
    lines = [f"{path}: {_plural(sum(batches.values()), 'batch', 'batches')}" + (f": {outcomes}" if outcomes else "")]
    if report["pods"]:
        tiers = sorted({tier for counts in report["pods"].values() for tier in counts})
        width = max([len("pod"), *map(len, report["pods"])])
        lines.append(f"{'pod':<{width}}" + "".join(f"{tier:>10}" for tier in tiers))
        for pod, counts in report["pods"].items():
            lines.append(f"{pod:<{width}}" + "".join(f"{counts.get(tier, 0):>10,}" for tier in tiers))
    else:
        lines.append("no blocks indexed")
    for what in ("applied", "skipped"):
        counts = ", ".join(f"{count:,} {kind}" for kind, count in report[what].items())
        total = sum(report[what].values())
        lines.append(f"events {what}: {total:,} ({counts})" if counts else f"events {what}: none")
    keys = [f"{report[key]:,} {what}" for key, what in (("unresolved_engine_keys", "unresolved (tier updates)"),
                                                        ("unmapped_engine_keys", "unmapped (past the last full "
                                                                                 "canonical block)"))
            if report[key]]
    if keys:
        lines.append(f"engine keys not indexed: {', '.join(keys)}")
    if report["extra_keys_ignored"]:
        lines.append(f"extra_keys ignored (not hashed) in {_plural(report['extra_keys_ignored'], 'store')}")
    lines.append(_plural(len(report["gaps"]), "sequence gap"))
    for gap in report["gaps"]:
        rank = "" if gap["data_parallel_rank"] is None else f" (DP rank {gap['data_parallel_rank']})"
        lines.append(f"  {gap['pod']}: expected seq {gap['expected']}, got {gap['got']}{rank}")
    if report["errors"]:
        lines.append(_plural(len(report["errors"]), "error"))
        for error in report["errors"]:
            event = "" if error["event"] is None else f" event {error['event']}"
            lines.append(f"  message {error['message']}{event}: {error['error']}")
    return "\n".join(lines)
