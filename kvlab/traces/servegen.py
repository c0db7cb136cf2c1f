"""Reader for the ServeGen offline traces (alibaba/ServeGen ``data/offline/``, the batch-inference
traces of "Batched in Back … with ACDC", SOSP'26, from Alibaba Cloud Model Studio / Bailian).

One JSON object per line (``data/offline/README.md``). Content-hash traces ``trace_a``–``c``::

    {"request_id": 0, "type": "text", "input_length": 271, "hash_ids": [0, 1, ..., 16], "img_ids": []}

``hash_ids`` are remapped hashes of the input's **prefix** blocks of 16 tokens (one global
namespace across the files; the last block partial: 271 tokens, 17 ids), ``img_ids`` anonymised
image ids, ``type`` ``text`` or ``multimodal``; there is no ``output_length``. Stat traces
``trace_d``–``f`` have ``request_id, type, input_length, output_length, duration`` (ms) and no
``hash_ids``. A batch job is submitted whole: **no arrival times**; ``request_id`` is the order
of the submitted input file. So arrivals are synthesized here at a stated rate.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from kvlab.core.validate import check_choice, check_flag, check_int, check_positive, check_real
from kvlab.traces.arrays import _list_column
from kvlab.traces.chain import check_chained_keys, rechain
from kvlab.traces.jsonl_fields import Field, check_block_counts, first_duplicate, flat_ids, read_fields
from kvlab.traces.sniff import Peek, TraceFormat, missing_field, provenance, stamp
from kvlab.traces.textfile import check_trace_path
from kvlab.traces.trace import Trace, trusted_trace

#: Block size of the ServeGen offline content-hash traces (``data/offline/README.md``).
SERVEGEN_BLOCK_SIZE = 16
#: How :func:`load_servegen` can synthesize arrivals.
ARRIVALS = ("poisson", "uniform")
_BASE = (Field("request_id", "int", low=0, high=2**63 - 1), Field("type", "str"), Field("input_length", "count"))


def load_servegen(path: str | Path, *, rate_per_s: float, seed: int = 0, block_size: int = SERVEGEN_BLOCK_SIZE,
                  arrivals: str = "poisson", rechain_ids: bool = False) -> Trace:
    """Load a ServeGen offline JSONL trace, with arrivals synthesized at ``rate_per_s``.

    Rows keep file order (the order of the batch's input file); ``request_id`` is the file's
    ``request_id`` (unique). Arrivals, stated in the provenance: ``"poisson"``: request 0 at
    0 s, then independent exponential gaps of mean ``1 / rate_per_s`` drawn from
    ``numpy.random.default_rng(seed)``; ``"uniform"``: request ``r`` at ``r / rate_per_s``.

    Content-hash traces (``hash_ids``): ``block_keys = hash_ids``, which the format promises
    prefix-chained (every id always follows the same parent id at the same position; checked,
    as for Mooncake), ``len(hash_ids) == ceil(input_length / block_size)``. ``rechain_ids=True``
    re-chains instead of checking (:func:`kvlab.traces.chain.rechain`), for files whose ids
    turn out not to be chained. ``output_tokens`` is ``output_length`` when the records have
    it, else 0 (the published content-hash traces record no output; noted in the provenance).
    Extra columns: ``type`` (str) and ``img_ids`` (list[str]) when present.

    Stat traces (no ``hash_ids``; ``output_length`` and ``duration``) load **without block
    identity** (:attr:`~kvlab.traces.Trace.block_identity` False: placeholder keys, a new one
    for every block of every request), with a ``duration_ms`` column: for the timed cluster
    simulation, not cache replays.

    Args:
        path: the ``.jsonl`` file (gzip read by name or magic bytes; a byte-order mark skipped).
        rate_per_s: requests per second of the synthesized arrivals (> 0).
        seed: seed (>= 0) of the Poisson gaps.
        block_size: tokens per hash id (16 for the published traces).
        arrivals: ``"poisson"`` or ``"uniform"``.
        rechain_ids: re-chain the ids instead of checking that they are chained.

    Returns:
        A :class:`~kvlab.traces.Trace` with ``source = str(path)`` and its provenance.

    Raises:
        ValueError: ``rate_per_s`` not a finite number > 0, ``seed`` not an integer >= 0,
            ``block_size`` not positive, an unknown ``arrivals``.
        TraceFormatError: naming the file and 1-based line: malformed JSON, a record that is
            not an object, a missing field (the first record decides whether ``hash_ids``,
            ``img_ids`` and ``output_length`` are expected), a value of the wrong type or out of
            range, ``len(hash_ids) != ceil(input_length / block_size)``, a repeated
            ``request_id``, ids that are not prefix-chained (unless ``rechain_ids``); also for a
            file with no records.
        FileNotFoundError: the file does not exist or is not a regular file.

    Example:
        >>> import json, tempfile
        >>> path = Path(tempfile.mkdtemp()) / "trace_a.jsonl"
        >>> _ = path.write_text("".join(json.dumps({"request_id": r, "type": "text", "input_length": n,
        ...     "hash_ids": ids, "img_ids": []}) + "\\n" for r, n, ids in [(0, 40, [0, 1, 2]), (1, 20, [0, 3])]))
        >>> trace = load_servegen(path, rate_per_s=2.0, arrivals="uniform")
        >>> trace.frame["arrival_s"].to_list(), trace.frame["output_tokens"].to_list()
        ([0.0, 0.5], [0, 0])
    """
    path = Path(path)
    rate = check_real("rate_per_s", rate_per_s, low=0.0, low_open=True)
    seed = check_int("seed", seed, low=0)
    block_size = check_positive("block_size", block_size)
    arrivals = check_choice("arrivals", arrivals, ARRIVALS)
    rechain_ids = check_flag("rechain_ids", rechain_ids)
    check_trace_path(path)
    first = Peek.of(path).record
    has = set(first) if isinstance(first, dict) else {"hash_ids"}  # not an object: the reader names the line
    content = "hash_ids" in has or "duration" not in has
    fields = [*_BASE, *(Field(name, kind) for name, kind in (
        ("hash_ids", "ids"), ("img_ids", "strs"), ("output_length", "count"), ("duration", "count"))
        if name in has or (name == "hash_ids" and content))]
    frame, lines = read_fields(path, fields)
    first_duplicate(path, lines, frame["request_id"].to_numpy(), "request_id")
    n = frame.height
    n_in = frame["input_length"].to_numpy()
    notes = [f"no arrival times in the file (a batch job): {arrivals} arrivals synthesized at {rate} requests/s"
             + (f" (exponential gaps, numpy default_rng({seed}); request 0 at 0 s)" if arrivals == "poisson"
                else " (request r at r / rate_per_s)")]
    if content:
        offsets = check_block_counts(path, lines, n_in, frame["hash_ids"], block_size)
        keys = flat_ids(frame["hash_ids"])
        if rechain_ids:
            keys = rechain(offsets, keys)
            notes.append("hash_ids re-chained on request (rechain_ids=True)")
    else:
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(-(-n_in // block_size), out=offsets[1:])
        keys = np.arange(offsets[-1], dtype=np.uint64)
        notes.append("a stat trace (no hash_ids): placeholder keys, no block identity")
    if "output_length" not in has:
        notes.append("no output_length in the file: output_tokens = 0")
    blocks = np.diff(offsets)
    out = pl.DataFrame({
        "request_id": frame["request_id"].cast(pl.UInt64),
        "arrival_s": synthesize_arrivals(n, rate, seed, arrivals),
        "input_tokens": frame["input_length"].cast(pl.UInt32),
        "output_tokens": (frame["output_length"] if "output_length" in has else pl.repeat(0, n, eager=True))
        .cast(pl.UInt32),
        "block_keys": _list_column(keys, offsets, blocks),
        "type": frame["type"],
        **({"img_ids": frame["img_ids"]} if "img_ids" in has else {}),
        **({"duration_ms": frame["duration"]} if "duration" in has else {}),
    })
    trace = trusted_trace(out, block_size, str(path), trusted=("arrival_s", "block_keys"), lengths=blocks,
                          csr=(offsets, keys))
    if content and not rechain_ids:
        check_chained_keys(trace.flat, path, field="hash_ids", noun="id", lines=lines)
    if not content:
        object.__setattr__(trace, "block_identity", False)
    options = {"rate_per_s": rate, "seed": seed, "block_size": block_size, "arrivals": arrivals,
               "rechain_ids": rechain_ids}
    return stamp(trace, provenance("servegen", path, options, notes, arrivals_synthesized=True,
                                   content_hash=content))


def synthesize_arrivals(n: int, rate_per_s: float, seed: int, arrivals: str) -> np.ndarray:
    """``float64[n]`` arrival times (s) for ``n`` requests: ``"poisson"`` (request 0 at 0, then
    exponential gaps of mean ``1 / rate_per_s`` from ``numpy.random.default_rng(seed)``) or
    ``"uniform"`` (request ``r`` at ``r / rate_per_s``). Non-decreasing, finite, >= 0.

    >>> synthesize_arrivals(3, 2.0, 0, "uniform").tolist()
    [0.0, 0.5, 1.0]
    """
    if arrivals == "uniform":
        return np.arange(n, dtype=np.float64) / rate_per_s
    times = np.zeros(n, dtype=np.float64)
    if n > 1:
        np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate_per_s, n - 1), out=times[1:])
    return times


def _load(path: str | Path, **options: object) -> Trace:
    """:func:`load_servegen` for :func:`kvlab.traces.load_trace`: ``rate_per_s`` must be given."""
    if options.get("rate_per_s") is None:
        raise ValueError(f"{path}: ServeGen offline traces have no arrival times (batch jobs); pass "
                         "rate_per_s=… (requests per second; kvlab: --trace-option rate_per_s=2.0) to "
                         "synthesize Poisson arrivals")
    return load_servegen(path, **options)


def _sniff(peek: Peek) -> str | None:
    reason = missing_field(peek, ("request_id", "input_length"))
    if reason is not None:
        return reason
    if "timestamp" in peek.record or "chat_id" in peek.record:
        key = "timestamp" if "timestamp" in peek.record else "chat_id"
        return f"{peek.where(key)}: present (ServeGen offline records have no {key})"
    if "hash_ids" not in peek.record and "duration" not in peek.record:
        return f"{peek.where('hash_ids')}: missing (and no 'duration': neither a content-hash nor a stat trace)"
    return None


SERVEGEN_FORMAT = TraceFormat(
    "servegen", "ServeGen offline JSONL (batch jobs, no arrival times): request_id, type, input_length, "
    "hash_ids (chained, 16 tokens) or output_length + duration; needs rate_per_s", _sniff, _load,
    ("rate_per_s", "seed", "block_size", "arrivals", "rechain_ids"))
