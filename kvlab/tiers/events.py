"""What a tiered store publishes: tier events, and their vLLM KV-event form.

Every state change of a :class:`~kvlab.tiers.store.TieredStore` is one
:class:`TierEvent`, in order; :func:`to_kv_events` maps them to
:mod:`kvlab.events` objects with ``medium`` = the tier's name, as vLLM's offloading
connector, SGLang HiCache and Dynamo KVBM report tiers (docs/specs/engines.md §2.2,
§4.1 K5):

==========  ===================================================  ==========================
kind        state change                                         KV events
==========  ===================================================  ==========================
stored      computed blocks written into ``tier``                ``BlockStored(tier)``
copied      blocks copied from ``tier`` into ``to_tier``         ``BlockStored(to_tier)``
moved       blocks moved from ``tier`` to ``to_tier``            ``BlockRemoved(tier)``,
            (demotion on eviction, exclusive promotion)          ``BlockStored(to_tier)``
removed     blocks evicted or invalidated in ``tier``            ``BlockRemoved(tier)``
cleared     a reset of ``tier`` (the unpinned blocks)            ``BlockRemoved(tier)``
==========  ===================================================  ==========================

A stored event carries no tokens: to an llm-d-style index a store with engine keys and
no tokens is a tier update (docs/specs/index_blend.md L17). vLLM's ``AllBlocksCleared``
names no tier, so a reset scoped to one tier is published as the removal of that tier's
blocks, which an index applies to that tier only; :meth:`TieredStore.reset` of every
tier at once with nothing pinned publishes one ``AllBlocksCleared``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kvlab.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent

#: The kinds of :class:`TierEvent`.
TIER_EVENT_KINDS = ("stored", "copied", "moved", "removed", "cleared", "all_cleared")


@dataclass(frozen=True)
class TierEvent:
    """One state change of a tiered store.

    Attributes:
        kind: one of :data:`TIER_EVENT_KINDS` (``all_cleared``: every tier reset).
        tier: the tier the blocks are in (or leave); ``""`` for ``all_cleared``.
        keys: the blocks' keys (u64), in the order they changed.
        to_tier: the destination of ``copied`` / ``moved``, else ``None``.

    Example:
        >>> TierEvent("moved", "GPU", (7,), "CPU").to_kv_events(block_size=16)[0].medium
        'GPU'
    """

    kind: str
    tier: str
    keys: tuple[int, ...]
    to_tier: str | None = None

    def to_kv_events(self, block_size: int) -> list[KVEvent]:
        """This change as vLLM KV events (see the module table)."""
        def stored(medium: str) -> BlockStored:
            return BlockStored(block_hashes=list(self.keys), parent_block_hash=None, token_ids=[],
                               block_size=block_size, lora_id=None, medium=medium, lora_name=None)

        if self.kind == "all_cleared":
            return [AllBlocksCleared()]
        if self.kind == "stored":
            return [stored(self.tier)]
        if self.kind == "copied":
            return [stored(self.to_tier)]
        if self.kind == "moved":
            return [BlockRemoved(block_hashes=list(self.keys), medium=self.tier), stored(self.to_tier)]
        return [BlockRemoved(block_hashes=list(self.keys), medium=self.tier)]


def to_kv_events(events: Iterable[TierEvent], block_size: int) -> list[KVEvent]:
    """Map tier events to vLLM KV events, in order (empty key lists are skipped).

    Example:
        >>> evs = to_kv_events([TierEvent("stored", "GPU", (1, 2)), TierEvent("removed", "GPU", ())], 16)
        >>> [type(e).__name__ for e in evs]
        ['BlockStored']
    """
    out: list[KVEvent] = []
    for event in events:
        if event.keys or event.kind == "all_cleared":
            out += event.to_kv_events(block_size)
    return out


def merge_runs(events: Iterable[TierEvent]) -> list[TierEvent]:
    """Consecutive events of one kind between the same tiers as one event (keys in order): the
    same state changes in the same order, in fewer messages (a store changes one block at a time).

    Example:
        >>> merge_runs([TierEvent("stored", "CPU", (1,)), TierEvent("stored", "CPU", (2,)),
        ...             TierEvent("removed", "CPU", (1,))])[0].keys
        (1, 2)
    """
    out: list[TierEvent] = []
    for event in events:
        last = out[-1] if out else None
        if (last is not None and event.kind != "all_cleared" and (last.kind, last.tier, last.to_tier)
                == (event.kind, event.tier, event.to_tier)):
            out[-1] = TierEvent(last.kind, last.tier, last.keys + event.keys, last.to_tier)
        else:
            out.append(event)
    return out


def apply_kv_events(view: dict[str, set[int]], events: Iterable[KVEvent]) -> dict[str, set[int]]:
    """A minimal event consumer: per medium, the set of block keys the events say are
    there (what an index fed by the events sees). Updates ``view`` in place and returns it.

    Example:
        >>> apply_kv_events({}, [BlockStored([1, 2], None, [], 16, None, "GPU", None), BlockRemoved([1], "GPU")])
        {'GPU': {2}}
    """
    for event in events:
        if isinstance(event, AllBlocksCleared):
            view.clear()
        elif isinstance(event, BlockStored):
            view.setdefault(event.medium or "GPU", set()).update(event.block_keys_u64())
        else:
            view.setdefault(event.medium or "GPU", set()).difference_update(event.block_keys_u64())
    return view
