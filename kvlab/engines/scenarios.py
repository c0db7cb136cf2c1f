"""Step-by-step teaching scenarios over the engine models (used by notebooks and panels).

==============================  ======================================================
scenario                        what it shows
==============================  ======================================================
:func:`design_doc_example`      vLLM's prefix-caching design doc: free order, eviction
:func:`radix_growth_example`    SGLang's radix tree: split, lock, leaf-first eviction
:func:`fork_example`            oMLX: fork, copy-on-write of a shared partial block
:func:`ssd_round_trip_example`  oMLX's paged-SSD-only mode: a block made cold, looked up
                                again from the SSD, restored
==============================  ======================================================
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from kvlab.engines.omlx.paged_cache import PagedBlockPool, PagedCacheManager
from kvlab.engines.omlx.paged_ssd_cache import PagedSSDCache
from kvlab.engines.sglang.radix_cache import RadixCache
from kvlab.engines.vllm.block_pool import BlockPool
from kvlab.engines.vllm.kv_cache_manager import KVCacheManager
from kvlab.engines.vllm.request import Request
from kvlab.events.types import BlockRemoved
from kvlab.hashing import vllm


@dataclass
class Scenario:
    """A cache model plus a list of steps; :meth:`step` runs the next one.

    Attributes:
        title: what the scenario shows.
        model: the cache being driven (a :class:`KVCacheManager`, a radix cache …).
        steps: ``(label, action)`` pairs; an action returns a one-line result.
        log: ``label: result`` of every step run so far.

    Example:
        >>> scenario = design_doc_example("classic")
        >>> scenario.step()
        'request 0 arrives (18 tokens): no hit; gets blocks [1, 2, 3, 4, 5]'
        >>> scenario.done
        False
    """

    title: str
    model: object
    steps: list[tuple[str, Callable[[], str]]]
    log: list[str] = field(default_factory=list)

    @property
    def done(self) -> bool:
        """True when every step has run."""
        return len(self.log) == len(self.steps)

    def step(self) -> str:
        """Run the next step and return its result line.

        Raises:
            ValueError: every step has already run.
        """
        if self.done:
            raise ValueError(f"scenario {self.title!r} has no more steps ({len(self.steps)} run)")
        label, action = self.steps[len(self.log)]
        line = f"{label}: {action()}"
        self.log.append(line)
        return line

    def run_all(self) -> list[str]:
        """Run the remaining steps; return the whole log."""
        while not self.done:
            self.step()
        return self.log


def design_doc_example(free_order: str = "current") -> Scenario:
    """vLLM's prefix-caching design-doc example (docs/specs/engines.md §1.3 scenario 1).

    Block size 4, 11 blocks (block 0 is the null block, so the doc's ids are shifted by
    one). Requests 0 (18 tokens) and 1 (14 tokens, 8 shared) run together and finish;
    request 2 (29 tokens, 12 shared) then hits 3 blocks and needs 5 more. In ``classic``
    free order it gets ``8 9 10 5 4`` and evicts cached block 4; in ``current`` order
    the partial blocks 7 and 5 were put at the head, it gets ``7 5 8 9 10`` and evicts
    nothing. The token counts are kvlab's (the doc lets request 0 decode into its
    blocks); they give the doc's block layout and outcomes.

    Raises:
        ValueError: unknown free order.
    """
    hasher = vllm(block_size=4)
    pool = BlockPool(11, block_size=4, free_order=free_order, enable_kv_cache_events=True)
    manager = KVCacheManager(pool, block_size=4)
    r0 = Request.from_tokens("r0", range(100, 118), hasher)
    r1 = Request.from_tokens("r1", [*range(100, 108), *range(200, 206)], hasher)
    r2 = Request.from_tokens("r2", [*range(100, 112), *range(300, 317)], hasher)
    steps = [
        ("request 0 arrives (18 tokens)", lambda: admit(manager, r0)),
        ("request 1 arrives (14 tokens, 8 shared)", lambda: admit(manager, r1)),
        ("request 0 finishes", lambda: finish(manager, r0)),
        ("request 1 finishes", lambda: finish(manager, r1)),
        ("request 2 arrives (29 tokens, 12 shared)", lambda: admit(manager, r2)),
    ]
    return Scenario(f"vLLM design-doc example, {free_order} free order", manager, steps)


def admit(manager: KVCacheManager, request: Request) -> str:
    """Look up and admit ``request`` (its whole prompt); describe hits, blocks, evictions."""
    holders = {b.block_hash: b.block_id for b in manager.block_pool.blocks if b.block_hash is not None}
    manager.take_events()
    hits, num_hit = manager.get_computed_blocks(request)
    new = manager.allocate_slots(request, request.num_tokens - num_hit, num_hit, hits)
    if new is None:
        return "does not fit; nothing changes"
    evicted = [holders[k] for e in manager.take_events() if isinstance(e, BlockRemoved) for k in e.block_hashes]
    hit_text = f"hits blocks {[b.block_id for b in hits]}" if hits else "no hit"
    evict_text = f"; evicts cached block(s) {evicted}" if evicted else ""
    return f"{hit_text}; gets blocks {[b.block_id for b in new]}{evict_text}"


def finish(manager: KVCacheManager, request: Request) -> str:
    """Free ``request``'s blocks (in reverse) and describe the free queue afterwards."""
    manager.free(request)
    queue = [b.block_id for b in manager.block_pool.free_block_queue.get_all_free_blocks()]
    return f"blocks freed in reverse; free queue (head first) {queue}"


def radix_growth_example(page_size: int = 4) -> Scenario:
    """An SGLang radix tree growing, splitting, protecting and evicting (rules S2–S8).

    Steps: insert ``[1..8]``; insert ``[1..4, 9..12]`` (the node splits after the first
    page); match and lock ``[1..4, 9..12]``; evict everything (only the unlocked leaf
    ``[5..8]`` goes); unlock; evict everything (leaf first, then its parent).

    Raises:
        ValueError: bad page size.
    """
    cache = RadixCache(page_size=page_size, kv_pool_size=64)
    locked: list = []

    def insert(tokens: list[int]) -> str:
        slots = cache.allocator.alloc(len(tokens))
        existing = cache.insert(tokens, slots)
        cache.allocator.free(slots[:existing])  # the shared prefix was already cached
        return f"{existing} tokens were already cached; tree holds {cache.total_size()} tokens"

    def lock(tokens: list[int]) -> str:
        hit = cache.match_prefix(tokens)
        cache.inc_lock_ref(hit.last_node)
        locked.append(hit.last_node)
        return f"matched {hit.prefix_len} tokens and locked them: protected {cache.protected_size()}"

    def unlock() -> str:
        cache.dec_lock_ref(locked.pop())
        return f"evictable {cache.evictable_size()}, protected {cache.protected_size()}"

    def evict_all() -> str:
        freed = cache.evict(cache.total_size())
        return f"freed {freed} tokens; {cache.total_size()} remain ({cache.protected_size()} protected)"

    a, b = list(range(1, 9)), [1, 2, 3, 4, 9, 10, 11, 12]
    steps = [("insert [1..8]", lambda: insert(a)), ("insert [1..4, 9..12]", lambda: insert(b)),
             ("match and lock [1..4, 9..12]", lambda: lock(b)), ("evict everything", evict_all),
             ("unlock", unlock), ("evict everything", evict_all)]
    return Scenario(f"SGLang radix cache, page size {page_size}", cache, steps)


def _refs(manager: KVCacheManager, block_ids: list[int]) -> list[int]:
    return [manager.block_pool.blocks[i].ref_cnt for i in block_ids]


def fork_example() -> Scenario:
    """oMLX's fork with copy-on-write (:class:`~kvlab.engines.omlx.PagedCacheManager`).

    Block size 4, 8 blocks. Parent ``p`` (6 tokens: one full block, one partial) is forked
    into ``c``, which shares both blocks (ref counts 2). ``c`` writes a token into the
    shared partial block, so it gets a private copy first; ``p`` then writes into its
    block in place, which is no longer shared. Both finish.
    """
    hasher = vllm(block_size=4)
    manager = PagedCacheManager(PagedBlockPool(8, block_size=4), block_size=4)
    parent = Request.from_tokens("p", range(100, 106), hasher)
    child: list[Request] = []

    def fork() -> str:
        child.append(manager.fork(parent, "c"))
        return f"c shares blocks {manager.get_block_ids('c')}; ref counts {_refs(manager, manager.get_block_ids('c'))}"

    def decode(request: Request | None, tokens: list[int]) -> str:
        request = request or child[0]
        request.append_tokens(tokens)
        new = manager.allocate_slots(request, len(tokens))
        return (f"gets blocks {[b.block_id for b in new]}; tables p {manager.get_block_ids('p')}, "
                f"c {manager.get_block_ids('c')}; ref counts {manager.get_ref_count_summary()}")

    steps = [
        ("p arrives (6 tokens)", lambda: admit(manager, parent)),
        ("fork p into c", fork),
        ("c writes 1 token into the shared partial block", lambda: decode(None, [200])),
        ("p writes 3 tokens", lambda: decode(parent, [106, 107, 108])),
        ("c finishes", lambda: finish(manager, child[0])),
        ("p finishes", lambda: finish(manager, parent)),
    ]
    return Scenario("oMLX fork and copy-on-write", manager, steps)


def ssd_round_trip_example() -> Scenario:
    """A block's round trip through oMLX's paged-SSD-only mode.

    Block size 4, 6 blocks, a paged SSD store of 4 blocks. Request ``a`` (9 tokens: two
    full blocks) is cached — its full blocks' data saved to the SSD — and finishes. Block 1
    is marked cold and evicted permanently: it leaves lookups, its data stays on the SSD.
    Request ``b`` with the same prompt looks it up: the lookup registers its key again
    (in the free queue's head block) from the SSD and hits both blocks; the registered
    block's data is then restored (read back, the SSD's most recent).
    """
    hasher = vllm(block_size=4)
    ssd = PagedSSDCache(capacity_blocks=4)
    manager = PagedCacheManager(PagedBlockPool(6, block_size=4), block_size=4, ssd=ssd)
    a = Request.from_tokens("a", range(100, 109), hasher)
    b = Request.from_tokens("b", range(100, 109), hasher)
    key = a.block_hashes[0]
    looked_up: list[int] = []

    def cold() -> str:
        return f"mark_block_cold(1) is {manager.mark_block_cold(1)}; cold blocks {_cold(manager)}"

    def evict() -> str:
        done = manager.evict_block_permanently(1)
        return (f"evict_block_permanently(1) is {done}: block 1 holds no hash, the pool misses its key "
                f"({manager.block_pool.get_cached_block(key)}), the SSD has it ({ssd.has_block(key)})")

    def lookup() -> str:
        blocks, tokens = manager.get_computed_blocks(b)
        looked_up.extend(blocks)
        new = manager.allocate_slots(b, b.num_tokens - tokens, tokens, blocks)
        return (f"hits blocks {[x.block_id for x in blocks]} ({manager.stats.restored_blocks} registered from the "
                f"SSD); gets blocks {[x.block_id for x in new]}")

    def restore() -> str:
        block = looked_up[0]
        return f"restore_block({block.block_id}) is {manager.restore_block(block.block_id)}; {ssd!r}"

    steps = [
        ("a arrives (9 tokens)", lambda: f"{admit(manager, a)}; {ssd!r}"),
        ("a finishes", lambda: finish(manager, a)),
        ("make block 1 cold", cold),
        ("evict block 1 permanently", evict),
        ("b arrives (the same 9 tokens)", lookup),
        ("restore b's first block", restore),
    ]
    return Scenario("oMLX paged-SSD-only round trip", manager, steps)


def _cold(manager: PagedCacheManager) -> list[int]:
    return [b.block_id for b in manager.get_cold_blocks()]
