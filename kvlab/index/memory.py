"""The in-memory backend: a bounded two-level LRU, request key → per-key LRU of pod entries.

Models llm-d ``pkg/kvcache/kvblock/in_memory.go`` :: ``InMemoryIndex`` (docs/specs/index_blend.md
§A.3, rule L11) with the contract of :mod:`kvlab.index.base`: the outer LRU holds at most
``size`` request keys, each key at most ``pod_cache_size`` entries; the engine key → request
keys map is its own LRU of ``size`` engine keys. One divergence from llm-d's in-memory backend,
chosen in Part E (choice 3): re-adding an engine key *unions* its request keys with their
positions, as llm-d's Redis backend does, instead of replacing them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator

from kvlab.core.validate import check_positive
from kvlab.index.base import Index, entry_sort_key
from kvlab.index.types import ENGINE_KEY, KNOWN_TIERS, PodEntry

#: llm-d ``defaultInMemoryIndexSize``: request keys (and engine keys) the index holds at most.
DEFAULT_INDEX_SIZE = 100_000_000
#: llm-d ``defaultPodsPerKey``: entries one request key holds at most.
DEFAULT_POD_CACHE_SIZE = 10


def sorted_request_keys(positions: dict[int, int]) -> list[int]:
    """Request keys of one engine key by ascending ``(position, decimal string)``: the order of
    a Redis sorted set with ``score = position`` (``ZRANGE`` orders equal scores by member).

    Example:
        >>> sorted_request_keys({5001: 1, 5000: 0, 10: 1})
        [5000, 10, 5001]
    """
    return sorted(positions, key=lambda key: (positions[key], str(key)))


class InMemoryIndex(Index):
    """A bounded two-level LRU index (llm-d in-memory backend, rules L4-L11).

    Lookup and evict promote the keys they visit (an LRU get); clear scans without
    promoting (a peek). Adding a key beyond ``size`` drops the least recently used key
    (its engine mappings stay and resolve to nothing, as in llm-d); adding an entry beyond
    ``pod_cache_size`` drops the least recently added entry of that key (rule L11, T-L15).
    Re-adding an entry refreshes its recency.

    Args:
        size: request keys held at most, and engine keys mapped at most (default 1e8).
        pod_cache_size: entries per request key at most (default 10).
        tiers: the tier names entries may carry (see :class:`~kvlab.index.Index`).

    Raises:
        ValueError: ``size`` or ``pod_cache_size`` not an integer > 0 (the message names the
            field); bad ``tiers``.

    Example:
        >>> from kvlab.index.types import PodEntry
        >>> index = InMemoryIndex(size=2)
        >>> for engine_key, request_key in [(1, 10), (2, 20), (3, 30)]:
        ...     index.add([engine_key], [request_key], [PodEntry("pod-a")])
        >>> sorted(index.lookup([10, 20, 30], stop="never")), index.lookup([10, 20, 30])
        ([20, 30], {})
        >>> index = InMemoryIndex(pod_cache_size=2)
        >>> index.add([4], [40, 41], [PodEntry("pod-a"), PodEntry("pod-b"), PodEntry("pod-c")])
        >>> index.add([4], [42, 43], [PodEntry("pod-b", "cpu")])   # union, not replace
        >>> index.pod_tier_counts(), [index.get_request_key(4)]
        ({'pod-b': {'cpu': 2, 'gpu': 2}, 'pod-c': {'gpu': 2}}, [43])
    """

    def __init__(self, *, size: int = DEFAULT_INDEX_SIZE, pod_cache_size: int = DEFAULT_POD_CACHE_SIZE,
                 tiers: Iterable[str] = KNOWN_TIERS) -> None:
        self.size = check_positive("size", size)
        self.pod_cache_size = check_positive("pod_cache_size", pod_cache_size)
        super().__init__(tiers=tiers)
        # request key -> its entries (a dict in insertion order), least recently used first (both levels)
        self._data: OrderedDict[int, dict[PodEntry, None]] = OrderedDict()
        # request key -> its entries sorted by entry_sort_key; filled by lookup, dropped when the entries change
        self._sorted: dict[int, tuple[PodEntry, ...]] = {}
        # engine key -> {request key: position}, least recently used engine key first
        self._engine: OrderedDict[int, dict[int, int]] = OrderedDict()

    def _add(self, triples: list[tuple[int, int, int]] | None, request_keys: list[int], entries: list[PodEntry],
             parent: int | None) -> None:  # noqa: ARG002 - the Index contract's signature; a flat index keeps no parents
        data, engine, cached = self._data, self._engine, self._sorted
        for engine_key, request_key, position in triples or ():
            positions = engine.get(engine_key)
            if positions is None:
                positions = engine[engine_key] = {}
                if len(engine) > self.size:
                    engine.popitem(last=False)
            else:
                engine.move_to_end(engine_key)
            positions[request_key] = position
        fresh = entries[-self.pod_cache_size:]  # what adding them one by one leaves in a new key
        for key in request_keys:
            held = data.get(key)
            if held is None:
                data[key] = dict.fromkeys(fresh)
                if len(data) > self.size:
                    cached.pop(data.popitem(last=False)[0], None)
                continue
            data.move_to_end(key)
            for entry in entries:
                if entry in held:
                    del held[entry]  # re-inserted below: the most recently added
                    held[entry] = None
                else:
                    held[entry] = None
                    if len(held) > self.pod_cache_size:
                        del held[next(iter(held))]
                    cached.pop(key, None)

    def _lookup(self, request_keys: list[int], pods: frozenset[str] | None,
                stop_at_miss: bool) -> dict[int, tuple[PodEntry, ...]]:
        data, cached = self._data, self._sorted
        found: dict[int, tuple[PodEntry, ...]] = {}
        for key in request_keys:
            held = data.get(key)
            if held is not None:
                data.move_to_end(key)
                ordered = cached.get(key)
                if ordered is None:
                    ordered = cached[key] = tuple(sorted(held, key=entry_sort_key))
                kept = ordered if pods is None else tuple(e for e in ordered if e.pod in pods)
                if kept:
                    found[key] = kept
                    continue
            if stop_at_miss:
                break
        return found

    def _evict(self, key: int, key_type: str, entries: list[PodEntry]) -> None:
        if key_type == ENGINE_KEY:
            positions = self._engine.get(key)
            if positions is None:
                return
            self._engine.move_to_end(key)
            request_keys = list(positions)
        else:
            request_keys = [key]
        data = self._data
        for request_key in request_keys:
            held = data.get(request_key)
            if held is None:
                continue
            data.move_to_end(request_key)
            for entry in entries:
                if entry in held:
                    del held[entry]
                    self._sorted.pop(request_key, None)
            if not held:
                del data[request_key]
        if key_type == ENGINE_KEY and not any(request_key in data for request_key in request_keys):
            del self._engine[key]

    def _clear(self, pod: str, tier: str | None) -> None:
        emptied = []
        for key, held in self._data.items():  # a peek: iteration does not reorder
            doomed = [e for e in held if e.pod == pod and (tier is None or e.tier == tier)]
            if doomed:
                for entry in doomed:
                    del held[entry]
                self._sorted.pop(key, None)
                if not held:
                    emptied.append(key)
        for key in emptied:
            del self._data[key]

    def _request_keys_of(self, engine_key: int) -> list[int]:
        positions = self._engine.get(engine_key)
        if not positions:
            return []
        self._engine.move_to_end(engine_key)  # an LRU get, as llm-d's GetRequestKey
        return sorted_request_keys(positions)

    def _items(self) -> Iterator[tuple[int, Iterable[PodEntry]]]:
        return iter(self._data.items())
