"""Step-by-step teaching scenarios over the engine models (used by notebooks and panels)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from kvlab.engines.vllm.kv_cache_manager import KVCacheManager
from kvlab.engines.vllm.request import Request
from kvlab.engines.vllm.block_pool import BlockPool
from kvlab.engines.sglang.radix_cache import RadixCache
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
    hits, n_hit = manager.get_computed_blocks(request)
    new = manager.allocate_slots(request, request.num_tokens - n_hit, n_hit, hits)
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
