"""Building traces from token ids with an engine's hashing, and coarsening block size."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import polars as pl

from kvlab.core.validate import check_positive
from kvlab.hashing.base import MAX_BLOCK_SIZE, BlockHasher, MMItem, RequestExtras, check_block_size
from kvlab.traces.chain import check_chained_keys
from kvlab.traces.flat import list_series
from kvlab.traces.trace import Trace

#: Optional string columns mapped onto :class:`~kvlab.hashing.RequestExtras` fields.
EXTRA_COLUMNS = ("lora_name", "lora_path", "lora_identity", "cache_salt")


def trace_from_token_ids(frame: pl.DataFrame, hasher: BlockHasher, *, source: str = "token_ids") -> Trace:
    """A :class:`Trace` whose ``block_keys`` are ``hasher.block_keys`` of each prompt.

    Args:
        frame: one row per request with ``request_id``, ``arrival_s``,
            ``output_tokens`` and ``token_ids`` (``list[int]``); ``input_tokens`` is
            taken from ``token_ids`` when absent. Optional per-request extras, read
            into a :class:`~kvlab.hashing.RequestExtras`: string columns
            ``lora_name``, ``lora_path``, ``lora_identity``, ``cache_salt`` (null =
            none) and ``mm_items`` (``list[struct{identifier: str, offset: int,
            length: int}]``). Other columns are kept.
        hasher: any profile of :mod:`kvlab.hashing`; its block size becomes the
            trace's, and its ``hashes_partial_tail`` the trace's
            ``partial_block_keyed``.
        source: where the token ids came from; the hasher's ``repr`` is appended.

    Returns:
        The trace (``token_ids`` kept as ``list[u32]``). Prompt embeddings are not read
        from frames (build such traces with a hasher call per request).

    Raises:
        ValueError: not a DataFrame or not a BlockHasher; ``token_ids`` missing, not
            lists of integers, holding a null or a token outside ``[0, 2**32)``;
            ``input_tokens`` not integers or disagreeing with ``token_ids``; an extras
            column of the wrong type or a row's extras invalid (names the row); a hasher
            whose block count is neither floor nor ceil of ``n / block_size``.

    Example:
        >>> from kvlab.hashing.sim_hash import SimHasher
        >>> frame = pl.DataFrame({"request_id": [0, 1], "arrival_s": [0.0, 1.0], "output_tokens": [1, 1],
        ...                       "token_ids": [list(range(40)), list(range(36)) + [99, 98]]})
        >>> trace = trace_from_token_ids(frame, SimHasher(block_size=16))
        >>> trace.frame["block_keys"].list.len().to_list(), trace.partial_block_keyed
        ([2, 2], False)
        >>> replayed = trace.frame["block_keys"].to_list()
        >>> replayed[0] == replayed[1]  # same first 32 tokens: same keys
        True
    """
    if not isinstance(hasher, BlockHasher):
        raise ValueError(f"hasher must be a kvlab.hashing BlockHasher, got {type(hasher).__name__}")
    tokens_col, lengths = _checked_token_ids(frame)
    extras_rows = _extras_per_row(frame)
    keys = []
    for row, (tokens, extras) in enumerate(zip(tokens_col.to_list(), extras_rows)):
        try:
            row_keys = hasher.block_keys(np.asarray(tokens, dtype=np.int64), extras)
        except ValueError as err:
            raise ValueError(f"row {row}: {err}") from None
        expected = hasher.num_hashed_blocks(len(tokens))
        full, rest = divmod(len(tokens), hasher.block_size)
        if expected not in (full, full + (rest > 0)):
            raise ValueError(f"{hasher!r} hashes {expected} blocks of a {len(tokens)}-token prompt (row {row}); a "
                             f"Trace needs one key per full block, or per block with a partial tail (e.g. "
                             f"Dynamo's EAGLE windows hash (n - 1) // B blocks): build this trace another way")
        keys.append(row_keys)
    built = frame.with_columns(
        token_ids=tokens_col,
        input_tokens=lengths,
        block_keys=list_series(keys),
    )
    return Trace(built, block_size=hasher.block_size, source=f"{source} | {hasher!r}",
                 partial_block_keyed=hasher.hashes_partial_tail)


def _checked_token_ids(frame: object) -> tuple[pl.Series, pl.Series]:
    """The ``token_ids`` column (``list[u32]``) and its lengths, or a clear error."""
    if not isinstance(frame, pl.DataFrame):
        raise ValueError(f"frame must be a polars DataFrame, got {type(frame).__name__}")
    if "token_ids" not in frame.columns:
        raise ValueError(f"frame needs a 'token_ids' column; has {frame.columns}")
    if frame.height == 0:
        raise ValueError("a trace needs at least one request; the frame is empty")
    tokens = frame["token_ids"]
    if isinstance(tokens.dtype, pl.Array):
        tokens = tokens.cast(pl.List(tokens.dtype.inner))
    if not isinstance(tokens.dtype, pl.List) or not (tokens.dtype.inner.is_integer() or tokens.dtype.inner == pl.Null):
        raise ValueError(f"column 'token_ids' must hold lists of integers, got dtype {tokens.dtype}")
    nulls = tokens.is_null() | tokens.list.eval(pl.element().is_null().any()).list.first().fill_null(False)
    if nulls.any():
        raise ValueError(f"column 'token_ids' has a null at row {int(nulls.arg_true()[0])}")
    flat = tokens.explode(empty_as_null=False).drop_nulls()
    if flat.len() and (flat.min() < 0 or flat.max() > 2**32 - 1):
        bad = flat.filter((flat < 0) | (flat > 2**32 - 1))[0]
        raise ValueError(f"column 'token_ids' must hold token ids in [0, 2**32) (a Trace stores them as u32), "
                         f"got {bad}")
    lengths = tokens.list.len()
    if "input_tokens" in frame.columns:
        given = frame["input_tokens"]
        if not given.dtype.is_integer() or given.null_count():
            raise ValueError(f"column 'input_tokens' must hold integers without nulls, got dtype {given.dtype}")
        wrong = given.cast(pl.Int64) != lengths.cast(pl.Int64)
        if wrong.any():
            row = int(wrong.arg_true()[0])
            raise ValueError(f"row {row}: input_tokens={given[row]} but token_ids has {lengths[row]} tokens")
    return tokens.cast(pl.List(pl.UInt32)), lengths


def _extras_per_row(frame: pl.DataFrame) -> list[RequestExtras | None]:
    columns = [c for c in EXTRA_COLUMNS if c in frame.columns]
    for col in columns:
        if frame.schema[col] not in (pl.String, pl.Null):
            raise ValueError(f"column {col!r} must hold strings (null = none), got dtype {frame.schema[col]}")
    has_mm = "mm_items" in frame.columns
    if not columns and not has_mm:
        return [None] * frame.height
    rows = frame.select(*columns, *(["mm_items"] if has_mm else [])).iter_rows(named=True)
    out = []
    for row_index, row in enumerate(rows):
        try:
            items = tuple(MMItem(**item) for item in (row.pop("mm_items", None) or ()))
            out.append(RequestExtras(**row, mm_items=items))
        except (TypeError, ValueError) as err:
            raise ValueError(f"row {row_index}: invalid request extras: {err}") from None
    return out


def rechunk(trace: Trace, k: int) -> Trace:
    """Coarsen a trace to blocks ``k`` times larger.

    The key of a group of ``k`` consecutive blocks is its last block's key — under
    chained keys that key already stands for the whole prefix up to the group's end
    (as vLLM's coarse view of a larger KV-cache group, docs/specs/hashing.md §1.6).
    A trailing incomplete group keeps its last key when the trace keys partial blocks
    (its coarse block is partial too), and is dropped otherwise (full blocks only).
    Use it to tune chunk size on hash-id traces: Mooncake's 512-token ids give 1024,
    2048, … token blocks.

    Args:
        trace: the trace.
        k: integer coarsening factor (≥ 1; 1 returns an equal trace).

    Raises:
        ValueError: ``k`` is not an integer >= 1 — finer blocks than the trace's cannot
            be made: a chained id hides where inside its block two prompts diverge.
        kvlab.traces.TraceFormatError: the trace's keys are not prefix-chained (keeping every
            k-th key is only a coarser chain when each key stands for its whole prefix).

    Example:
        >>> from kvlab.traces import load_trace
        >>> coarse = load_trace("synthetic").rechunk(2)
        >>> coarse.block_size, coarse.check_chained().height
        (1024, 0)
    """
    try:
        check_positive("k", k)
    except ValueError as err:
        raise ValueError(f"rechunk: {err} (blocks k times larger); blocks finer than the trace's {trace.block_size} "
                         f"tokens cannot be made: a chained id hides where inside its block two prompts "
                         f"diverge") from None
    k = check_block_size(k, "k")
    if trace.block_size * k > MAX_BLOCK_SIZE:
        raise ValueError(f"rechunk({k}) would make {trace.block_size * k}-token blocks; the limit is 2**31 - 1")
    check_chained_keys(trace.flat, trace.source)
    keys = pl.col("block_keys")
    groups = keys.list.gather_every(k, offset=k - 1)
    if trace.partial_block_keyed:
        ragged = (keys.list.len() % k) != 0
        groups = pl.when(ragged).then(groups.list.concat(keys.list.last())).otherwise(groups)
    frame = trace.frame.with_columns(groups.alias("block_keys"))
    return replace(trace, frame=frame, block_size=trace.block_size * k, source=f"{trace.source} | rechunk({k})")
