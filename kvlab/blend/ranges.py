"""What a lookup does with the matches of :meth:`~kvlab.blend.matcher.TokenRangeMatcher.match`.

Models LMCache's blend lookup helpers (docs/specs/index_blend.md D.3, B16-B19):

- :func:`unique_token_coverage` (B16): query tokens covered by the union of the matches, so
  overlapping windows are not counted twice in hit statistics;
- :func:`leftmost_non_overlapping` (B17): the matches a lookup can load, greedy leftmost,
  after dropping those inside the prefix already served by the prefix path (dropped FIRST:
  a prefix-covered match must not shadow a usable one);
- :func:`group_consecutive` (B18): runs of matches that tile the query back to back (one
  storage prefetch per run in the older lookup);
- :func:`prefix_run_tokens` and :func:`classify` (B19): prefix hits (the contiguous run of
  position-aligned hits from token 0), aligned non-prefix hits (``old_st == cur_st`` past a
  break: no re-RoPE) and shifted hits (``old_st != cur_st``: need positional re-encoding).

All take any sequence of :class:`~kvlab.blend.matcher.BlendMatch` (any order: they sort by
``cur_st`` where order matters, stably) and never mutate it.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvlab.blend.matcher import BlendMatch
from kvlab.core.validate import check_count

#: The classes of :func:`classify`.
HIT_CLASSES = ("prefix", "aligned", "shifted")


def _check_prefix(prefix_tokens: int) -> int:
    return check_count("prefix_tokens", prefix_tokens)


def unique_token_coverage(matches: Sequence[BlendMatch]) -> int:
    """Tokens covered by the union of the matches' ``[cur_st, cur_ed)`` intervals (B16).

    Example:
        >>> unique_token_coverage([BlendMatch(0, 4, 0, 4, 1), BlendMatch(0, 4, 2, 6, 2)])
        6
    """
    covered, end = 0, None
    for m in sorted(matches, key=lambda m: m.cur_st):
        if end is None or m.cur_st > end:
            covered += m.cur_ed - m.cur_st
            end = m.cur_ed
        elif m.cur_ed > end:
            covered += m.cur_ed - end
            end = m.cur_ed
    return covered


def leftmost_non_overlapping(matches: Sequence[BlendMatch], prefix_tokens: int = 0) -> list[BlendMatch]:
    """The matches a lookup keeps: none starting inside the prefix, then greedy leftmost (B17).

    Matches with ``cur_st < prefix_tokens`` are dropped first; the rest, by ``cur_st``
    (stable), are kept when they start at or after the end of the last kept one.

    Args:
        matches: any order.
        prefix_tokens: query tokens ``[0, prefix_tokens)`` already served by the prefix path (an int or
            numpy integer >= 0).

    Raises:
        ValueError: ``prefix_tokens`` negative or not an integer.

    Example:
        >>> ms = [BlendMatch(0, 4, 0, 4, 1), BlendMatch(0, 4, 2, 6, 2), BlendMatch(4, 8, 4, 8, 3)]
        >>> [m.storage_key for m in leftmost_non_overlapping(ms)]
        [1, 3]
        >>> [m.storage_key for m in leftmost_non_overlapping(ms, prefix_tokens=4)]
        [3]
    """
    prefix = _check_prefix(prefix_tokens)
    kept: list[BlendMatch] = []
    end = prefix
    for m in sorted((m for m in matches if m.cur_st >= prefix), key=lambda m: m.cur_st):
        if m.cur_st >= end:
            kept.append(m)
            end = m.cur_ed
    return kept


def group_consecutive(matches: Sequence[BlendMatch]) -> list[list[BlendMatch]]:
    """Runs of matches, by ``cur_st``, in which each starts where the previous one ends (B18).

    Example:
        >>> ms = [BlendMatch(0, 4, 10, 14, 3), BlendMatch(0, 4, 0, 4, 1), BlendMatch(4, 8, 4, 8, 2)]
        >>> groups = group_consecutive(ms)
        >>> [[(m.cur_st, m.cur_ed) for m in g] for g in groups]
        [[(0, 4), (4, 8)], [(10, 14)]]
    """
    groups: list[list[BlendMatch]] = []
    for m in sorted(matches, key=lambda m: m.cur_st):
        if groups and groups[-1][-1].cur_ed == m.cur_st:
            groups[-1].append(m)
        else:
            groups.append([m])
    return groups


def prefix_run_tokens(matches: Sequence[BlendMatch]) -> int:
    """Length of the prefix hit run (B19): ``[0, e)`` tiled by position-aligned matches (``old_st == cur_st``)
    from token 0, each starting where the previous one ends; 0 when no aligned match starts at 0.

    This is what a chain walk over chunk keys from chunk 0 would serve (LMCache's prefix path).

    Example:
        >>> prefix_run_tokens([BlendMatch(0, 4, 0, 4, 1), BlendMatch(4, 8, 4, 8, 2), BlendMatch(12, 16, 12, 16, 3)])
        8
    """
    aligned: dict[int, BlendMatch] = {}
    for m in matches:
        if m.old_st == m.cur_st:
            aligned.setdefault(m.cur_st, m)
    end = 0
    while end in aligned and aligned[end].cur_ed > end:
        end = aligned[end].cur_ed
    return end


def classify(match: BlendMatch, prefix_tokens: int = 0) -> str:
    """``"prefix"``, ``"aligned"`` or ``"shifted"`` (B19).

    - ``"prefix"``: ``old_st == cur_st`` and the match ends within ``prefix_tokens`` (pass
      :func:`prefix_run_tokens` of the query's matches: the contiguous aligned run from 0);
    - ``"aligned"``: ``old_st == cur_st`` past that run (reusable without re-RoPE);
    - ``"shifted"``: ``old_st != cur_st`` (needs positional re-encoding).

    Raises:
        ValueError: ``prefix_tokens`` negative or not an integer.

    Example:
        >>> ms = [BlendMatch(0, 4, 0, 4, 1), BlendMatch(8, 12, 8, 12, 2), BlendMatch(0, 4, 12, 16, 3)]
        >>> [classify(m, prefix_run_tokens(ms)) for m in ms]
        ['prefix', 'aligned', 'shifted']
    """
    prefix = _check_prefix(prefix_tokens)
    if match.old_st != match.cur_st:
        return "shifted"
    return "prefix" if match.cur_ed <= prefix else "aligned"
