"""One tier of a :class:`~kvlab.tiers.store.TieredStore`: a capacity, an eviction policy
from :mod:`kvlab.policies`, pins, and counters that always balance.

The tier enforces its capacity itself: before a block is inserted into a full tier it
asks the policy for a victim (``evict()``, the choice the policy would make for a new
block). Pinned blocks — held by a running request — are taken out of the policy while
pinned, so they are never chosen, and return to it (as just accessed) when the last pin
is released; they still count against the capacity. So ``resident = policy + pinned``
and ``resident <= capacity`` always.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from kvlab.core.validate import check_count
from kvlab.policies import get_policy
from kvlab.tiers.types import TierSpec


@dataclass
class TierCounters:
    """Per-tier block counters (multiply by the block's bytes for bytes).

    Invariants (checked by :meth:`Tier.check`): ``resident = written - removed`` and
    ``removed = evicted + promoted_out + cleared + dropped``; ``demoted_out <= evicted``.

    Attributes:
        queried_blocks: blocks this tier was asked about (a lower tier is asked about
            the rest of a request from the first block the tiers above did not hold).
        hit_blocks: blocks this tier answered.
        read_blocks: blocks read from this tier (served to a request, or copied up).
        written_blocks: blocks inserted (computed and stored, written through, demoted
            in, promoted in).
        promoted_in_blocks: of those, blocks copied or moved up from a lower tier.
        demoted_in_blocks: of those, blocks moved down from the tier above.
        evicted_blocks: blocks the policy chose to make room.
        demoted_out_blocks: of those, blocks moved to the next tier (write-back).
        promoted_out_blocks: blocks moved up out of this tier (exclusive promotion).
        cleared_blocks: blocks removed by a reset of this tier.
        dropped_blocks: blocks removed by :meth:`TieredStore.remove` (invalidation).
    """

    queried_blocks: int = 0
    hit_blocks: int = 0
    read_blocks: int = 0
    written_blocks: int = 0
    promoted_in_blocks: int = 0
    demoted_in_blocks: int = 0
    evicted_blocks: int = 0
    demoted_out_blocks: int = 0
    promoted_out_blocks: int = 0
    cleared_blocks: int = 0
    dropped_blocks: int = 0

    @property
    def removed_blocks(self) -> int:
        """Blocks that left the tier for any reason."""
        return self.evicted_blocks + self.promoted_out_blocks + self.cleared_blocks + self.dropped_blocks

    def to_dict(self) -> dict[str, int]:
        """The counters (and ``removed_blocks``) as a plain dict."""
        return {**asdict(self), "removed_blocks": self.removed_blocks}


class Tier:
    """A tier: capacity in blocks, a reference-policy object, pins and counters.

    Models one storage level of SGLang HiCache, LMCache or Dynamo KVBM (GPU, host
    memory, SSD, remote), with kvlab's policies as plug-ins.

    Args:
        name: the tier's name (also the ``medium`` of its KV events, e.g. ``"GPU"``).
        capacity_blocks: maximum resident blocks (``None`` = unbounded).
        policy: a registered policy name (:mod:`kvlab.policies`), or ``None``: never
            evict (a full tier stores nothing more, as Opal's tiers).

    Policies whose reference reads the whole trace are not supported in a tier
    (:class:`~kvlab.tiers.types.TierSpec` says why).

    Raises:
        ValueError: an empty name, a bad capacity, an unknown or unsupported policy.

    Example:
        >>> tier = Tier("GPU", 2, "lru")
        >>> tier.insert(1, 0), tier.insert(2, 1), tier.insert(3, 2)  # 3 evicts 1
        ([], [], [1])
        >>> sorted(tier.resident()), tier.counters.evicted_blocks
        ([2, 3], 1)
    """

    def __init__(self, name: str, capacity_blocks: int | None, policy: str | None = "lru") -> None:
        spec = TierSpec(name, capacity_blocks, policy)  # checks them
        self.name, self.capacity_blocks, self.policy_name = spec.name, spec.capacity_blocks, spec.policy
        self.evicts = spec.policy is not None
        self._spec = get_policy(spec.policy or "lru")  # None: LRU bookkeeping, never asked to evict
        self._policy = self._new_policy(self.capacity_blocks)
        self._held: set[int] = set()  # blocks inside the policy (evictable)
        self.pins: dict[int, int] = {}  # block -> pin count (pinned blocks are outside the policy)
        self.counters = TierCounters()

    def _new_policy(self, capacity_blocks: int | None) -> Any:
        return self._spec.reference(capacity_blocks)

    # ---------------------------------------------------------------- queries

    def __contains__(self, key: int) -> bool:
        return key in self._held or key in self.pins

    def __len__(self) -> int:
        return len(self._held) + len(self.pins)

    def resident(self) -> set[int]:
        """Resident block keys (pinned or not)."""
        return self._held | self.pins.keys()

    def is_full(self) -> bool:
        """Whether inserting one more block needs an eviction."""
        return self.capacity_blocks is not None and len(self) >= self.capacity_blocks

    def can_accept(self) -> bool:
        """Whether :meth:`insert` of a new block would succeed (room, or an evictable block)."""
        if self.capacity_blocks == 0:
            return False
        return not self.is_full() or (self.evicts and bool(self._held))

    # ---------------------------------------------------------------- updates

    def touch(self, key: int, ref_index: int) -> None:
        """Record an access to a resident block (a pinned block stays outside the policy)."""
        if key not in self.pins:
            evicted = self._policy.access(key, ref_index)
            assert not evicted, "touching a resident block evicted another"

    def make_room(self) -> int | None:
        """Evict one block (the policy's victim) if the tier is full; ``None`` if no
        eviction was needed. Raises ``LookupError`` if the tier is full of pinned blocks."""
        if not self.is_full():
            return None
        if not self.evicts:
            raise LookupError(f"tier {self.name!r} is full and never evicts")
        victim = self._policy.evict()
        if victim is None:
            raise LookupError(f"tier {self.name!r} is full of pinned blocks")
        self._held.remove(victim)
        self.counters.evicted_blocks += 1
        return victim

    def evict(self, num_blocks: int) -> list[int]:
        """Evict up to ``num_blocks`` policy victims now, whether or not the tier is full (an
        eviction round); returns them in order (fewer when the rest is pinned; none in a tier
        that never evicts).

        Example:
            >>> tier = Tier("CPU", 10, "lru")
            >>> for k in (1, 2, 3):
            ...     _ = tier.insert(k, k)
            >>> tier.evict(2), sorted(tier.resident())
            ([1, 2], [3])
        """
        victims: list[int] = []
        while self.evicts and len(victims) < num_blocks and (victim := self._policy.evict()) is not None:
            self._held.remove(victim)
            victims.append(victim)
        self.counters.evicted_blocks += len(victims)
        return victims

    def insert(self, key: int, ref_index: int) -> list[int]:
        """Insert a block that is not resident, evicting as needed; returns the victims
        (at most one).

        Raises:
            ValueError: ``key`` is already resident.
            LookupError: the block does not fit (a capacity of 0, a full tier that never
                evicts, or one full of pinned blocks); nothing is inserted.
        """
        if key in self:
            raise ValueError(f"block {key} is already resident in tier {self.name!r}")
        if self.capacity_blocks == 0:
            raise LookupError(f"tier {self.name!r} has capacity 0")
        victim = self.make_room()
        evicted = self._policy.access(key, ref_index)
        assert not evicted, "the policy evicted on its own although the tier made room"
        self._held.add(key)
        self.counters.written_blocks += 1
        return [] if victim is None else [victim]

    def remove(self, key: int) -> bool:
        """Take a resident, unpinned block out (the caller counts why). ``False`` if the
        block is not resident; pinned blocks cannot be removed (``ValueError``)."""
        if key in self.pins:
            raise ValueError(f"block {key} is pinned in tier {self.name!r}")
        if key not in self._held:
            return False
        self._held.remove(key)
        return bool(self._policy.remove(key))

    def pin(self, key: int) -> None:
        """Hold a resident block for a running request (never evicted while pinned)."""
        if key in self.pins:
            self.pins[key] += 1
            return
        if key not in self._held:
            raise ValueError(f"block {key} is not resident in tier {self.name!r}")
        self._held.remove(key)
        self._policy.remove(key)
        self.pins[key] = 1

    def unpin(self, key: int, ref_index: int) -> None:
        """Release one pin; the last release returns the block to the policy as just
        accessed."""
        count = self.pins.get(key, 0)
        if count == 0:
            raise ValueError(f"block {key} is not pinned in tier {self.name!r}")
        if count > 1:
            self.pins[key] = count - 1
            return
        del self.pins[key]
        evicted = self._policy.access(key, ref_index)
        assert not evicted, "returning a pinned block evicted another"
        self._held.add(key)

    def clear(self) -> list[int]:
        """Remove every unpinned block (a reset); returns their keys."""
        keys = sorted(self._held)
        for key in keys:
            self._policy.remove(key)
        self._held.clear()
        self.counters.cleared_blocks += len(keys)
        return keys

    def set_capacity(self, capacity_blocks: int | None) -> list[int]:
        """Change the capacity; a smaller one evicts (victims returned, in order). The
        policy object is rebuilt with the resident blocks re-inserted in the old one's
        eviction order (the next victim first), so recency order carries over and
        frequency metadata is lost.

        Raises:
            ValueError: a bad capacity, fewer blocks than are pinned, or fewer than are
                resident in a tier that never evicts.
        """
        capacity_blocks = check_count(f"tier {self.name!r}: capacity_blocks", capacity_blocks, optional=True)
        if capacity_blocks is not None and capacity_blocks < len(self.pins):
            raise ValueError(f"capacity_blocks={capacity_blocks} is below the {len(self.pins)} blocks pinned "
                             f"in tier {self.name!r}")
        if not self.evicts and capacity_blocks is not None and len(self) > capacity_blocks:
            raise ValueError(f"tier {self.name!r} never evicts: it holds {len(self)} blocks, more than "
                             f"capacity_blocks={capacity_blocks}")
        order = []
        while (victim := self._policy.evict()) is not None:  # also for policy None (LRU bookkeeping)
            order.append(victim)
        self.capacity_blocks = capacity_blocks
        self._policy = self._new_policy(capacity_blocks)
        room = None if capacity_blocks is None else capacity_blocks - len(self.pins)
        keep = order if room is None else order[len(order) - room:] if room else []
        victims = order[:len(order) - len(keep)]
        for i, key in enumerate(keep):
            self._policy.access(key, i)
        self._held = set(keep)
        self.counters.evicted_blocks += len(victims)
        return victims

    def check(self) -> None:
        """Assert the invariants (counters balance, capacity respected)."""
        c = self.counters
        assert len(self) == c.written_blocks - c.removed_blocks, (self.name, len(self), c)
        assert len(self._held) == len(self._policy), (len(self._held), len(self._policy))
        assert c.demoted_out_blocks <= c.evicted_blocks and c.hit_blocks <= c.queried_blocks, c
        assert self.capacity_blocks is None or len(self) <= self.capacity_blocks, (len(self), self.capacity_blocks)
