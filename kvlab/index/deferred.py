"""Stores held back for a parent the index does not know yet (the ``unknown_parent="defer"`` mode).

llm-d skips a ``BlockStored`` whose parent engine key does not resolve (rule L19), and with
it every later store that chains from the skipped blocks. :class:`~kvlab.index.EventIngestor`
keeps that rule by default; with ``unknown_parent="defer"`` it hands such a store to a
:class:`DeferredStores` instead, which holds it until a store maps the missing parent engine
key, then gives it back to be applied (and its own held children after it).

Applied late, a held store must leave the index as if it had been applied on arrival and
the pod's later events after it. So the holder also keeps what happened to the store's blocks
in the meantime: a ``BlockRemoved`` of one of its engine keys (same pod entry) is noted and
evicted right after the late add — unless a later store of that pod entry added the key
again, which cancels the note. ``AllBlocksCleared`` (and a publisher restart) drops the
pod's held stores; a full holder drops its oldest store. Each fate is counted by the
ingestor (:class:`~kvlab.index.IngestStats`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from kvlab.core.validate import check_positive
from kvlab.events.types import BlockStored
from kvlab.index.types import PodEntry

#: Stores a :class:`DeferredStores` holds at most by default.
DEFAULT_MAX_DEFERRED = 10_000


@dataclass
class HeldStore:
    """One ``BlockStored`` waiting for its parent engine key to be mapped.

    Attributes:
        pod: the publishing pod.
        seq: the sequence number of the batch it came in.
        event_index: its 0-based position in that batch.
        entry: the pod entry it adds (pod, tier, group).
        event: the store.
        model: the model salted into the chain root (``None``: the hasher's).
        parent: the engine key it waits for.
        engine_keys: its engine keys (u64).
        removed: those of its engine keys a later ``BlockRemoved`` of the same entry named,
            not added again since.
    """

    pod: str
    seq: int
    event_index: int
    entry: PodEntry
    event: BlockStored
    model: str | None
    parent: int
    engine_keys: tuple[int, ...]
    removed: set[int] = field(default_factory=set)


class DeferredStores:
    """Held stores by arrival, indexed by the parent they wait for and by their engine keys.

    Args:
        max_stores: stores held at most; holding one more drops the oldest (≥ 1).

    Raises:
        ValueError: ``max_stores`` not an integer ≥ 1.

    Example:
        >>> from kvlab.events import BlockStored
        >>> held = DeferredStores(max_stores=1)
        >>> child = BlockStored([12], 11, [5, 6, 7, 8], 4, None, "GPU", None)
        >>> held.hold(HeldStore("pod-a", 0, 0, PodEntry("pod-a"), child, None, 11, (12,)))
        []
        >>> held.note_removed(12, PodEntry("pod-a"))
        >>> [(h.engine_keys, h.removed) for h in held.release(11)], len(held)
        ([((12,), {12})], 0)
    """

    def __init__(self, max_stores: int = DEFAULT_MAX_DEFERRED) -> None:
        self.max_stores = check_positive("max_stores", max_stores)
        self._held: dict[int, HeldStore] = {}  # by arrival number, oldest first
        self._by_parent: dict[int, list[int]] = {}
        self._by_key: dict[int, set[int]] = {}
        self._next = 0

    def __len__(self) -> int:
        return len(self._held)

    def held(self) -> list[HeldStore]:
        """The stores held now, oldest first."""
        return list(self._held.values())

    def hold(self, store: HeldStore) -> list[HeldStore]:
        """Hold ``store``; the stores dropped to make room (the oldest), if any.

        Holding a store also cancels earlier removal notes of its keys for its entry (the pod
        stored them again).
        """
        self.note_stored(store.engine_keys, store.entry)
        number = self._next
        self._next += 1
        self._held[number] = store
        self._by_parent.setdefault(store.parent, []).append(number)
        for key in store.engine_keys:
            self._by_key.setdefault(key, set()).add(number)
        dropped = []
        while len(self._held) > self.max_stores:
            dropped.append(self._drop(next(iter(self._held))))
        return dropped

    def release(self, parent: int) -> list[HeldStore]:
        """Take out the stores waiting for ``parent``, oldest first."""
        return [self._drop(n) for n in self._by_parent.pop(parent, ()) if n in self._held]

    def note_removed(self, key: int, entry: PodEntry) -> None:
        """A ``BlockRemoved`` of ``key`` for ``entry``: note it in the held stores of that entry."""
        for number in self._by_key.get(key, ()):
            store = self._held[number]
            if store.entry == entry:
                store.removed.add(key)

    def note_stored(self, keys: Iterable[int], entry: PodEntry) -> None:
        """A store of ``keys`` for ``entry``: cancel the earlier removal notes of those keys."""
        for key in keys:
            for number in self._by_key.get(key, ()):
                store = self._held[number]
                if store.entry == entry:
                    store.removed.discard(key)

    def drop_pod(self, pod: str, tier: str | None = None) -> list[HeldStore]:
        """Take out every store of ``pod`` (in ``tier``, or any tier), oldest first."""
        doomed = [n for n, s in self._held.items() if s.pod == pod and (tier is None or s.entry.tier == tier)]
        return [self._drop(n) for n in doomed]

    def _drop(self, number: int) -> HeldStore:
        store = self._held.pop(number)
        for key in store.engine_keys:
            numbers = self._by_key.get(key)
            if numbers is not None:
                numbers.discard(number)
                if not numbers:
                    del self._by_key[key]
        waiting = self._by_parent.get(store.parent)
        if waiting is not None and all(n not in self._held for n in waiting):
            del self._by_parent[store.parent]
        return store
