"""One pass over a replay's per-request arrays: the derived columns, the summary's totals and
the timeline's running sums, in a single numba loop (no per-request temporaries).

:func:`kvlab.sim.replay` turns the kernel's outputs into a :class:`~kvlab.core.RunResult`; done
with numpy, each derived column, each bucket sum and each summary total is its own pass over
10⁷-long arrays (and a temporary as long), several times the kernel's own cost on short
requests. Here every request is visited once.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from kvlab.core.jit import kernel_jit

#: Indexes into :attr:`RequestTotals.counts`.
HITS, HIT_TOKENS, NONEMPTY, INPUT_TOKENS, EVICTIONS, PEAK_USED, ADMITTED, REFS = range(8)
#: Columns of :attr:`RequestTotals.cut_sums` (running sums from request 0).
CUT_HITS, CUT_BLOCKS, CUT_EVICTIONS = range(3)


class RequestColumns(NamedTuple):
    """The requests frame's derived columns, one value per request: ``blocks``, ``hit_tokens``,
    ``miss_blocks``, ``miss_tokens`` (``u32``), ``rejected`` and ``measured`` (bool)."""

    blocks: np.ndarray
    hit_tokens: np.ndarray
    miss_blocks: np.ndarray
    miss_tokens: np.ndarray
    rejected: np.ndarray
    measured: np.ndarray

    @classmethod
    def empty(cls, num_requests: int) -> RequestColumns:
        """Uninitialised columns for ``num_requests`` requests (``0`` = none written)."""
        u32 = [np.empty(num_requests, dtype=np.uint32) for _ in range(4)]
        return cls(*u32, np.empty(num_requests, dtype=np.bool_), np.empty(num_requests, dtype=np.bool_))


class RequestTotals(NamedTuple):
    """What :func:`request_pass` sums.

    Attributes:
        counts: ``int64[8]``, indexed by this module's constants: over the measured requests
            (index ≥ ``skip``) the hit blocks, hit tokens, requests with ≥ 1 block, input
            tokens, evictions, admitted requests and block references; ``PEAK_USED`` is the
            most blocks resident after any request (all requests).
        ratio_sum: sum over the measured requests with ≥ 1 block of ``hit_blocks / blocks``.
        cut_sums: ``int64[k, 3]``: at each position ``p`` of ``cuts`` the sums over requests
            ``[0, p)`` of hit blocks, blocks and evictions.
    """

    counts: np.ndarray
    ratio_sum: float
    cut_sums: np.ndarray


def request_pass(offsets: np.ndarray, input_tokens: np.ndarray, block_size: int, skip: int,
                 hit_blocks: np.ndarray, evictions: np.ndarray, used_blocks: np.ndarray, admitted: np.ndarray,
                 cuts: np.ndarray | None = None, columns: RequestColumns | None = None) -> RequestTotals:
    """Totals (and optionally the derived columns) of a replay's per-request arrays.

    A request's hit tokens are ``min(hit_blocks * block_size, input_tokens)`` (the replay's hit
    semantics, :mod:`kvlab.sim.replay`).

    Args:
        offsets: ``int64[n + 1]`` CSR offsets of the requests' blocks.
        input_tokens: ``u32[n]`` (any integer dtype) input tokens per request.
        block_size: tokens per block (≥ 1).
        skip: warm-up requests (the first ``skip`` are not measured), in ``[0, n]``.
        hit_blocks, evictions, used_blocks: ``int32[n]`` kernel outputs; admitted: ``bool[n]``.
        cuts: ``int64[k]`` non-decreasing positions in ``[0, n]`` to record running sums at
            (``None`` = none).
        columns: :class:`RequestColumns` of length ``n`` to fill (``None`` = totals only).

    Returns:
        A :class:`RequestTotals`.

    Raises:
        ValueError: lengths that disagree, ``skip`` outside ``[0, n]`` or ``cuts`` not
            non-decreasing in ``[0, n]``.

    Example:
        >>> t = request_pass(np.array([0, 2, 3]), np.array([30, 10], np.uint32), 16, 0,
        ...                  np.array([1, 1], np.int32), np.zeros(2, np.int32), np.array([2, 3], np.int32),
        ...                  np.ones(2, np.bool_), cuts=np.array([1, 2]))
        >>> int(t.counts[HIT_TOKENS]), t.ratio_sum, t.cut_sums[:, CUT_BLOCKS].tolist()
        (26, 1.5, [2, 3])
    """
    n = offsets.shape[0] - 1
    if any(a.shape[0] != n for a in (input_tokens, hit_blocks, evictions, used_blocks, admitted)):
        raise ValueError(f"per-request arrays must have {n} values (offsets has {n + 1})")
    if not 0 <= skip <= n:
        raise ValueError(f"skip must be in [0, {n}], got {skip}")
    cuts = np.zeros(0, dtype=np.int64) if cuts is None else np.asarray(cuts, dtype=np.int64)
    if cuts.size and (cuts[0] < 0 or cuts[-1] > n or np.any(np.diff(cuts) < 0)):
        raise ValueError(f"cuts must be non-decreasing positions in [0, {n}], got {cuts[:5].tolist()}...")
    if columns is None:
        columns = RequestColumns.empty(0)
    elif any(c.shape[0] != n for c in columns):
        raise ValueError(f"columns must have {n} values each")
    counts = np.zeros(8, dtype=np.int64)
    ratio = np.zeros(1, dtype=np.float64)
    cut_sums = np.zeros((cuts.shape[0], 3), dtype=np.int64)
    _pass(offsets, input_tokens, int(block_size), int(skip), hit_blocks, evictions, used_blocks, admitted, cuts,
          *columns, counts, ratio, cut_sums)
    counts[REFS] = offsets[n] - offsets[skip]
    return RequestTotals(counts, float(ratio[0]), cut_sums)


@kernel_jit(nogil=True, _nrt=False)
def _pass(offsets: np.ndarray, input_tokens: np.ndarray, block_size: int, skip: int, hit_blocks: np.ndarray,
          evictions: np.ndarray, used_blocks: np.ndarray, admitted: np.ndarray, cuts: np.ndarray,
          blocks_out: np.ndarray, hit_tokens_out: np.ndarray, miss_blocks_out: np.ndarray,
          miss_tokens_out: np.ndarray, rejected_out: np.ndarray, measured_out: np.ndarray, counts: np.ndarray,
          ratio: np.ndarray, cut_sums: np.ndarray) -> None:
    n = offsets.shape[0] - 1
    write = blocks_out.shape[0] == n and n > 0
    num_cuts = cuts.shape[0]
    c = 0
    run_hits = 0
    run_blocks = 0
    run_evictions = 0
    peak = 0
    ratio_sum = 0.0
    for r in range(n):
        while c < num_cuts and cuts[c] == r:
            cut_sums[c, 0] = run_hits
            cut_sums[c, 1] = run_blocks
            cut_sums[c, 2] = run_evictions
            c += 1
        blocks = offsets[r + 1] - offsets[r]
        h = np.int64(hit_blocks[r])
        tokens = np.int64(input_tokens[r])
        ht = min(h * block_size, tokens)
        run_hits += h
        run_blocks += blocks
        run_evictions += evictions[r]
        peak = max(peak, np.int64(used_blocks[r]))
        if r >= skip:
            counts[0] += h
            counts[1] += ht
            counts[3] += tokens
            counts[4] += evictions[r]
            if admitted[r]:
                counts[6] += 1
            if blocks > 0:
                counts[2] += 1
                ratio_sum += h / blocks
        if write:
            blocks_out[r] = blocks
            hit_tokens_out[r] = ht
            miss_blocks_out[r] = blocks - h
            miss_tokens_out[r] = tokens - ht
            rejected_out[r] = not admitted[r]
            measured_out[r] = r >= skip
    while c < num_cuts:
        cut_sums[c, 0] = run_hits
        cut_sums[c, 1] = run_blocks
        cut_sums[c, 2] = run_evictions
        c += 1
    counts[5] = peak
    ratio[0] = ratio_sum
