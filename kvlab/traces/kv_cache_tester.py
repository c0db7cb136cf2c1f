"""Reader for kv-cache-tester traces (callanjfox/kv-cache-tester ``traces/``: WEKA's Claude Code
sessions), one JSON document per conversation::

    {"id": "trace_0001", "block_size": 64, "hash_id_scope": "local", "requests": [
        {"t": 0.0, "type": "n", "model": "claude-opus-4-5-20251101", "in": 71175, "out": 169,
         "hash_ids": [1, 2, ...], ...},
        {"t": 2326.6, "type": "subagent", "agent_id": "agent_001", "requests": [{"t": 0.0, ...}]}]}

``t`` is seconds from the conversation's start (a sub-agent's requests: from its entry's ``t``),
``type`` ``"n"`` (non-streaming) or ``"s"`` (streaming), ``in`` / ``out`` token counts,
``hash_ids`` one prefix-chained id per *full* ``block_size``-token block of the prompt
(``floor(in / block_size)`` ids), numbered per conversation when ``hash_id_scope`` is
``"local"`` (sub-agents share their parent's numbering) and across files when ``"global"``.
docs/trace_formats/kv_cache_tester.md has the details and the hit ratios of the sample.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from kvlab.core.validate import U64_MAX, check_int, check_real
from kvlab.traces.arrays import _list_column
from kvlab.traces.chain import check_chained_keys
from kvlab.traces.errors import TraceFormatError
from kvlab.traces.flat import flatten_csr, intern_first_seen
from kvlab.traces.jsonpos import PathPart, elements, line_of, members, offset_of
from kvlab.traces.sniff import NOT_JSON, Peek, TraceFormat, provenance, stamp
from kvlab.traces.textfile import check_trace_path, read_text
from kvlab.traces.trace import Trace, trusted_trace

SCOPES = ("local", "global")
REQUEST_FIELDS = ("t", "type", "in", "out", "hash_ids")
_SUFFIXES = (".json", ".json.gz")
#: Local ids at or above this are re-numbered densely before the conversation's offset is added.
_DENSE_LIMIT = 2**40


def load_kv_cache_tester(path: str | Path) -> Trace:
    """Load a kv-cache-tester conversation file, or a folder of them, as one trace.

    A folder's ``*.json`` / ``*.json.gz`` files are read in name order (other files are
    ignored). Every conversation starts at its own ``t = 0`` and all are merged on one clock
    (the files hold no wall-clock start); a sub-agent's requests arrive at the sub-agent entry's
    ``t`` plus their own. Rows are sorted stably by arrival (ties keep file, then document
    order). ``hash_id_scope`` ``"local"`` (assumed when absent): each conversation's ids get an
    offset, ``block_keys = hash_id + key_offset`` (the offsets, in the provenance's
    ``conversations``, are the running sum of earlier conversations' largest id + 1, so keys are
    dense when the ids are, and a file's id is ``key - key_offset``); ``"global"``: the ids as
    they are. Only full blocks have keys (``partial_block_keyed=False``).

    Columns beyond the required ones: ``session_id`` (str, the conversation's ``id``, else the
    file name without suffix), ``agent_id`` (str, null for the parent's own requests, the
    sub-agent's ``agent_id`` for its requests), ``type`` (str, ``"n"`` / ``"s"``), ``model``
    (str, null when absent). ``request_id = conversation ordinal × 2**32 + the request's place
    among the file's requests in document order`` (sub-agent requests counted where they appear),
    so it names the same request however the rows are sorted.

    Args:
        path: a conversation file (``.json``, gzip read by name or magic bytes, a UTF-8
            byte-order mark skipped; one line or pretty-printed) or a folder of them.

    Returns:
        A :class:`~kvlab.traces.Trace` (``block_size`` from the files, ``source = str(path)``,
        provenance ``format = "kv-cache-tester"`` with notes on the clock and the ids).

    Raises:
        TraceFormatError: naming the file, the line and the field (``requests[17].in``, or
            ``requests[64].requests[2].hash_ids`` inside a sub-agent) for malformed JSON, a
            document or request that is not an object, a missing field, a value of the wrong
            type, a negative or out-of-range length or time, a hash id that is not an integer
            in ``[0, 2**64)``, ``len(hash_ids) != floor(in / block_size)``, a missing or
            non-positive ``block_size`` or one differing from an earlier file's, an unknown
            ``hash_id_scope``, ids that are not prefix-chained, an empty file, a folder
            without conversation files or a load without requests.
        FileNotFoundError: ``path`` is neither a file nor a folder.

    Example:
        >>> import json, tempfile, pathlib
        >>> folder = pathlib.Path(tempfile.mkdtemp())
        >>> doc = {"id": "c", "block_size": 4, "hash_id_scope": "local", "requests": [
        ...     {"t": 0.0, "type": "n", "in": 9, "out": 2, "hash_ids": [1, 2]},
        ...     {"t": 5.0, "type": "subagent", "agent_id": "a1", "requests": [
        ...         {"t": 1.0, "type": "s", "in": 4, "out": 1, "hash_ids": [1]}]}]}
        >>> for name in ("c1.json", "c2.json"):
        ...     _ = (folder / name).write_text(json.dumps(doc))
        >>> trace = load_kv_cache_tester(folder)
        >>> trace.frame.select("arrival_s", "session_id", "agent_id", "block_keys").rows()
        [(0.0, 'c', None, [1, 2]), (0.0, 'c', None, [4, 5]), (6.0, 'c', 'a1', [1]), (6.0, 'c', 'a1', [4])]
    """
    path = Path(path)
    if path.is_dir():
        files = [path / name for name in sorted(p.name for p in path.iterdir() if p.is_file())
                 if name.lower().endswith(_SUFFIXES)]
        if not files:
            raise TraceFormatError(path, None, "no kv-cache-tester conversation files (*.json, *.json.gz) in the "
                                               "folder")
    else:
        check_trace_path(path)
        files = [path]
    conversations: list[_Conversation] = []
    for ordinal, file in enumerate(files):
        conversations.append(_read_conversation(file, ordinal, conversations[0] if conversations else None))
    if not any(c.arrival for c in conversations):
        raise TraceFormatError(path, None, "no requests in " + ("the folder's files" if path.is_dir() else "the file"))
    return _merge(path, conversations)


def _sniff(peek: Peek) -> str | None:
    """A JSON object with ``block_size`` and ``requests`` (one line or pretty-printed), or a
    folder whose first ``.json`` file is one."""
    if peek.entries:
        names = [n for n in peek.entries if n.lower().endswith(_SUFFIXES)]
        if not names:
            return "a folder without .json or .json.gz files"
        reason = _sniff_file(Peek.of(peek.path / names[0]))
        return None if reason is None else f"{names[0]}: {reason}"
    return _sniff_file(peek)


def _sniff_file(peek: Peek) -> str | None:
    record = peek.record
    if record is NOT_JSON and (peek.first_line or "").lstrip().startswith("{"):
        record = peek.document  # a pretty-printed document
    if record is NOT_JSON and peek.error is not None:
        return f"{peek.where()}: {peek.error}" if peek.lineno is not None else peek.error
    if not isinstance(record, dict):
        what = "not JSON" if record is NOT_JSON else f"a JSON {type(record).__name__}"
        return f"{peek.where()}: {what}, not a JSON object"
    for name in ("block_size", "requests"):
        if name not in record:
            return f"{peek.where(name)}: missing"
    return None


KV_CACHE_TESTER_FORMAT = TraceFormat(
    "kv-cache-tester", "kv-cache-tester / WEKA Claude Code: one JSON document per conversation (block_size, "
    "hash_id_scope, requests with t, in, out, hash_ids, sub-agents); a file or a folder of them",
    _sniff, load_kv_cache_tester)


@dataclass(eq=False)
class _Conversation:
    """One file's requests in document order (sub-agent requests where their entry is)."""

    path: Path
    text: str
    ordinal: int
    block_size: int = 0
    scope: str = "local"
    scope_given: bool = True
    session: str = ""
    names: list[str] = field(default_factory=list)
    paths: list[tuple[PathPart, ...]] = field(default_factory=list)
    arrival: list[float] = field(default_factory=list)
    tokens_in: list[int] = field(default_factory=list)
    tokens_out: list[int] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    models: list[str | None] = field(default_factory=list)
    agents: list[str | None] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    ids: list = field(default_factory=list)
    #: ``uint64[num_refs]`` once read (the Python list and the text are then dropped).
    id_array: np.ndarray | None = None

    def line_of(self, where: Sequence[PathPart]) -> int:
        return line_of(self.text, where)

    def fail(self, where: Sequence[PathPart], reason: str) -> TraceFormatError:
        return TraceFormatError(self.path, self.line_of(where), reason)

    def check(self, where: tuple[PathPart, ...], check: object, value: object, **bounds: object) -> object:
        try:
            return check(f"field {_name(where)!r}", value, **bounds)
        except ValueError as err:
            raise self.fail(where, str(err)) from None

    def request_lines(self, doc: dict) -> np.ndarray:
        """The 1-based line of each request (all 1 for a one-line document): one walk over the
        text beside the parsed ``doc``."""
        if "\n" not in self.text.rstrip():
            return np.ones(len(self.arrival), dtype=np.int64)
        starts: list[int] = []

        def walk(pos: int, requests: list) -> None:
            for (start, _), request in zip(elements(self.text, pos), requests, strict=True):
                if request.get("type") != "subagent":
                    starts.append(start)
                    continue
                inner = [s for key, s, _ in members(self.text, start) if key == "requests"]
                walk(inner[-1], request["requests"])

        walk(offset_of(self.text, ["requests"]), doc["requests"])
        lines, line, at = [], 1, 0
        for start in starts:
            line += self.text.count("\n", at, start)
            at = start
            lines.append(line)
        return np.array(lines, dtype=np.int64)


def _name(where: Sequence[PathPart]) -> str:
    """``("requests", 3, "in")`` → ``requests[3].in``."""
    return "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else p) for i, p in enumerate(where))


def _read_conversation(path: Path, ordinal: int, first: _Conversation | None) -> _Conversation:
    """Read, check (the ids' chaining too) and convert one file; ``first``: the load's first
    conversation, whose block size every file must have."""
    text = read_text(path)
    conv = _Conversation(path, text, ordinal)
    if not text.strip():
        raise TraceFormatError(path, None, "no records (empty file)")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise TraceFormatError(path, err.lineno, f"malformed JSON: {err.msg} at column {err.colno}") from None
    if not isinstance(doc, dict):
        raise conv.fail([], f"expected a JSON object (a kv-cache-tester conversation), got {type(doc).__name__}")
    for name in ("block_size", "requests"):
        if name not in doc:
            raise conv.fail([], f"missing field {name!r}")
    conv.block_size = conv.check(("block_size",), check_int, doc["block_size"], low=1)
    if first is not None and conv.block_size != first.block_size:
        raise conv.fail(["block_size"], f"field 'block_size' is {conv.block_size} but {first.path.name} has "
                                        f"{first.block_size}: one trace has one block size")
    conv.scope_given = "hash_id_scope" in doc
    scope = doc.get("hash_id_scope", "local")
    if scope not in SCOPES:
        raise conv.fail(["hash_id_scope"], f"field 'hash_id_scope' is {scope!r}, an unknown scope (known: "
                                           f"{', '.join(SCOPES)})")
    conv.scope = scope
    session = doc.get("id", path.name.removesuffix(".gz").removesuffix(".json").removesuffix(".JSON"))
    if not isinstance(session, str):
        raise conv.fail(["id"], f"field 'id' must be a string, got {session!r}")
    conv.session = session
    _walk(conv, doc["requests"], ("requests",), 0.0, None)
    offsets = np.zeros(len(conv.lengths) + 1, dtype=np.int64)
    np.cumsum(conv.lengths, out=offsets[1:])
    conv.id_array = _id_array(conv, offsets)
    flat = flatten_csr(offsets, conv.id_array, pl.Series(conv.tokens_in, dtype=pl.UInt32), conv.block_size)
    try:
        check_chained_keys(flat, path, field="hash_ids", noun="id", names=conv.names)
    except TraceFormatError:  # again, naming the lines (a walk over a pretty-printed text: only now)
        check_chained_keys(flat, path, field="hash_ids", noun="id", lines=conv.request_lines(doc), names=conv.names)
        raise
    conv.text, conv.ids, conv.paths = "", [], []  # what errors needed: not kept for the whole load
    return conv


def _walk(conv: _Conversation, requests: object, where: tuple[PathPart, ...], start: float,
          agent: str | None) -> None:
    """Append the requests of ``requests`` (the list at ``where``), arriving ``start`` seconds after
    the conversation's start, sub-agent entries descended into."""
    if not isinstance(requests, list):
        raise conv.fail(where, f"field {_name(where)!r} must be a list of requests, got {type(requests).__name__}")
    block_size = conv.block_size
    for i, request in enumerate(requests):
        at = (*where, i)
        if not isinstance(request, dict):
            raise conv.fail(at, f"{_name(at)}: expected a JSON object, got {type(request).__name__}")
        for name in ("t", "type"):
            if name not in request:
                raise conv.fail(at, f"missing field {_name((*at, name))!r}")
        t = start + conv.check((*at, "t"), check_real, request["t"], low=0.0)
        kind = request["type"]
        if not isinstance(kind, str):
            raise conv.fail((*at, "type"), f"field {_name((*at, 'type'))!r} must be a string, got {kind!r}")
        if kind == "subagent":
            if "requests" not in request:
                raise conv.fail(at, f"missing field {_name((*at, 'requests'))!r}")
            sub_agent = request.get("agent_id", f"{_name(at)}")
            if not isinstance(sub_agent, str):
                raise conv.fail((*at, "agent_id"), f"field {_name((*at, 'agent_id'))!r} must be a string, "
                                                   f"got {sub_agent!r}")
            _walk(conv, request["requests"], (*at, "requests"), t, sub_agent)
            continue
        for name in REQUEST_FIELDS[2:]:
            if name not in request:
                raise conv.fail(at, f"missing field {_name((*at, name))!r}")
        n_in, n_out = (conv.check((*at, name), check_int, request[name], low=0, high=2**32 - 1)
                       for name in ("in", "out"))
        model = request.get("model")
        if model is not None and not isinstance(model, str):
            raise conv.fail((*at, "model"), f"field {_name((*at, 'model'))!r} must be a string, got {model!r}")
        ids = request["hash_ids"]
        if not isinstance(ids, list):
            raise conv.fail((*at, "hash_ids"), f"field {_name((*at, 'hash_ids'))!r} must be a list, "
                                               f"got {type(ids).__name__}")
        if len(ids) != n_in // block_size:
            raise conv.fail((*at, "hash_ids"), f"{_name(at)}: {len(ids)} hash_ids but in={n_in} needs "
                                               f"floor({n_in}/{block_size})={n_in // block_size} (full blocks only)")
        conv.names.append(_name(at))
        conv.paths.append(at)
        conv.arrival.append(t)
        conv.tokens_in.append(n_in)
        conv.tokens_out.append(n_out)
        conv.kinds.append(kind)
        conv.models.append(model)
        conv.agents.append(agent)
        conv.lengths.append(len(ids))
        conv.ids.extend(ids)


def _id_array(conv: _Conversation, offsets: np.ndarray) -> np.ndarray:
    """The conversation's hash ids as ``uint64``: one conversion, no per-id Python unless an id
    may be bad (not all integers, a negative, or a JSON ``true`` / ``false`` in the file, which
    numpy would read as 1 / 0): then every id is checked and the first bad one named."""
    ids = np.array(conv.ids) if conv.ids else np.zeros(0, dtype=np.uint64)
    integers = ids.dtype.kind == "u" or (ids.dtype.kind == "i" and (ids.size == 0 or ids.min() >= 0))
    if integers and "true" not in conv.text and "false" not in conv.text:  # numpy reads true as 1: no JSON bools
        return ids.astype(np.uint64, copy=False)
    for r in range(len(conv.lengths)):  # name the first bad id (per id: only when one may be bad)
        for k, value in enumerate(conv.ids[offsets[r]:offsets[r + 1]]):
            conv.check((*conv.paths[r], "hash_ids", k), check_int, value, low=0, high=U64_MAX)
    return ids.astype(np.uint64, copy=False)


def _merge(path: Path, conversations: list[_Conversation]) -> Trace:
    """Offset each conversation's ids, check their chaining, and sort all requests by arrival."""
    block_size = conversations[0].block_size
    base = 1 + max((int(c.id_array.max()) for c in conversations if c.scope == "global" and c.id_array.size),
                   default=-1)
    facts, notes, keys = [], [], []
    for conv in conversations:
        ids, key_offset = conv.id_array, 0
        if conv.scope == "local":
            if ids.size and int(ids.max()) >= _DENSE_LIMIT:
                ids = intern_first_seen(ids)[0].astype(np.uint64)
                notes.append(f"{conv.path.name}: local ids >= 2**40 re-numbered 0, 1, ... in order of first "
                             "appearance before the offset")
            key_offset = base
            base += 1 + (int(ids.max()) if ids.size else -1)
        keys.append(ids + np.uint64(key_offset))
        facts.append({"id": conv.session, "file": conv.path.name, "hash_id_scope": conv.scope,
                      "key_offset": key_offset, "requests": len(conv.arrival)})
        if not conv.scope_given:
            notes.append(f"{conv.path.name}: no hash_id_scope; 'local' assumed")
    sessions = [c.session for c in conversations]
    repeated = sorted({s for s in sessions if sessions.count(s) > 1})
    if repeated:
        notes.append(f"conversation ids used by more than one file (their session_id repeats): "
                     f"{', '.join(repeated)}")
    lengths = np.concatenate([np.asarray(c.lengths, dtype=np.int64) for c in conversations])
    arrival = np.concatenate([np.asarray(c.arrival, dtype=np.float64) for c in conversations])
    order = np.argsort(arrival, kind="stable")
    late = [(c.session, int((a < np.maximum.accumulate(a)).sum())) for c in conversations
            if (a := np.asarray(c.arrival, dtype=np.float64)).size]
    late = [f"{session} ({count})" for session, count in late if count]
    all_keys = np.concatenate(keys)
    starts = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])
    blocks = lengths[order]
    offsets = np.zeros(blocks.shape[0] + 1, dtype=np.int64)
    np.cumsum(blocks, out=offsets[1:])
    gather = np.repeat(starts[:-1][order] - offsets[:-1], blocks) + np.arange(offsets[-1], dtype=np.int64)
    sorted_keys = all_keys[gather]

    def column(attr: str) -> list:
        values = [v for c in conversations for v in getattr(c, attr)]
        return [values[i] for i in order]

    request_id = np.concatenate([(np.uint64(c.ordinal) << np.uint64(32)) + np.arange(len(c.arrival), dtype=np.uint64)
                                 for c in conversations])[order]
    frame = pl.DataFrame({
        "request_id": request_id, "arrival_s": arrival[order],
        "input_tokens": np.concatenate([np.asarray(c.tokens_in, dtype=np.uint32) for c in conversations])[order],
        "output_tokens": np.concatenate([np.asarray(c.tokens_out, dtype=np.uint32) for c in conversations])[order],
        "block_keys": _list_column(sorted_keys, offsets, blocks),
        "session_id": pl.Series([conversations[i].session for i in np.repeat(
            np.arange(len(conversations)), [len(c.arrival) for c in conversations])[order]], dtype=pl.String),
        "agent_id": pl.Series(column("agents"), dtype=pl.String),
        "type": pl.Series(column("kinds"), dtype=pl.String),
        "model": pl.Series(column("models"), dtype=pl.String),
    })
    trace = trusted_trace(frame, block_size, str(path), partial_block_keyed=False, trusted=("arrival_s", "block_keys"),
                          lengths=blocks, csr=(offsets, sorted_keys))
    if sum(c.scope == "global" for c in conversations) > 1:  # ids shared across files: chained across them too
        names = [f"{c.path.name} {name}" for c in conversations for name in c.names]
        check_chained_keys(trace.flat, path, field="hash_ids", noun="id", names=[names[i] for i in order])
    notes = [
        "each conversation starts at its own t=0 (the files hold no wall-clock start); all are merged on that one "
        "clock", "a sub-agent's requests arrive at the sub-agent entry's t plus their own t",
        "rows sorted stably by arrival time (ties keep file, then document order); requests listed after a later "
        f"one in their file: {', '.join(late) if late else 'none'}",
        "hash_id_scope 'local': block_keys = hash_id + the conversation's key_offset, so conversations share no key; "
        "a sub-agent's requests share their parent's ids; 'global': the ids as they are",
        f"hash_ids key full {block_size}-token blocks only: the trailing partial block has no key", *notes]
    return stamp(trace, provenance("kv-cache-tester", path, {}, notes, block_size=block_size, files=len(conversations),
                                   conversations=facts))
