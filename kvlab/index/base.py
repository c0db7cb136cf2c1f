"""The :class:`Index` contract every backend keeps: add, lookup, evict, clear, speculative TTLs.

Models llm-d ``pkg/kvcache/kvblock/index.go`` :: ``Index`` (docs/specs/index_blend.md §A.2,
rules L4-L10, L16). The public methods validate their input here, once, and call a
backend's primitives (``_add``, ``_lookup``, ``_evict``, ``_clear``, ``_request_keys_of``,
``_items``), so every backend raises the same errors and keeps the same rules:

* ``add`` maps engine keys onto request keys by their count ratio (rule L5,
  :func:`kvlab.hashing.llmd_hash.map_engine_to_request_keys`) and adds every entry to every
  request key. Re-adding an engine key *unions* its request keys (Part E choice 3, as
  llm-d's Redis backend does); :meth:`Index.get_request_key` gives the one mapped at the
  highest position (rule L6; ties: the larger key's decimal string, Redis's order).
* ``evict`` by engine key removes the exact entries (rule L7) from each of its request
  keys and drops the engine mapping only once none of them has an entry left.
* ``lookup`` stops at the first key without a (filtered) entry by default (Part E
  choice 1: Redis, Dynamo and Opal do; ``stop="never"`` is llm-d's in-memory scan).
  Scores use consecutive keys only (:mod:`kvlab.index.scorers`), so they do not depend
  on the choice.
"""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence

from kvlab.core.validate import check_choice, check_real, check_str, check_u64
from kvlab.hashing.llmd_hash import check_key_counts, map_engine_to_request_keys
from kvlab.index.types import (
    DEFAULT_TIER,
    KEY_TYPES,
    KNOWN_TIERS,
    REQUEST_KEY,
    PodEntry,
    check_entries,
    check_keys,
)

#: ``stop`` of :meth:`Index.lookup`: at the first key without an entry, or never (skip it).
LOOKUP_STOPS = ("first_miss", "never")
#: Seconds a speculative entry lives by default (llm-d scheduler ``defaultSpeculativeTTL``, rule L16).
DEFAULT_SPECULATIVE_TTL_S = 2.0


def entry_sort_key(entry: PodEntry) -> tuple:
    """A total order over entries (``group=None`` first), for deterministic outputs."""
    return entry.pod, entry.tier, entry.speculative, -1 if entry.group is None else entry.group


def engine_mapping(engine_keys: list[int], request_keys: list[int]) -> list[tuple[int, int, int]]:
    """``(engine key, request key, position)`` triples of llm-d's length-ratio loop (rule L5):
    with ``n = max(|E|, |R|)``, position ``i`` pairs ``E[i*|E|//n]`` with ``R[i*|R|//n]``.

    Raises:
        ValueError: a key that is not a u64; the counts are not an integral ratio (they must
            cover the same tokens).

    Example:
        >>> engine_mapping([500], [5000, 5001])
        [(500, 5000, 0), (500, 5001, 1)]
    """
    map_engine_to_request_keys(engine_keys, request_keys)  # checks the keys and the ratio
    return _positions(engine_keys, request_keys)


def _positions(engine_keys: list[int], request_keys: list[int]) -> list[tuple[int, int, int]]:
    """:func:`engine_mapping` of checked keys."""
    n_e, n_r = len(engine_keys), len(request_keys)
    if n_e == n_r:
        return list(zip(engine_keys, request_keys, range(n_e)))
    check_key_counts(n_e, n_r)
    n = max(n_e, n_r)
    return [(engine_keys[i * n_e // n], request_keys[i * n_r // n], i) for i in range(n)]


class Index(ABC):
    """A cluster-global KV block index: request key → the pod entries holding that block.

    Models llm-d's ``Index`` interface (rules L4-L10, L16); see the module docstring for
    the choices where backends upstream disagree. Subclasses implement the primitives;
    this class validates input and keeps speculative entries' TTLs on a logical clock.

    Args:
        tiers: the tier names entries may carry (lower-case, each once); an entry with
            another tier raises ``ValueError``. Default :data:`~kvlab.index.types.KNOWN_TIERS`.

    Example (with the in-memory backend):
        >>> from kvlab.index import InMemoryIndex, PodEntry
        >>> index = InMemoryIndex()
        >>> index.add([100, 200], [1000, 2000], [PodEntry("pod-a")])
        >>> index.lookup([1000, 2000, 3000])
        {1000: (PodEntry(pod='pod-a', tier='gpu', speculative=False, group=None),),
         2000: (PodEntry(pod='pod-a', tier='gpu', speculative=False, group=None),)}
        >>> index.evict(200, "engine", [PodEntry("pod-a")])
        >>> list(index.lookup([1000, 2000])), index.get_request_key(200)
        ([1000], None)
    """

    def __init__(self, *, tiers: Iterable[str] = KNOWN_TIERS) -> None:
        if isinstance(tiers, str):
            raise ValueError(f"tiers must be a collection of tier names, got the string {tiers!r}")
        names = tuple(tiers)
        for name in names:
            if check_str("tier name", name, nonempty=True) != name.lower():
                raise ValueError(f"tier names must be lower-case, got {name!r}")
        if not names:
            raise ValueError("tiers must name at least one tier")
        repeated = next((name for i, name in enumerate(names) if name in names[:i]), None)
        if repeated is not None:
            raise ValueError(f"tiers lists {repeated!r} twice, got {list(names)}")
        self.tiers = names
        self._speculative: list[tuple[float, int, int, PodEntry]] = []  # heap: (expiry, seq, key, entry)
        self._speculative_seq = 0

    # ---- public contract -------------------------------------------------------------
    def add(self, engine_keys: Sequence[int] | None, request_keys: Sequence[int], entries: Sequence[PodEntry], *,
            parent: int | None = None) -> None:
        """Add every entry to every request key; map engine keys onto request keys (rule L5).

        Args:
            engine_keys: the engine keys of the same blocks (u64), or ``None`` to write
                no mapping (speculative entries, tier updates; rule L4).
            request_keys: u64 request keys, in block order, non-empty.
            entries: the pod entries, non-empty; tiers among :attr:`tiers`.
            parent: the request key of the block before ``request_keys[0]`` when the
                caller knows it (a stored event's resolved parent); only
                :class:`~kvlab.index.RadixIndex` uses it (it rejects a store whose parent
                the pod does not hold, Dynamo rule D3).

        Raises:
            ValueError: empty ``request_keys`` or ``entries``, a key that is not a u64 or
                is 0, an unknown tier, engine and request counts that are not an integral
                ratio. Nothing is added then.
        """
        keys = check_keys("request_keys", request_keys)
        checked = check_entries(entries, self.tiers)
        triples = None if engine_keys is None else _positions(check_keys("engine_keys", engine_keys), keys)
        if parent is not None:
            parent = check_u64("parent", parent)
        self._add(triples, keys, checked, parent)

    def lookup(self, request_keys: Sequence[int], pods: Iterable[str] | None = None, *,
               stop: str = "first_miss") -> dict[int, tuple[PodEntry, ...]]:
        """The entries of each request key, filtered to ``pods`` (``None`` or empty: all).

        Args:
            request_keys: u64 keys in block order, non-empty.
            pods: pod identifiers to keep, or ``None`` / empty for every pod (rule L9).
            stop: ``"first_miss"`` (stop at the first key with no entry after filtering;
                the result is a prefix) or ``"never"`` (skip such keys, as llm-d's
                in-memory backend; rule L10).

        Returns:
            ``{request key: entries}`` in key order, entries sorted by
            :func:`entry_sort_key`; keys without entries are absent.

        Raises:
            ValueError: empty ``request_keys``, a bad key, ``pods`` a string or holding a
                non-string, an unknown ``stop``.
        """
        keys = check_keys("request_keys", request_keys)
        check_choice("stop", stop, LOOKUP_STOPS)
        return self._lookup(keys, _check_pods(pods), stop == "first_miss")

    def evict(self, key: int, key_type: str, entries: Sequence[PodEntry]) -> None:
        """Remove the exact ``entries`` (whole-tuple match, rule L2) from a block.

        ``key_type="engine"``: from every request key mapped to engine key ``key`` (an
        unknown engine key is a no-op); the mapping is dropped once none of them has an
        entry left (a CPU copy keeps it alive, rule L7). ``key_type="request"``: from
        that request key (speculative entries). A key left without entries is deleted.

        Raises:
            ValueError: a bad key, an unknown ``key_type``, empty ``entries``, an unknown tier.
        """
        key = check_u64("key", key)
        check_choice("key_type", key_type, KEY_TYPES)
        self._evict(key, key_type, check_entries(entries, self.tiers))

    def clear(self, pod: str, tier: str | None = None) -> None:
        """Remove every entry of ``pod`` (all tiers, groups and speculative variants, rule
        L8), or only those in ``tier``. Engine mappings stay (they resolve to nothing).

        Raises:
            ValueError: an empty or non-string pod, an unknown tier.
        """
        _check_pods([pod])
        if tier is not None and tier not in self.tiers:
            raise ValueError(f"unknown tier {tier!r}; this index knows {sorted(self.tiers)}")
        self._clear(pod, tier)

    def get_request_key(self, engine_key: int) -> int | None:
        """The request key mapped to ``engine_key`` at the highest position (rule L6), or
        ``None`` when it is unmapped (a miss, not an error).

        Raises:
            ValueError: ``engine_key`` is not a u64.
        """
        keys = self._request_keys_of(check_u64("engine_key", engine_key))
        return keys[-1] if keys else None

    def add_speculative(self, request_keys: Sequence[int], pod: str, now_s: float, *,
                        ttl_s: float = DEFAULT_SPECULATIVE_TTL_S, tier: str = DEFAULT_TIER) -> PodEntry:
        """Add a speculative entry of ``pod`` to every request key, expiring at
        ``now_s + ttl_s`` on the caller's logical clock (rule L16; see :meth:`expire`).

        Returns:
            The entry added.

        Raises:
            ValueError: as :meth:`add`; ``now_s`` or ``ttl_s`` not finite, ``ttl_s < 0``.
        """
        now_s, ttl_s = check_real("now_s", now_s, low=0.0), check_real("ttl_s", ttl_s, low=0.0)
        entry = PodEntry(pod, tier, speculative=True)
        keys = check_keys("request_keys", request_keys)
        self.add(None, keys, [entry])
        for key in keys:
            heapq.heappush(self._speculative, (now_s + ttl_s, self._speculative_seq, key, entry))
            self._speculative_seq += 1
        return entry

    def expire(self, now_s: float) -> int:
        """Evict (by request key) every speculative entry whose TTL ends at or before
        ``now_s``; returns how many (key, entry) pairs expired.

        Raises:
            ValueError: ``now_s`` not a finite number.
        """
        now_s = check_real("now_s", now_s)
        expired = 0
        while self._speculative and self._speculative[0][0] <= now_s:
            _, _, key, entry = heapq.heappop(self._speculative)
            self._evict(key, REQUEST_KEY, [entry])
            expired += 1
        return expired

    # ---- views --------------------------------------------------------------------------
    def items(self) -> Iterator[tuple[int, tuple[PodEntry, ...]]]:
        """Every request key with its entries (sorted), in no particular key order."""
        for key, entries in self._items():
            if entries:
                yield key, tuple(sorted(entries, key=entry_sort_key))

    def pod_keys(self, pod: str, tier: str | None = None, *, speculative: bool = False) -> set[int]:
        """The request keys holding an entry of ``pod`` (in ``tier``, or any tier);
        speculative entries only when ``speculative``."""
        return {key for key, entries in self._items() for e in entries
                if e.pod == pod and (tier is None or e.tier == tier) and (speculative or not e.speculative)}

    def pod_tier_counts(self) -> dict[str, dict[str, int]]:
        """``{pod: {tier: request keys holding a confirmed entry}}``, pods and tiers sorted."""
        counts: dict[str, dict[str, set[int]]] = {}
        for key, entries in self._items():
            for e in entries:
                if not e.speculative:
                    counts.setdefault(e.pod, {}).setdefault(e.tier, set()).add(key)
        return {pod: {tier: len(keys) for tier, keys in sorted(tiers.items())} for pod, tiers in sorted(counts.items())}

    # ---- backend primitives ------------------------------------------------------------
    @abstractmethod
    def _add(self, triples: list[tuple[int, int, int]] | None, request_keys: list[int], entries: list[PodEntry],
             parent: int | None) -> None:
        """Add ``entries`` to every key; record the ``(engine, request, position)`` triples."""

    @abstractmethod
    def _lookup(self, request_keys: list[int], pods: frozenset[str] | None,
                stop_at_miss: bool) -> dict[int, tuple[PodEntry, ...]]:
        """As :meth:`lookup`, input checked (``pods`` ``None`` = all)."""

    @abstractmethod
    def _evict(self, key: int, key_type: str, entries: list[PodEntry]) -> None:
        """As :meth:`evict`, input checked."""

    @abstractmethod
    def _clear(self, pod: str, tier: str | None) -> None:
        """As :meth:`clear`, input checked."""

    @abstractmethod
    def _request_keys_of(self, engine_key: int) -> list[int]:
        """The request keys mapped to ``engine_key``, by ascending (position, decimal string)."""

    @abstractmethod
    def _items(self) -> Iterator[tuple[int, Iterable[PodEntry]]]:
        """Every request key with its entries (possibly empty)."""


def _check_pods(pods: Iterable[str] | None) -> frozenset[str] | None:
    if pods is None:
        return None
    if isinstance(pods, (str, bytes)):
        raise ValueError(f"pods must be a collection of pod identifiers, got the string {pods!r}")
    checked = frozenset(pods)
    for pod in checked:
        check_str("pod identifier", pod, nonempty=True)
    return checked or None
