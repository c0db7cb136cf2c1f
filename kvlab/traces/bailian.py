"""Reader for the Alibaba Bailian / Qwen traces (alibaba-edu/qwen-bailian-usagetraces-anon, the
"KVCache Cache in the Wild" traces of USENIX ATC'25; docs/specs/traces.md §2.2).

One JSON object per line (README of the repository)::

    {"chat_id": 159, "parent_chat_id": 55, "timestamp": 61.114, "input_length": 521,
     "output_length": 132, "type": "text", "turn": 2, "hash_ids": [1089, 1090, ...]}

``timestamp`` is seconds from the trace start; ``parent_chat_id`` is -1 for a root request;
``type`` is text / search / image / file (``thinking``, ``coder``, ``api`` in the newer files);
``hash_ids`` has one id per 16-token block, the last block partial (the Q&A file of the
repository: the padding of the last input block is overwritten by the first output token, so
its hash may differ from a re-hash of the input; vLLM's ``benchmarks/benchmark_wa.py``, written
for these traces, asserts ``len(hash_ids) == ceil(input_length / 16)``). Each id is a salted
SipHash of its 16-token block **alone**, not of the prefix: the same block under another prefix
keeps its id, so the ids are re-chained here (:func:`kvlab.traces.chain.rechain`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from kvlab.core.validate import check_positive
from kvlab.traces.arrays import _list_column
from kvlab.traces.chain import rechain
from kvlab.traces.errors import TraceFormatError
from kvlab.traces.flat import intern_first_seen
from kvlab.traces.frame_checks import ROW_INVARIANTS
from kvlab.traces.jsonl_fields import Field, check_block_counts, first_duplicate, flat_ids, read_fields
from kvlab.traces.sniff import Peek, TraceFormat, missing_field, provenance, stamp
from kvlab.traces.textfile import check_trace_path
from kvlab.traces.trace import Trace, trusted_trace

#: Block size of the published Bailian traces (file names ``*_blksz_16.jsonl``; README).
BAILIAN_BLOCK_SIZE = 16
_I63 = 2**63 - 1
BAILIAN_FIELDS = (
    Field("chat_id", "int", low=0, high=_I63),
    Field("parent_chat_id", "int", low=-1, high=_I63),
    Field("timestamp", "time"),
    Field("input_length", "count"),
    Field("output_length", "count"),
    Field("type", "str"),
    Field("turn", "int", low=0, high=2**32 - 1),
    Field("hash_ids", "ids"),
)


def load_bailian(path: str | Path, *, block_size: int = BAILIAN_BLOCK_SIZE) -> Trace:
    """Load a Bailian / Qwen JSONL trace (``qwen_traceA_blksz_16.jsonl`` and its siblings).

    Rows are in arrival order: file order when the timestamps do not decrease, else a stable
    sort by ``timestamp`` (noted in the provenance with the number of rows that moved).
    ``request_id`` is the 0-based row; ``arrival_s = timestamp`` (seconds). ``block_keys``
    are the re-chained ``hash_ids``: the key of block ``i`` stands for the request's ids
    ``0..i`` in order (a new key for each distinct (prefix, id) pair, numbered in order of
    first appearance), so equal keys mean equal whole prefixes as every kvlab replay assumes.
    Extra columns: ``chat_id``, ``parent_chat_id``, ``turn`` (i64), ``type`` (str) and
    ``session_id`` (i64): the ``chat_id`` of the request's root, found by following
    ``parent_chat_id`` links; a parent that is not in the file ends the walk (the trace is a
    two-hour window: a conversation may have started before it), so that request stands as
    the root of its session (the count is in the provenance as ``parents_not_in_file``).
    Fields beyond the eight are ignored.

    Args:
        path: the ``.jsonl`` file (gzip read by name or magic bytes; a byte-order mark skipped).
        block_size: tokens per hash id (16 for the published traces).

    Returns:
        A :class:`~kvlab.traces.Trace` with ``source = str(path)`` and its provenance
        (``distinct_ids`` before and ``distinct_keys`` after re-chaining, ``rows_reordered``,
        ``parents_not_in_file``).

    Raises:
        TraceFormatError: naming the file and 1-based line: malformed JSON, a record that is
            not an object, a missing field, a value of the wrong type or out of range
            (negative lengths, ``parent_chat_id`` below -1, ids outside ``[0, 2**64)``),
            ``len(hash_ids) != ceil(input_length / block_size)``, a repeated ``chat_id``, a
            request that is its own ancestor; also for a file with no records.
        FileNotFoundError: the file does not exist or is not a regular file.
        ValueError: ``block_size`` not a positive integer.

    Example:
        >>> import json, tempfile
        >>> path = Path(tempfile.mkdtemp()) / "qwen_trace.jsonl"
        >>> rows = [(1, -1, 0.0, 40, [7, 8, 9]), (2, 1, 3.5, 50, [7, 8, 5, 6]), (3, -1, 4.0, 20, [9, 8])]
        >>> _ = path.write_text("".join(json.dumps({"chat_id": c, "parent_chat_id": p, "timestamp": t,
        ...     "input_length": n, "output_length": 9, "type": "text", "turn": 1 if p < 0 else 2,
        ...     "hash_ids": ids}) + "\\n" for c, p, t, n, ids in rows))
        >>> trace = load_bailian(path)
        >>> trace.frame["block_keys"].to_list()  # id 8 after 9 is not id 8 after 7: a new key
        [[0, 1, 2], [0, 1, 3, 4], [5, 6]]
        >>> trace.frame["session_id"].to_list(), trace.provenance["distinct_ids"]
        ([1, 1, 3], 5)
    """
    path = Path(path)
    block_size = check_positive("block_size", block_size)
    check_trace_path(path)
    frame, lines = read_fields(path, BAILIAN_FIELDS)
    check_block_counts(path, lines, frame["input_length"].to_numpy(), frame["hash_ids"], block_size)
    chat = frame["chat_id"].to_numpy()
    first_duplicate(path, lines, chat, "chat_id")
    session, not_in_file = root_chats(path, lines, chat, frame["parent_chat_id"].to_numpy())
    frame = frame.with_columns(pl.Series("session_id", session))
    ts = frame["timestamp"].to_numpy()
    moved = 0
    if (ts[1:] < ts[:-1]).any():
        order = np.argsort(ts, kind="stable")
        moved = int((order != np.arange(order.shape[0])).sum())
        frame, lines = frame[order], lines[order]
    offsets = np.zeros(frame.height + 1, dtype=np.int64)
    np.cumsum(frame["hash_ids"].list.len().to_numpy(), out=offsets[1:])
    ids = flat_ids(frame["hash_ids"])
    keys = rechain(offsets, ids)
    blocks = np.diff(offsets)
    out = pl.DataFrame({
        "request_id": np.arange(frame.height, dtype=np.uint64),
        "arrival_s": frame["timestamp"],
        "input_tokens": frame["input_length"].cast(pl.UInt32),
        "output_tokens": frame["output_length"].cast(pl.UInt32),
        "block_keys": _list_column(keys, offsets, blocks),
        **{c: frame[c] for c in ("chat_id", "parent_chat_id", "turn", "type", "session_id")},
    })
    trace = trusted_trace(out, block_size, str(path), trusted=ROW_INVARIANTS, lengths=blocks, csr=(offsets, keys))
    notes = [f"hash_ids re-chained: each id names one {block_size}-token block alone (salted SipHash per "
             "block), so block_keys number each distinct (prefix, id) pair (docs/specs/traces.md §2.2)",
             "session_id: the chat_id reached by following parent_chat_id until -1 or a parent not in the file"]
    if moved:
        notes.append(f"rows sorted by timestamp (stable): {moved} rows were out of file order")
    facts = {"distinct_ids": int(intern_first_seen(ids)[1].shape[0]),
             "distinct_keys": int(keys.max()) + 1 if keys.size else 0,
             "rows_reordered": moved, "parents_not_in_file": not_in_file}
    return stamp(trace, provenance("bailian", path, {"block_size": block_size}, notes, **facts))


def root_chats(path: Path, lines: np.ndarray, chat: np.ndarray, parent: np.ndarray) -> tuple[np.ndarray, int]:
    """The root ``chat_id`` of every row and how many rows name a parent not in the file.

    Follows ``parent`` links by pointer doubling (whole-array steps, ``log2(depth)`` of them):
    a row whose parent is -1 or not among ``chat`` is its own root.

    Args:
        path, lines: the file and the 1-based line of each row (for errors).
        chat: ``int64[rows]`` unique chat ids; parent: ``int64[rows]`` parent ids (-1: root).

    Raises:
        TraceFormatError: a row that is its own parent or ancestor (a cycle of parent links).
    """
    n = chat.shape[0]
    order = np.argsort(chat, kind="stable")
    at = np.minimum(np.searchsorted(chat, parent, sorter=order), n - 1)
    found = (parent >= 0) & (chat[order[at]] == parent)
    up = np.where(found, order[at], np.arange(n))
    for _ in range(max(1, int(n).bit_length()) + 1):
        nxt = up[up]
        if (nxt == up).all():
            break
        up = nxt
    stuck = np.flatnonzero((up[up] != up) | (found & (up == np.arange(n))))
    if stuck.size:
        row = int(stuck[0])
        raise TraceFormatError(path, int(lines[row]), f"field 'parent_chat_id': chat {int(chat[row])} is its own "
                                                      "ancestor (parent_chat_id links form a cycle)")
    return chat[up], int(((parent >= 0) & ~found).sum())


def _sniff(peek: Peek) -> str | None:
    """An object with ``chat_id`` and ``parent_chat_id`` (a record missing another field is still
    Bailian's: the reader names the field), whose ``hash_ids``, if present, is a list."""
    reason = missing_field(peek, ("chat_id", "parent_chat_id"))
    if reason is None and not isinstance(peek.record.get("hash_ids", []), list):
        return f"{peek.where('hash_ids')}: a JSON {type(peek.record['hash_ids']).__name__}, not a list of ids"
    return reason


BAILIAN_FORMAT = TraceFormat(
    "bailian", "Alibaba Bailian / Qwen JSONL: chat_id, parent_chat_id, timestamp (s), input_length, "
    "output_length, type, turn, hash_ids (per 16-token block, re-chained)", _sniff, load_bailian, ("block_size",))
