"""Caller checks of the vLLM v1 block-pool model: what kvlab checks that vLLM trusts.

vLLM trusts its caller, the scheduler: a block of another pool, a hit block with the wrong
hash or the same block listed twice silently corrupts its free queue, ref counts or hash
map. kvlab is driven by hand (notebooks, tests), so these checks turn each such misuse into
a ``ValueError`` naming the parameter and the value before anything is changed. They are
cheap: one identity check per block (``block is pool.blocks[block.block_id]``).

The checks take plain values (a pool's block list, a request's table and keys), never a
manager: :mod:`~kvlab.engines.vllm.block_pool` and
:mod:`~kvlab.engines.vllm.kv_cache_manager` import this module, not the other way round.
Argument checks (counts, flags, choices) come from :mod:`kvlab.core.validate`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from kvlab.core.validate import check_count, check_positive
from kvlab.engines.vllm.kv_cache_utils import KVCacheBlock
from kvlab.hashing.base import check_block_size


class _Request(Protocol):
    """What the checks read of a request (:class:`~kvlab.engines.vllm.request.Request`)."""

    request_id: str
    num_tokens: int
    num_computed_tokens: int
    block_hashes: list[int]


def check_sized(name: str, value: Any) -> Any:
    """Validate a sequence-like argument (``len`` and slicing: a list, tuple, range or
    numpy array) and return it unchanged.

    Raises:
        ValueError: naming ``name`` and the value (``None``, an int, a string, a set …).

    Example:
        >>> check_sized("blocks", {1})
        Traceback (most recent call last):
        ValueError: blocks must be a sequence (a list, tuple or array), got {1}
    """
    if isinstance(value, (str, bytes)) or not (hasattr(value, "__len__") and hasattr(value, "__getitem__")):
        raise ValueError(f"{name} must be a sequence (a list, tuple or array), got {value!r}")
    return value


def block_list(name: str, blocks: Iterable[KVCacheBlock]) -> list[KVCacheBlock]:
    """``blocks`` as a list.

    Raises:
        ValueError: ``blocks`` is not iterable (``None``, an int …), naming ``name``.

    Example:
        >>> block_list("blocks", (KVCacheBlock(1),))
        [KVCacheBlock(block_id=1, ref_cnt=0, block_hash=None, is_null=False, in_free_queue=False)]
    """
    if isinstance(blocks, (str, bytes)) or not isinstance(blocks, Iterable):
        raise ValueError(f"{name} must be an iterable of KVCacheBlock, got {blocks!r}")
    return list(blocks)


def check_own_blocks(pool_blocks: Sequence[KVCacheBlock], blocks: Iterable[KVCacheBlock], name: str,
                     start: int = 0) -> None:
    """Check that every one of ``blocks`` is a block of the pool whose block list is
    ``pool_blocks`` (the very object, not an equal-looking one); ``start`` is the index of
    ``blocks[0]`` in the caller's argument, for the message.

    Raises:
        ValueError: naming ``name[i]`` and the block: not a :class:`KVCacheBlock`, or a
            block of another pool (or a free-standing one).

    Example:
        >>> mine = [KVCacheBlock(0), KVCacheBlock(1)]
        >>> check_own_blocks(mine, [mine[1]], "blocks")
        >>> check_own_blocks(mine, [mine[0], KVCacheBlock(1)], "blocks")
        Traceback (most recent call last):
        ...
        ValueError: blocks[1] (block 1) is not a block of this BlockPool (another pool's, or made by hand); ...
    """
    for i, block in enumerate(blocks, start=start):
        try:  # identity with the pool's own record implies a KVCacheBlock of this pool
            if pool_blocks[block.block_id] is block:
                continue
        except (AttributeError, IndexError, TypeError):
            pass
        if not isinstance(block, KVCacheBlock):
            raise ValueError(f"{name}[{i}] must be a KVCacheBlock of this pool, got {block!r}")
        raise ValueError(f"{name}[{i}] (block {block.block_id!r}) is not a block of this BlockPool (another pool's, "
                         f"or made by hand); using it would corrupt the pool")


def check_hits(pool_blocks: Sequence[KVCacheBlock], hits: Sequence[KVCacheBlock], request: _Request,
               first_block: int) -> None:
    """Check prefix-hit blocks for ``request`` before they are touched: each a block of
    the pool, not the null block, listed once, and holding the request's key at its
    position (vLLM asserts that hash when caching); ``hits[0]`` is block ``first_block``.

    Raises:
        ValueError: naming ``new_computed_blocks[i]``, the block and the problem.
    """
    check_own_blocks(pool_blocks, hits, "new_computed_blocks")
    keys = request.block_hashes
    seen: set[int] = set()
    for i, block in enumerate(hits):
        key = keys[first_block + i]
        if block.block_hash == key and block.block_id not in seen and not block.is_null:
            seen.add(block.block_id)
            continue
        where = f"new_computed_blocks[{i}] (block {block.block_id})"
        if block.is_null:
            raise ValueError(f"{where} is the null block; it is never a prefix hit")
        if block.block_id in seen:
            raise ValueError(f"{where} is listed twice; each hit is a different block")
        held = "no hash" if block.block_hash is None else f"hash {block.block_hash:#x}"
        raise ValueError(f"{where} holds {held} but block {first_block + i} of request {request.request_id!r} "
                         f"has key {key:#x}; pass the blocks get_computed_blocks returned for this request")


def check_owner(owners: dict[str, object], request: _Request) -> None:
    """Check that no other live request object holds ``request``'s id (``owners``: request
    id → the object holding blocks under it).

    Raises:
        ValueError: ``request.request_id`` belongs to a different object that still holds
            blocks.
    """
    owner = owners.get(request.request_id)
    if owner is not None and owner is not request:
        raise ValueError(f"request id {request.request_id!r} is already in use by another request; free it "
                         f"first or use a new id")


def check_group_block_sizes(group_block_sizes: Iterable[int], block_size: int) -> None:
    """Check a model's KV-cache group block sizes: one distinct size, ``block_size``.

    Raises:
        ValueError: several distinct sizes — vLLM's hybrid coordinator would align every
            hit to their LCM, so a short prompt could never hit (vLLM-Ascend issue
            #16270); kvlab models one group — or a size other than ``block_size``.
    """
    sizes = sorted({check_block_size(s, "group_block_sizes[]") for s in group_block_sizes})
    if len(sizes) > 1:
        lcm = math.lcm(*sizes)
        raise ValueError(f"group_block_sizes has {len(sizes)} distinct block sizes {sizes}: vLLM would align "
                         f"every prefix hit to their LCM ({lcm} tokens), so a prompt of {lcm} tokens or fewer "
                         f"could never hit (vLLM-Ascend issue #16270); kvlab models one KV-cache group, pass "
                         f"one block size")
    if sizes != [block_size]:
        raise ValueError(f"group_block_sizes must hold block_size ({block_size}) only, got {sizes}")


def check_allocation(request: _Request, table: Sequence[KVCacheBlock], hits: list[KVCacheBlock],
                     num_new_tokens: object, num_new_computed_tokens: object, *, block_size: int,
                     enable_caching: bool, pool_blocks: Sequence[KVCacheBlock]) -> int:
    """Validate an ``allocate_slots`` call (:class:`~kvlab.engines.vllm.kv_cache_manager.KVCacheManager`)
    for ``request``, whose block table is ``table``, and return its computed tokens after it.

    The manager has checked the request itself (block size, key count, owner) first.

    Raises:
        ValueError: every caller mistake ``allocate_slots`` lists, naming the parameter.
    """
    rid, computed, size = request.request_id, request.num_computed_tokens, block_size
    num_new_tokens = check_positive("num_new_tokens", num_new_tokens)
    num_new_computed_tokens = check_count("num_new_computed_tokens", num_new_computed_tokens)
    if (table or computed) and (hits or num_new_computed_tokens):
        raise ValueError(f"request {rid!r} already has computed tokens; only a new request takes prefix hits")
    if hits and not enable_caching:
        raise ValueError("new_computed_blocks must be empty with caching disabled")
    if len(hits) * size != num_new_computed_tokens:
        raise ValueError(f"num_new_computed_tokens={num_new_computed_tokens} but new_computed_blocks holds "
                         f"{len(hits)} blocks of {size} tokens")
    if computed and not table:
        raise ValueError(f"request {rid!r} has {computed} computed tokens but no blocks (freed?)")
    total = computed + num_new_computed_tokens + num_new_tokens
    if total > request.num_tokens:
        raise ValueError(f"num_new_tokens={num_new_tokens} goes past the end of request {rid!r}: "
                         f"{computed} + {num_new_computed_tokens} computed, {request.num_tokens} tokens")
    if len(table) != -(-computed // size):
        raise ValueError(f"request {rid!r} has {computed} computed tokens but its table holds {len(table)} "
                         f"blocks of {size}; was num_computed_tokens changed outside the manager?")
    if hits:
        check_hits(pool_blocks, hits, request, computed // size)
    return total
