"""The physical block pool of a vLLM v1 engine: blocks, free queue, hash map, KV events.

Models ``vllm/v1/core/block_pool.py :: BlockPool`` (docs/specs/engines.md §1, rules
V1–V5, V8, V12, V13). The whole eviction policy is queue discipline: allocation takes
the head of the free queue; freed blocks go back at the head or the tail depending on
``free_order``; a freed block keeps its hash (and can still be hit) until it is handed
out again, when it is evicted lazily. Block keys are u64 ints from any
:mod:`kvlab.hashing` profile, or given directly. Unlike vLLM, every method that takes
blocks checks that they are this pool's own (:mod:`kvlab.engines.vllm.checks`).

==============  ==========================================================================
``free_order``  where blocks whose ``ref_cnt`` drops to 0 go (rule V4)
==============  ==========================================================================
``"classic"``   all appended to the tail, in the given order (PR #9972 … PR #42656)
``"current"``   unhashed blocks prepended to the head, hashed appended (PR #42656);
                with caching disabled all prepended: LIFO reuse (PR #51482)
==============  ==========================================================================

==================  ======================================================================
``removed_events``  when lazy eviction or :meth:`BlockPool.evict_blocks` publishes ``BlockRemoved``
==================  ======================================================================
``"every_copy"``    for every evicted copy of a hash, even while another copy stays cached
                    (vLLM 0.33 ``_emit_block_removed_events``); an index then forgets a
                    block the pod still holds
``"last_copy"``     only when the last cached copy of the hash goes (the open upstream fix,
                    vllm-project/vllm PR #55092)
==================  ======================================================================
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

import polars as pl

from kvlab.core.validate import U64_MAX, check_choice, check_count, check_flag, check_str, check_u64
from kvlab.engines.vllm.checks import block_list, check_own_blocks, check_sized
from kvlab.engines.vllm.kv_cache_utils import FreeKVCacheBlockQueue, KVCacheBlock
from kvlab.events.types import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from kvlab.hashing.base import check_block_size

#: Accepted ``free_order`` values.
FREE_ORDERS = ("classic", "current")
#: Accepted ``removed_events`` values (module table).
REMOVED_EVENTS = ("every_copy", "last_copy")
#: The default ``medium`` of the pool's KV events (vLLM ``MEDIUM_GPU``).
MEDIUM_GPU = "GPU"
#: The KV-cache group kvlab's pool holds: vLLM's ``kv_cache_group_id`` of a model with one
#: full-attention group, published as ``group_idx`` on every ``BlockStored`` / ``BlockRemoved``.
KV_CACHE_GROUP_ID = 0


def check_block_key(name: str, value: object) -> int:
    """A u64 block key as ``int``: :func:`kvlab.core.validate.check_u64` with a message
    that says what the integer is.

    Raises:
        ValueError: naming ``name`` and the value, when not an integer in ``[0, 2**64)``.

    Example:
        >>> check_block_key("block_hash", -1)
        Traceback (most recent call last):
        ValueError: block_hash must be a u64 block key (an integer in [0, 2**64)), got -1
    """
    if type(value) is int and 0 <= value <= U64_MAX:  # the common case, checked fast
        return value
    try:
        return check_u64(name, value)
    except ValueError:
        raise ValueError(f"{name} must be a u64 block key (an integer in [0, 2**64)), got {value!r}") from None


class BlockPool:
    """All physical KV-cache blocks of one engine, with prefix caching and KV events.

    Models vLLM v1 ``BlockPool``. Block 0 is the null block (rule V1): popped at
    start-up, never handed out, never back in the queue; ``ref_cnt`` is kept at 0 for it.
    Several blocks may hold the same hash (no de-duplication, V8); a lookup returns the
    first inserted copy still cached, as vLLM's dict does.

    Counters kept beside the state (kvlab's, for replay timelines):
    :attr:`num_cached_blocks`, :attr:`num_evicted_blocks` and :attr:`num_copy_evictions`.

    Args:
        num_blocks: blocks, including the null block (an integer in ``[1, 2**31)``).
        enable_caching: prefix caching on (vLLM ``enable_prefix_caching``); a Python or
            numpy bool.
        free_order: ``"classic"`` or ``"current"`` (module table; rule V4).
        block_size: tokens per block; the ``block_size`` of ``BlockStored`` events.
        enable_kv_cache_events: queue KV events for :meth:`take_events` (a bool).
        removed_events: ``"every_copy"`` (vLLM 0.33, the default) or ``"last_copy"`` (the
            upstream fix): which evictions publish ``BlockRemoved`` (module table).
        medium: the ``medium`` of every event (vLLM's ``BlockPool(medium=)``, default
            ``"GPU"``), a non-empty string.

    Raises:
        ValueError: an invalid argument, naming it and its value. The methods taking
            blocks raise ``ValueError`` naming the block when one is not this pool's
            (another pool's, made by hand, or not a :class:`KVCacheBlock`); nothing is
            changed then.

    Example:
        >>> pool = BlockPool(5, block_size=4)
        >>> [b.block_id for b in pool.get_new_blocks(2)], pool.get_num_free_blocks()
        ([1, 2], 2)
        >>> pool.cache_full_blocks(pool.blocks[1:3], [0xA, 0xB], 0, 1)  # block 2 stays partial
        >>> pool.free_blocks([pool.blocks[2], pool.blocks[1]])  # reverse, as a request frees
        >>> [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]  # 2 to the head
        [2, 3, 4, 1]
        >>> pool.get_cached_block(0xA).block_id, pool.get_cached_block(0xB)
        (1, None)
    """

    def __init__(self, num_blocks: int, *, enable_caching: bool = True, free_order: str = "current",
                 block_size: int = 16, enable_kv_cache_events: bool = False,
                 removed_events: str = "every_copy", medium: str = MEDIUM_GPU) -> None:
        num_blocks = check_block_size(num_blocks, "num_blocks")
        self.medium = check_str("medium", medium, nonempty=True)
        self.enable_caching = check_flag("enable_caching", enable_caching)
        self.free_order = check_choice("free_order", free_order, FREE_ORDERS)
        self.block_size = check_block_size(block_size)
        self.enable_kv_cache_events = check_flag("enable_kv_cache_events", enable_kv_cache_events)
        self.removed_events = check_choice("removed_events", removed_events, REMOVED_EVENTS)
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        """Every block, indexed by id."""
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached_block_hash_to_block: dict[int, dict[int, KVCacheBlock]] = {}
        """Block key → {block id: block} for every cached copy, oldest first (read-only)."""
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True
        self.num_cached_blocks = 0
        """Blocks holding a hash (every cached copy; kvlab's counter)."""
        self.num_evicted_blocks = 0
        """Cache entries dropped so far by lazy eviction and :meth:`evict_blocks` (a reset
        is not counted; kvlab's counter)."""
        self.num_copy_evictions = 0
        """Of those, the ones that left another copy of the hash cached: each published a
        ``BlockRemoved`` under ``removed_events="every_copy"``, none under ``"last_copy"``
        (kvlab's counter)."""
        self._events: list[KVEvent] = []

    @property
    def num_blocks(self) -> int:
        """Number of blocks, null block included."""
        return len(self.blocks)

    def get_cached_block(self, block_hash: int) -> KVCacheBlock | None:
        """A block holding ``block_hash`` (the oldest cached copy), or ``None`` on a miss.

        Models vLLM v1 ``BlockPool.get_cached_block`` (one group). Pure: no ref count or
        queue position changes; a hit on a free block stays evictable until touched.

        Raises:
            ValueError: ``block_hash`` is not a u64 key.
        """
        copies = self.cached_block_hash_to_block.get(check_block_key("block_hash", block_hash))
        return next(iter(copies.values())) if copies else None

    def cache_full_blocks(self, blocks: Sequence[KVCacheBlock], block_hashes: Sequence[int], num_cached_blocks: int,
                          num_full_blocks: int, token_ids: Sequence[int] | None = None, *,
                          extra_keys: Sequence[tuple | None] | None = None, lora_id: int | None = None,
                          lora_name: str | None = None, session_id: str | None = None) -> None:
        """Give ``blocks[num_cached_blocks:num_full_blocks]`` their hashes and cache them.

        Models vLLM v1 ``BlockPool.cache_full_blocks`` (rules V8, V13): no
        de-duplication (a key may map to several blocks); one ``BlockStored`` per call
        when events are on, with ``parent_block_hash = block_hashes[num_cached_blocks - 1]``
        (``None`` from block 0), the blocks' tokens when ``token_ids`` is given, and the
        fields vLLM 0.33's ``_build_block_stored_event`` sets from the request:
        ``extra_keys`` (one entry per stored block, ``None`` for a block without extra
        keys), ``group_idx`` (:data:`KV_CACHE_GROUP_ID`), ``lora_id``, ``lora_name``,
        ``session_id`` and the pool's ``medium``. (``kv_cache_spec_kind`` is added by
        :meth:`KVCacheManager.take_events <kvlab.engines.vllm.kv_cache_manager.KVCacheManager.take_events>`,
        as in vLLM.)

        Args:
            blocks: a request's block table (a sequence).
            block_hashes: the request's u64 keys, one per full block (at least
                ``num_full_blocks``; a sequence or array).
            num_cached_blocks: leading blocks already cached.
            num_full_blocks: full blocks to be cached after the call.
            token_ids: all the request's tokens, or ``None`` (events then carry none).
            extra_keys: the stored blocks' extra keys in vLLM's untagged event form
                (``num_full_blocks - num_cached_blocks`` entries, a tuple or ``None`` each;
                :meth:`Request.event_extra_keys <kvlab.engines.vllm.request.Request.event_extra_keys>`),
                or ``None``: no block has any (vLLM then publishes ``None`` per block).
            lora_id: the request's LoRA adapter id (vLLM ``lora_request.adapter_id``), or ``None``.
            lora_name: the request's LoRA adapter name, or ``None``.
            session_id: the request's session id, or ``None``.

        Raises:
            ValueError: caching disabled; ``blocks`` / ``block_hashes`` / ``token_ids``
                not a sequence; ``num_cached_blocks > num_full_blocks``, or counts beyond
                ``blocks`` / ``block_hashes`` / ``token_ids``; ``extra_keys`` of another
                length than the blocks stored; a bad key or event field; a block to cache
                that is not this pool's, is the null block, is free (``ref_cnt == 0``) or
                is already hashed. Nothing is changed then; equal counts are a no-op.
        """
        if not self.enable_caching:
            raise ValueError("cache_full_blocks needs enable_caching=True")
        check_sized("blocks", blocks)
        check_sized("block_hashes", block_hashes)
        if token_ids is not None:
            check_sized("token_ids", token_ids)
        num_cached_blocks = check_count("num_cached_blocks", num_cached_blocks)
        num_full_blocks = check_count("num_full_blocks", num_full_blocks)
        if num_full_blocks > min(len(blocks), len(block_hashes)):
            raise ValueError(f"num_full_blocks={num_full_blocks} exceeds len(blocks)={len(blocks)} or "
                             f"len(block_hashes)={len(block_hashes)}")
        if num_cached_blocks > num_full_blocks:
            raise ValueError(f"num_cached_blocks={num_cached_blocks} exceeds num_full_blocks={num_full_blocks}")
        if num_cached_blocks == num_full_blocks:
            return
        first = max(num_cached_blocks - 1, 0)  # the parent and the blocks stored (the rest were checked)
        keys = [check_block_key(f"block_hashes[{i}]", h)
                for i, h in enumerate(block_hashes[first:num_full_blocks], start=first)]
        new_blocks = list(blocks[num_cached_blocks:num_full_blocks])
        check_own_blocks(self.blocks, new_blocks, "blocks", start=num_cached_blocks)
        for i, block in enumerate(new_blocks, start=num_cached_blocks):
            problem = ("is the null block" if block.is_null else "is free (ref_cnt 0)" if block.ref_cnt == 0
                       else f"already holds hash {block.block_hash:#x}" if block.block_hash is not None else "")
            if problem:
                raise ValueError(f"blocks[{i}] (block {block.block_id}) {problem}; it cannot be cached")
        tokens: list[int] = []
        if token_ids is not None:
            if len(token_ids) < num_full_blocks * self.block_size:
                raise ValueError(f"token_ids has {len(token_ids)} tokens, fewer than num_full_blocks x block_size = "
                                 f"{num_full_blocks * self.block_size}")
            tokens = [int(t) for t in token_ids[num_cached_blocks * self.block_size:num_full_blocks * self.block_size]]
        event = None
        if self.enable_kv_cache_events:
            num_new = num_full_blocks - num_cached_blocks
            if extra_keys is not None:
                check_sized("extra_keys", extra_keys)
                if len(extra_keys) != num_new:
                    raise ValueError(f"extra_keys has {len(extra_keys)} entries but {num_new} blocks are stored")
            event = BlockStored(block_hashes=keys[num_cached_blocks - first:],
                                parent_block_hash=keys[0] if num_cached_blocks else None,
                                token_ids=tokens, block_size=self.block_size, lora_id=lora_id, medium=self.medium,
                                lora_name=lora_name,
                                extra_keys=[None] * num_new if extra_keys is None else list(extra_keys),
                                group_idx=KV_CACHE_GROUP_ID, session_id=session_id)
        for block, key in zip(new_blocks, keys[num_cached_blocks - first:], strict=True):
            block.block_hash = key
            self.cached_block_hash_to_block.setdefault(key, {})[block.block_id] = block
        self.num_cached_blocks += len(new_blocks)
        if event is not None:
            self._events.append(event)

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Take ``num_blocks`` blocks from the head of the free queue, each with ref 1.

        Models vLLM v1 ``BlockPool.get_new_blocks`` (rules V2, V3): a popped block that
        is still cached is evicted lazily — its map entry and hash dropped and a
        ``BlockRemoved`` queued.

        Raises:
            ValueError: ``num_blocks`` is not an integer >= 0 or exceeds the free blocks.
            RuntimeError: a block taken from the free queue has a non-zero ref count (a bug).
        """
        num_blocks = check_count("num_blocks", num_blocks)
        if num_blocks > self.get_num_free_blocks():
            raise ValueError(f"cannot get {num_blocks} free blocks from the pool: {self.get_num_free_blocks()} free")
        out = self.free_block_queue.popleft_n(num_blocks)
        for block in out:
            if self.enable_caching:
                self._maybe_evict_cached_block(block)
            if block.ref_cnt != 0:
                raise RuntimeError(f"free block {block.block_id} has ref_cnt {block.ref_cnt}; this indicates a bug")
            block.ref_cnt = 1
        return out

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> bool:
        """Drop ``block``'s hash-map entry and hash (and queue ``BlockRemoved`` as ``removed_events`` says); False if
        uncached."""
        key = block.block_hash
        if key is None:
            return False
        copies = self.cached_block_hash_to_block[key]
        del copies[block.block_id]
        if not copies:
            del self.cached_block_hash_to_block[key]
        else:
            self.num_copy_evictions += 1
        block.block_hash = None
        self.num_cached_blocks -= 1
        self.num_evicted_blocks += 1
        if self.enable_kv_cache_events and (not copies or self.removed_events == "every_copy"):
            self._events.append(BlockRemoved(block_hashes=[key], medium=self.medium, group_idx=KV_CACHE_GROUP_ID))
        return True

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take a reference on each hit block, pulling free ones out of the queue.

        Models vLLM v1 ``BlockPool.touch`` (rule V5): if ``ref_cnt == 0`` the block is
        removed from the free queue (O(1)); then ``ref_cnt += 1``. The null block is
        skipped (its ref count is not maintained).

        Raises:
            ValueError: ``blocks`` is not an iterable of this pool's blocks (naming the
                first offending block); nothing is touched then.
            RuntimeError: a block with ``ref_cnt == 0`` is not in the free queue (a bug).
        """
        blocks = block_list("blocks", blocks)
        check_own_blocks(self.blocks, blocks, "blocks")
        for block in blocks:
            if block.is_null:
                continue
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference per listed block; blocks reaching 0 return to the free queue.

        Models vLLM v1 ``BlockPool.free_blocks`` (rule V4). ``ordered_blocks`` is in
        eviction priority (a request passes its table reversed). Where the freed blocks
        go depends on ``free_order`` (module table). The null block is skipped.

        Raises:
            ValueError: ``ordered_blocks`` is not an iterable of this pool's blocks
                (naming the first offending block), or lists a block more times than its
                ``ref_cnt`` (a double free); nothing is changed then.
        """
        given = block_list("ordered_blocks", ordered_blocks)
        check_own_blocks(self.blocks, given, "ordered_blocks")
        listed = [b for b in given if not b.is_null]
        times = Counter(b.block_id for b in listed)
        for block in listed:
            if times[block.block_id] > block.ref_cnt:
                raise ValueError(f"ordered_blocks lists block {block.block_id} {times[block.block_id]} time(s) but "
                                 f"its ref_cnt is {block.ref_cnt}; freeing it would make the count negative")
        for block in listed:
            block.ref_cnt -= 1
        freed = [b for b in listed if b.ref_cnt == 0]
        if self.free_order == "classic":
            self.free_block_queue.append_n(freed)
        elif not self.enable_caching:
            self.free_block_queue.prepend_n(freed)
        else:
            self.free_block_queue.prepend_n([b for b in freed if b.block_hash is None])
            self.free_block_queue.append_n([b for b in freed if b.block_hash is not None])

    def evict_blocks(self, block_ids: Iterable[int]) -> list[int]:
        """Drop the cache entries of the given blocks; in-use blocks stay in use.

        Models vLLM v1 ``BlockPool.evict_blocks`` (used by KV connectors; rule V3): only
        hashes and map entries go (with a ``BlockRemoved`` each); ref counts and queue
        positions are unchanged.

        Returns:
            The ids whose cache entry was dropped, in the given order.

        Raises:
            ValueError: an id that is not an integer in ``[0, num_blocks)``; nothing is
                evicted then.
        """
        ids = [check_count("block_ids[]", i) for i in block_ids]
        for block_id in ids:
            if block_id >= self.num_blocks:
                raise ValueError(f"block_ids has {block_id}, but the pool has blocks 0..{self.num_blocks - 1}")
        return [i for i in ids if self._maybe_evict_cached_block(self.blocks[i])]

    def reset_prefix_cache(self) -> bool:
        """Drop every cache entry, if no block is in use.

        Models vLLM v1 ``BlockPool.reset_prefix_cache`` (rule V12): succeeds only when
        every block but the null block is free; then clears the map and every hash and
        queues ``AllBlocksCleared``. Free-queue order is kept.

        Returns:
            True when reset, False (nothing changed) while blocks are in use.
        """
        if self.num_blocks - self.get_num_free_blocks() != 1:
            return False
        self.cached_block_hash_to_block = {}
        self.num_cached_blocks = 0
        for block in self.blocks:
            block.block_hash = None
        if self.enable_kv_cache_events:
            self._events.append(AllBlocksCleared())
        return True

    def get_num_free_blocks(self) -> int:
        """Blocks in the free queue (cached or not)."""
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        """KV-cache usage in [0.0, 1.0]: ``1 - free / (num_blocks - 1)``; 0.0 with no usable block.

        Models vLLM v1 ``BlockPool.get_usage`` (the null block is excluded).
        """
        usable = self.num_blocks - 1
        return 1.0 - self.get_num_free_blocks() / usable if usable else 0.0

    def take_events(self) -> list[KVEvent]:
        """The queued KV events, oldest first; the queue is emptied (vLLM ``take_events``)."""
        events, self._events = self._events, []
        return events

    def _state(self, block: KVCacheBlock) -> str:
        if block.is_null:
            return "null"
        if block.ref_cnt:
            return "in_use"
        return "free" if block.block_hash is None else "cached_free"

    def snapshot(self) -> pl.DataFrame:
        """One row per block, by id: ``block_id`` (i64), ``state`` (str: ``"null"`` |
        ``"in_use"`` | ``"cached_free"`` | ``"free"``), ``ref_cnt`` (i64), ``block_hash``
        (u64, null when uncached), ``queue_position`` (i64, 0 = head; null outside the
        free queue)."""
        position = {b.block_id: i for i, b in enumerate(self.free_block_queue.get_all_free_blocks())}
        return pl.DataFrame({
            "block_id": [b.block_id for b in self.blocks],
            "state": [self._state(b) for b in self.blocks],
            "ref_cnt": [b.ref_cnt for b in self.blocks],
            "block_hash": [b.block_hash for b in self.blocks],
            "queue_position": [position.get(b.block_id) for b in self.blocks],
        }, schema={"block_id": pl.Int64, "state": pl.String, "ref_cnt": pl.Int64, "block_hash": pl.UInt64,
                   "queue_position": pl.Int64})

    def pretty(self) -> str:
        """A text dump: every block (state, ref count, hash), the free queue head to tail,
        and the hash map (key → block ids, oldest copy first)."""
        lines = [repr(self), f"usage {self.get_usage():.2f}", "  id  state        ref  hash"]
        for block in self.blocks:
            key = "-" if block.block_hash is None else f"{block.block_hash:#x}"
            lines.append(f"{block.block_id:>4}  {self._state(block):<11} {block.ref_cnt:>4}  {key}")
        queue = " ".join(str(b.block_id) for b in self.free_block_queue.get_all_free_blocks())
        lines.append(f"free queue (head -> tail): {queue or '(empty)'}")
        entries = [f"{key:#x} -> {list(copies)}" for key, copies in self.cached_block_hash_to_block.items()]
        lines.append("hash map: " + ("; ".join(entries) or "(empty)"))
        return "\n".join(lines)

    def __repr__(self) -> str:
        in_use = sum(1 for b in self.blocks if b.ref_cnt and not b.is_null)
        cached = sum(len(c) for c in self.cached_block_hash_to_block.values())
        return (f"BlockPool(num_blocks={self.num_blocks}, in_use={in_use}, free={self.get_num_free_blocks()}, "
                f"cached={cached}, free_order={self.free_order!r}, caching={self.enable_caching})")
