"""Reader for RAGPulse (flashserve/RAGPulse ``data/``): RAG requests made of variable-length segments.

A RAGPulse trace is a folder: ``0_trace.jsonl`` holds the requests, one JSON object per line::

    {"timestamp": "82", "input_length": 3112, "output_length": 192,
     "hash_ids": {"sys_prompt": [8302, 14332, 15199], "passages_ids": [7398, 7370], "history": [15200],
                  "web_search": [], "user_input": [26923]},
     "session_id": "1757476916095-afhwfadnh5ew"}

and one file per component maps a segment id to its length, ``{"passage_id": 0, "token_length": 84}``
(``1_sys_prompt``, ``2_passages``, ``3_history``, ``4_user_input``, ``5_web_search``; ``.jsonl`` or
``.jsonl.gz``). The ids name whole segments, not prefixes: :func:`load_ragpulse` chains them
(:func:`kvlab.traces.chain.segment_block_keys`) and keeps each request's segment list for
:func:`kvlab.blend.replay_segments`. docs/trace_formats/ragpulse.md has the details and numbers.
"""

from __future__ import annotations

import gzip
import io
import warnings
from pathlib import Path

import numpy as np
import polars as pl

from kvlab.core.validate import check_positive, check_real, check_u64
from kvlab.traces.arrays import _list_column
from kvlab.traces.chain import segment_block_keys
from kvlab.traces.errors import TraceFormatError
from kvlab.traces.jsonl_fields import Field, check_field, read_fields
from kvlab.traces.sniff import Peek, TraceFormat, missing_field, provenance, stamp
from kvlab.traces.textfile import check_trace_path, is_gzip_name, iter_records
from kvlab.traces.trace import Trace, trusted_trace

#: The components of ``hash_ids`` in prompt order → (component file stem, its id field, ``segment_kind``).
COMPONENTS: dict[str, tuple[str, str, str]] = {
    "sys_prompt": ("1_sys_prompt", "sys_prompt_id", "sys_prompt"),
    "passages_ids": ("2_passages", "passage_id", "passages"),
    "history": ("3_history", "history_id", "history"),
    "web_search": ("5_web_search", "web_search_id", "web_search"),
    "user_input": ("4_user_input", "user_input_id", "user_input"),
}
#: The request file's stem (``0_trace.jsonl`` / ``0_trace.jsonl.gz``).
TRACE_STEM = "0_trace"
_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids", "session_id")
_SCHEMA = {"timestamp": pl.String, "input_length": pl.Int64, "output_length": pl.Int64,
           "hash_ids": pl.Struct({c: pl.List(pl.UInt64) for c in COMPONENTS}), "session_id": pl.String}
_QUOTES = 24  # a plain record's double quotes: 10 field names, 10 component names, 2 string values
_U32 = 2**32 - 1


def load_ragpulse(path: str | Path, *, block_size: int = 16) -> Trace:
    """Load a RAGPulse trace: the folder (or its ``0_trace.jsonl[.gz]``) and the component files beside it.

    Rows are sorted by ``timestamp`` (stably: the published file is two arrival-ordered runs, not
    one); ``request_id`` is the record's 0-based number in the file. Columns: ``arrival_s =
    timestamp / 1000``, ``input_tokens``, ``output_tokens``, ``block_keys`` (prefix semantics,
    below), ``session_id`` (str), ``segment_ids`` (``list[u64]``), ``segment_tokens``
    (``list[u32]``, from the component files), ``segment_kind`` (``list[str]``: ``sys_prompt``,
    ``passages``, ``history``, ``web_search``, ``user_input``) in prompt order (the components in
    that order), and ``template_tokens`` (u32): ``input_length`` minus the segments' tokens (6–12
    on every published request), taken as tokens at the end of the prompt unique to the request.

    Block keys: the segments are chained in prompt order and each ``block_size``-token block gets
    the exact key of (the chained key of the segment holding its last token, that token's offset),
    so equal keys ⇔ the same segments in the same order up to that token
    (:func:`kvlab.traces.chain.segment_block_keys`). Only full blocks are keyed
    (``partial_block_keyed=False``, as vLLM): a partial block's key could be shared only by a prompt
    ending at the same token, so the block-level prefix hit is exactly the full blocks inside the
    segment-level prefix hit. What was reordered and assumed is written in ``provenance["notes"]``.

    Args:
        path: the folder, or its ``0_trace.jsonl`` (``.gz`` read compressed; gzip is also found by
            its magic bytes).
        block_size: tokens per block key (≥ 1).

    Returns:
        A :class:`~kvlab.traces.Trace` with ``source = str(path)``.

    Raises:
        TraceFormatError: ``file:line: field 'x': what is wrong``: malformed JSON, a missing
            field, a timestamp that is not milliseconds ≥ 0 (a number or a numeric string), a
            length not an integer in ``[0, 2**32)``, ``hash_ids`` not an object of the five
            component lists of u64 ids, a ``session_id`` that is not a string, an id missing from
            its component file, ``input_length`` below its segments' tokens; in a component file
            a missing or bad id or ``token_length``, an id listed twice or in two files; an empty
            file; a folder without ``0_trace.jsonl``.
        FileNotFoundError: ``path`` is not a file or folder.
        ValueError: ``block_size`` not an integer ≥ 1.

    Example:
        >>> import json, pathlib, tempfile
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> ids = {"sys_prompt": [1], "passages_ids": [2], "history": [], "web_search": [], "user_input": [3]}
        >>> rec = {"timestamp": "5", "input_length": 40, "output_length": 9, "hash_ids": ids, "session_id": "s"}
        >>> _ = (d / "0_trace.jsonl").write_text(json.dumps(rec) + "\\n")
        >>> for stem, key, i, n in [("1_sys_prompt", "sys_prompt_id", 1, 20), ("2_passages", "passage_id", 2, 12),
        ...                         ("4_user_input", "user_input_id", 3, 2)]:
        ...     _ = (d / f"{stem}.jsonl").write_text(json.dumps({key: i, "token_length": n}) + "\\n")
        >>> t = load_ragpulse(d)
        >>> t.frame["segment_tokens"].to_list(), t.frame["template_tokens"].to_list(), t.block_refs
        ([[20, 12, 2]], [6], 2)
    """
    block_size = check_positive("block_size", block_size)
    trace_path = _trace_file(Path(path))
    frame, lines = _read_requests(trace_path)
    ids, lengths, kinds, files = _read_components(trace_path.parent, frame, lines, trace_path)
    ms_in_file = frame["ms"].to_numpy()
    order = np.argsort(ms_in_file, kind="stable")
    frame, lines = frame[order], lines[order]
    seg_lists = frame.select(pl.concat_list(list(COMPONENTS)).alias("s"))["s"]
    num_segs = seg_lists.list.len().to_numpy().astype(np.int64)
    seg_off = np.zeros(frame.height + 1, dtype=np.int64)
    np.cumsum(num_segs, out=seg_off[1:])
    seg_ids = seg_lists.explode(empty_as_null=False).drop_nulls().to_numpy().astype(np.uint64)
    seg_kind = frame.select(pl.concat_list([pl.lit(i, dtype=pl.Int8).repeat_by(pl.col(c).list.len())
                                            for i, c in enumerate(COMPONENTS)]).alias("k"))["k"]
    seg_kind = seg_kind.explode(empty_as_null=False).drop_nulls().to_numpy()
    seg_tok = _lookup(trace_path, lines, seg_off, seg_ids, seg_kind, ids, lengths, kinds, files)
    inputs = frame["input_length"].to_numpy()
    rows = np.repeat(np.arange(frame.height), num_segs)
    template = inputs - np.bincount(rows, weights=seg_tok, minlength=frame.height).astype(np.int64)
    if (template < 0).any():
        r = int(np.argmax(template < 0))
        raise TraceFormatError(trace_path, int(lines[r]), f"field 'input_length': {inputs[r]} is less than the "
                                                          f"{inputs[r] - template[r]} tokens of its segments")
    blk_off, keys = segment_block_keys(seg_off, seg_ids, seg_tok, inputs, block_size, partial_block_keyed=False)
    names = pl.Series([spec[2] for spec in COMPONENTS.values()], dtype=pl.String)
    table = pl.DataFrame({
        "request_id": order.astype(np.uint64), "arrival_s": frame["ms"].to_numpy() / 1000.0,
        "input_tokens": inputs.astype(np.uint32), "output_tokens": frame["output_length"].to_numpy().astype(np.uint32),
        "block_keys": _list_column(keys, blk_off, np.diff(blk_off)),
        "session_id": frame["session_id"],
        "segment_ids": _lists("segment_ids", pl.Series(seg_ids, dtype=pl.UInt64), seg_off),
        "segment_tokens": _lists("segment_tokens", pl.Series(seg_tok, dtype=pl.UInt32), seg_off),
        "segment_kind": _lists("segment_kind", names.gather(seg_kind), seg_off),
        "template_tokens": template.astype(np.uint32),
    })
    trace = trusted_trace(table, block_size, str(path), False, trusted=("arrival_s", "block_keys"),
                          lengths=np.diff(blk_off), csr=(blk_off, keys))
    notes = _notes(ms_in_file, order, template, rows, seg_ids)
    return stamp(trace, provenance("ragpulse", path, {"block_size": block_size}, notes, files=files,
                                   sessions=int(frame["session_id"].n_unique()),
                                   segments=int(seg_ids.shape[0]), distinct_segments=int(np.unique(seg_ids).shape[0])))


def _lists(name: str, values: pl.Series, offsets: np.ndarray) -> pl.Series:
    """A list column of CSR ``values``: row ``r`` is ``values[offsets[r]:offsets[r + 1]]``."""
    return (pl.DataFrame({"start": offsets[:-1], "len": np.diff(offsets)})
            .select(pl.lit(values).implode().list.slice(pl.col("start"), pl.col("len")).alias(name)).to_series())


def _trace_file(path: Path) -> Path:
    """``0_trace.jsonl`` (or ``.jsonl.gz``) of a folder, or the file itself."""
    if path.is_dir():
        for name in (f"{TRACE_STEM}.jsonl", f"{TRACE_STEM}.jsonl.gz"):
            if (path / name).is_file():
                return path / name
        raise TraceFormatError(path, None, f"no {TRACE_STEM}.jsonl (or .jsonl.gz) in the folder: not a RAGPulse trace")
    check_trace_path(path)
    return path


def _component_file(folder: Path, stem: str) -> Path | None:
    for name in (f"{stem}.jsonl", f"{stem}.jsonl.gz"):
        if (folder / name).is_file():
            return folder / name
    return None


def _columnar(path: Path, schema: dict[str, pl.DataType], quotes: int) -> tuple[pl.DataFrame, np.ndarray] | None:
    """The fast path: polars' JSON reader on the non-blank lines with a strict schema, and their
    1-based line numbers; ``None`` when the file is not plainly valid (the line reader then names
    the line): a value of another type, a null, a missing or extra field (counted by quotes)."""
    try:
        raw = gzip.decompress(path.read_bytes()) if is_gzip_name(path) else path.read_bytes()
    except (OSError, EOFError):
        return None
    lines = raw.removeprefix(b"\xef\xbb\xbf").split(b"\n")
    keep = [i for i, line in enumerate(lines) if line.strip()]
    if not keep:
        return None
    body = b"\n".join(lines[i] for i in keep)
    if body.count(b'"') != quotes * len(keep):
        return None
    try:
        frame = pl.read_ndjson(io.BytesIO(body), schema=schema)
    except Exception:  # polars raises several error types for malformed or mixed records
        return None
    if "hash_ids" in frame.columns:
        frame = frame.unnest("hash_ids")
    if frame.height != len(keep) or frame.null_count().sum_horizontal().item() or any(
            frame[c].explode(empty_as_null=False).null_count() for c in COMPONENTS if c in frame.columns):
        return None
    return frame, np.asarray(keep, dtype=np.int64) + 1


def _field(path: Path, lineno: int, check: object, name: str, value: object, **bounds: object) -> object:
    try:
        return check(f"field {name!r}", value, **bounds)
    except ValueError as err:
        raise TraceFormatError(path, lineno, str(err)) from None


def _requests_by_line(path: Path) -> tuple[pl.DataFrame, np.ndarray]:
    """The line reader: every check names the file, line and field."""
    cols: dict[str, list] = {name: [] for name in ("ms", "input_length", "output_length", *COMPONENTS, "session_id")}
    lines, unknown = [], {}
    for lineno, rec in iter_records(path):
        for name in _FIELDS:
            if name not in rec:
                raise TraceFormatError(path, lineno, f"missing field {name!r}")
        ts = rec["timestamp"]
        try:
            ms = float(ts) if isinstance(ts, str) else ts
        except ValueError:
            ms = None
        _field(path, lineno, check_real, "timestamp", ms if ms is not None else ts, low=0.0)
        cols["ms"].append(float(ms))
        for name in ("input_length", "output_length"):
            cols[name].append(check_field(path, lineno, rec, Field(name, "count")))
        comp = rec["hash_ids"]
        if not isinstance(comp, dict):
            raise TraceFormatError(path, lineno, f"field 'hash_ids': must be an object of component lists "
                                                 f"({', '.join(COMPONENTS)}), got {type(comp).__name__}")
        extra = sorted(set(comp) - set(COMPONENTS))
        if extra:
            raise TraceFormatError(path, lineno, f"field 'hash_ids.{extra[0]}': not a RAGPulse component "
                                                 f"({', '.join(COMPONENTS)})")
        for name in COMPONENTS:
            if name not in comp:
                raise TraceFormatError(path, lineno, f"field 'hash_ids.{name}': missing")
            seg = comp[name]
            if not isinstance(seg, list):
                raise TraceFormatError(path, lineno, f"field 'hash_ids.{name}': must be a list of ids, "
                                                     f"got {type(seg).__name__}")
            for i, value in enumerate(seg):
                _field(path, lineno, check_u64, f"hash_ids.{name}[{i}]", value)
            cols[name].append(seg)
        cols["session_id"].append(check_field(path, lineno, rec, Field("session_id", "str")))
        for key in rec.keys() - set(_FIELDS):
            unknown.setdefault(key, lineno)
        lines.append(lineno)
    if not lines:
        raise TraceFormatError(path, None, "no records (empty file)")
    if unknown:
        where = ", ".join(f"{k!r} (first at line {n})" for k, n in sorted(unknown.items()))
        warnings.warn(f"{path}: fields not part of the RAGPulse format were not loaded: {where}", UserWarning,
                      stacklevel=4)
    schema = {"ms": pl.Float64, "input_length": pl.Int64, "output_length": pl.Int64,
              **{c: pl.List(pl.UInt64) for c in COMPONENTS}, "session_id": pl.String}
    return pl.DataFrame(cols, schema=schema), np.asarray(lines, dtype=np.int64)


def _read_requests(path: Path) -> tuple[pl.DataFrame, np.ndarray]:
    """The requests in file order (``ms``, lengths, the five id lists, ``session_id``) and their lines."""
    fast = _columnar(path, _SCHEMA, _QUOTES)
    if fast is None:
        return _requests_by_line(path)
    frame, lines = fast
    ms = frame["timestamp"].str.strip_chars().cast(pl.Float64, strict=False)
    bad = ms.is_null() | ~ms.is_finite() | (ms < 0)
    for name in ("input_length", "output_length"):
        bad_len = (frame[name] < 0) | (frame[name] > _U32)
        if bad_len.any():
            r = int(bad_len.arg_true()[0])
            raise TraceFormatError(path, int(lines[r]), f"field {name!r} must be an integer in [0, 2**32), "
                                                        f"got {frame[name][r]}")
    if bad.any():
        r = int(bad.arg_true()[0])
        raise TraceFormatError(path, int(lines[r]), f"field 'timestamp' must be a finite number >= 0 of milliseconds "
                                                    f"(a number or a numeric string), got {frame['timestamp'][r]!r}")
    return frame.with_columns(ms.alias("ms")).drop("timestamp"), lines


def _read_components(folder: Path, frame: pl.DataFrame, lines: np.ndarray, trace_path: Path
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, str]]:
    """Every component file's ids (sorted, ``uint64``), lengths, component index, and the file names.

    Raises:
        TraceFormatError: a bad line, an id listed twice (in one file or two), or no file for a
            component the requests use.
    """
    parts, files = [], {}
    for k, (name, (stem, key, _)) in enumerate(COMPONENTS.items()):
        path = _component_file(folder, stem)
        if path is None:
            used = frame[name].list.len() > 0
            if used.any():
                r = int(used.arg_true()[0])
                raise TraceFormatError(trace_path, int(lines[r]), f"field 'hash_ids.{name}': no {stem}.jsonl "
                                                                  f"(or .gz) beside the trace to give its lengths")
            continue
        files[name] = path.name
        comp, comp_lines = read_fields(path, (Field(key, "id"), Field("token_length", "count")))
        tok = comp["token_length"].to_numpy()
        parts.append((comp[key].to_numpy().astype(np.uint64), tok, np.full(comp.height, k, np.int8), comp_lines,
                      path))
    ids = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, np.uint64)
    order = np.argsort(ids, kind="stable")
    ids = ids[order]
    dup = np.flatnonzero(ids[1:] == ids[:-1])
    if dup.size:
        where = [(p[4], int(line)) for p in parts for line in p[3]]
        first, second = where[order[dup[0]]], where[order[dup[0] + 1]]
        raise TraceFormatError(second[0], second[1], f"id {ids[dup[0]]} is listed again (first in "
                                                     f"{first[0].name}:{first[1]}): ids must name one segment")
    lengths = np.concatenate([p[1] for p in parts])[order] if parts else np.zeros(0, np.int64)
    kinds = np.concatenate([p[2] for p in parts])[order] if parts else np.zeros(0, np.int8)
    return ids, lengths, kinds, files


def _lookup(path: Path, lines: np.ndarray, seg_off: np.ndarray, seg_ids: np.ndarray, seg_kind: np.ndarray,
            ids: np.ndarray, lengths: np.ndarray, kinds: np.ndarray, files: dict[str, str]) -> np.ndarray:
    """``int64[num_segments]`` token lengths of the segments, or the first id not in its component file."""
    at = np.minimum(np.searchsorted(ids, seg_ids), max(ids.shape[0] - 1, 0))
    found = (ids[at] == seg_ids) & (kinds[at] == seg_kind) if ids.shape[0] else np.zeros(seg_ids.shape[0], bool)
    if not found.all():
        ref = int(np.argmax(~found))
        row = int(np.searchsorted(seg_off, ref, side="right") - 1)
        name = list(COMPONENTS)[seg_kind[ref]]
        i = int((seg_kind[seg_off[row]:ref] == seg_kind[ref]).sum())
        listed = files.get(name, COMPONENTS[name][0] + ".jsonl")
        raise TraceFormatError(path, int(lines[row]), f"field 'hash_ids.{name}[{i}]': id {seg_ids[ref]} is not "
                                                      f"in {listed}")
    return lengths[at].astype(np.int64)


def _notes(ms_in_file: np.ndarray, order: np.ndarray, template: np.ndarray, rows: np.ndarray,
           seg_ids: np.ndarray) -> list[str]:
    """What the reader reordered and assumed, for ``provenance["notes"]``."""
    n = order.shape[0]
    notes = []
    early = int((ms_in_file < np.maximum.accumulate(ms_in_file)).sum())  # before a record above them in the file
    if early:
        drops = int((ms_in_file[1:] < ms_in_file[:-1]).sum())
        notes.append(f"rows sorted by timestamp (stable; the file is not in arrival order): {early} of {n} records "
                     f"arrive before a record above them in the file (the timestamp drops {drops} time(s)); "
                     "request_id is the record's 0-based number in the file")
    if template.size:
        notes.append(f"input_length exceeds the sum of the segments' token_length by {int(template.min())}-"
                     f"{int(template.max())} tokens: taken as template tokens at the end of the prompt, unique to "
                     "each request (column template_tokens)")
    dense = np.unique(seg_ids, return_inverse=True)[1].reshape(-1).astype(np.int64)
    pairs, counts = np.unique(rows.astype(np.int64) * (int(dense.max(initial=0)) + 1) + dense, return_counts=True)
    repeats = np.unique(pairs[counts > 1] // (int(dense.max(initial=0)) + 1)).shape[0]
    if repeats:
        notes.append(f"{repeats} requests list a segment twice: chained in place (prefix keys stay exact)")
    notes.append("block keys: segments chained in prompt order; a full block's key is (chained key of the segment "
                 "holding its last token, its offset): equal keys mean the same segments in the same order; "
                 "a trailing partial block has no key")
    return notes


def _sniff(peek: Peek) -> str | None:
    """A folder with ``0_trace.jsonl[.gz]``, or a file whose first record's ``hash_ids`` is an object of lists."""
    if peek.entries:
        if f"{TRACE_STEM}.jsonl" in peek.entries or f"{TRACE_STEM}.jsonl.gz" in peek.entries:
            return None
        return f"a folder without {TRACE_STEM}.jsonl"
    reason = missing_field(peek, ("hash_ids",))
    if reason is not None:
        return reason
    comp = peek.record["hash_ids"]
    if not isinstance(comp, dict) or not all(isinstance(v, list) for v in comp.values()):
        return f"{peek.where('hash_ids')}: not an object of component lists ({', '.join(COMPONENTS)})"
    return None


RAGPULSE_FORMAT = TraceFormat(
    "ragpulse", "RAGPulse folder: 0_trace.jsonl (hash_ids an object of component lists of segment ids) and "
    "the component files of segment lengths", _sniff, load_ragpulse, ("block_size",))
