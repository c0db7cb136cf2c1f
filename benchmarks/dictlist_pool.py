"""The benchmark anchor: a plain dict-and-list vLLM block pool, written the way the oMLX
paged cache manager's design reads (jundot/omlx ``omlx/cache/paged_cache.py``): block
metadata in plain lists, a dict from block hash to blocks, and the free queue as a Python
list (``list.remove`` for a hit, ``del free[:n]`` to allocate). Same rules as
:class:`kvlab.engines.vllm.BlockPool` in classic free order — the benchmark checks that both
give the same hits — but none of its O(1) structure. Not part of kvlab.
"""

from __future__ import annotations


class DictListPool:
    """vLLM v1 block pool semantics (classic order) over plain lists and a dict."""

    def __init__(self, num_blocks: int) -> None:
        self.free = list(range(1, num_blocks))  # block 0 is the null block
        self.ref = [0] * num_blocks
        self.hash_of: list[int | None] = [None] * num_blocks
        self.cached: dict[int, list[int]] = {}

    def lookup(self, keys: list[int], limit: int) -> list[int]:
        blocks = []
        for key in keys[:limit]:
            copies = self.cached.get(key)
            if not copies:
                break
            blocks.append(copies[0])
        return blocks

    def touch(self, blocks: list[int]) -> None:
        for b in blocks:
            if self.ref[b] == 0:
                self.free.remove(b)
            self.ref[b] += 1

    def allocate(self, n: int) -> list[int]:
        blocks = self.free[:n]
        del self.free[:n]
        for b in blocks:
            key = self.hash_of[b]
            if key is not None:
                self.cached[key].remove(b)
                if not self.cached[key]:
                    del self.cached[key]
                self.hash_of[b] = None
            self.ref[b] = 1
        return blocks

    def cache(self, blocks: list[int], keys: list[int]) -> None:
        for b, key in zip(blocks, keys):
            self.hash_of[b] = key
            self.cached.setdefault(key, []).append(b)

    def free_blocks(self, blocks: list[int]) -> None:
        for b in blocks:
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.free.append(b)


def replay_dictlist(requests: list[tuple[int, list[int]]], capacity_blocks: int, block_size: int) -> list[int]:
    """One request at a time, as kvlab's engine replay: returns hit blocks per request."""
    pool = DictListPool(capacity_blocks + 1)
    hits = []
    for n, keys in requests:
        need = -(-n // block_size)
        limit = min(len(keys), (n - 1) // block_size)
        hit = pool.lookup(keys, limit)
        if need - len(hit) + sum(pool.ref[b] == 0 for b in hit) > len(pool.free):
            hits.append(0)
            continue
        pool.touch(hit)
        new = pool.allocate(need - len(hit))
        pool.cache(new[: len(keys) - len(hit)], keys[len(hit):])
        pool.free_blocks(list(reversed(hit + new)))
        hits.append(len(hit))
    return hits
