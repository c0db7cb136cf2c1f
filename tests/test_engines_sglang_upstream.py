"""kvlab's RadixCache next to SGLang 0.5.23's own, operation by operation (issue 14 item 7).

``tests/vectors/sglang_radix_cache.json`` records what the released SGLang 0.5.23
``RadixCache`` returned, published and held after every step of 24 operation sequences:
the issue's examples (MRU stamping after a split, one ``BlockStored`` per insert, an
``extra_key`` that is or is not a registered LoRA adapter, a reset while locked, T-LRU,
partial hit counting on re-insert) and 16 random sequences, two per eviction policy. The
tree is compared node by node: path, hit count, priority, lock count and the *order* of
the nodes' clocks (dense ranks: upstream reads ``time.monotonic()``, kvlab counts ticks).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from kvlab.engines.sglang.radix_cache import RadixCache
from kvlab.engines.sglang.tree_node import RadixKey
from kvlab.events.types import BlockRemoved, BlockStored

VECTORS = json.loads((Path(__file__).parent / "vectors" / "sglang_radix_cache.json").read_text())
CASES = {case["name"]: case for case in VECTORS["cases"]}


def event_rows(events: list) -> list[list]:
    """Events in the vector file's form (see its ``conventions``)."""
    rows = []
    for e in events:
        if isinstance(e, BlockStored):
            rows.append(["BlockStored", list(e.block_hashes), e.parent_block_hash, list(e.token_ids), e.block_size,
                         e.lora_id, e.medium, e.lora_name])
        elif isinstance(e, BlockRemoved):
            rows.append(["BlockRemoved", list(e.block_hashes), e.medium])
        else:
            rows.append([type(e).__name__])
    return rows


def dense_rank(values: list[int]) -> list[int]:
    order = {v: i for i, v in enumerate(sorted(set(values)))}
    return [order[v] for v in values]


def tree_rows(cache: RadixCache) -> tuple[list[list], list[list[int]]]:
    """The tree in the vector file's form, and the T-LRU depths per row."""
    nodes = []

    def walk(node: object, path: list) -> None:
        for child_key in sorted(node.children, key=repr):
            child = node.children[child_key]
            nodes.append((child, [*path, list(child.key.token_ids)]))
            walk(child, nodes[-1][1])

    walk(cache.root, [])
    access = dense_rank([n.last_access_time for n, _ in nodes])
    created = dense_rank([n.creation_time for n, _ in nodes])
    rows = [[n.key.extra_key, path, n.hit_count, n.priority, n.lock_ref, a, c]
            for (n, path), a, c in zip(nodes, access, created, strict=True)]
    return rows, [[n.tlru_cached_prefix_len, n.tlru_history_len] for n, _ in nodes]


def replay(case: dict) -> None:
    params = case["params"]
    cache = RadixCache(page_size=params["page_size"], eviction_policy=params["eviction_policy"],
                       enable_kv_cache_events=True, eviction_policy_config=params.get("eviction_policy_config"),
                       kv_event_lora_names=params.get("kv_event_lora_names"))
    init, *steps = case["steps"]
    assert event_rows(cache.take_events()) == init["events"]
    locks = []
    tokens_of: dict[int, list[int]] = {}
    token_values = not any("value" in step["op"] for step in steps)
    for i, expected in enumerate(steps):
        op = expected["op"]
        key = RadixKey(op.get("tokens", []), extra_key=op.get("extra_key"))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if op["op"] == "insert":
                result = cache.insert(key, op.get("value"), op.get("priority", 0), op.get("inserted_len", 0))
            elif op["op"] in ("match", "lock"):
                hit = cache.match_prefix(key)
                result = hit.prefix_len
                if op["op"] == "lock":
                    cache.inc_lock_ref(hit.last_node)
                    locks.append(hit.last_node)
            elif op["op"] == "unlock":
                result = 0
                cache.dec_lock_ref(locks.pop(op["index"]))
            elif op["op"] == "evict":
                result = cache.evict(op["num_tokens"])
            else:
                result = cache.reset()
                locks.clear()
        where = f"{case['name']} step {i}: {op}"
        locked = expected.get("locked_nodes", 0)
        assert [str(w.message)[:len("reset() dropped 9 locked node(s)")] for w in caught] == (
            [f"reset() dropped {locked} locked node(s)"] if locked else []), where
        assert result == expected["result"], where
        events = event_rows(cache.take_events())
        assert events == expected["events"], where
        for event in events:
            if event[0] == "BlockStored":
                for j, block_id in enumerate(event[1]):
                    tokens_of[block_id] = event[3][j * event[4]:(j + 1) * event[4]]
        if "freed" in expected and token_values:  # values are the token ids: freed slots are removed tokens
            removed = [t for e in events for h in e[1] for t in tokens_of[h]]
            assert removed == [t for slots in expected["freed"] for t in slots], where
        rows, depths = tree_rows(cache)
        assert rows == expected["tree"], where
        assert [cache.evictable_size(), cache.protected_size()] == expected["sizes"], where
        if "tlru_depths" in expected:
            assert depths == expected["tlru_depths"], where


@pytest.mark.parametrize("name", list(CASES))
def test_replays_sglang_0_5_23(name: str) -> None:
    replay(CASES[name])


def test_mru_evicts_the_leaf_stamped_after_its_split_sibling() -> None:
    """insert([1,2],[10,11]); insert([1,3],[20,21]); evict(1): SGLang frees [21]."""
    assert CASES["mru_split_stamps_new_leaf_last"]["steps"][-1]["freed"] == [[21]]
    cache = RadixCache(eviction_policy="mru", kv_pool_size=32)
    a, b = cache.allocator.alloc(2), cache.allocator.alloc(2)  # slots [1, 2] and [3, 4]
    cache.insert([1, 2], a)
    cache.insert([1, 3], np.array([a[0], b[1]]))  # [1] is cached: its slot repeats; [3] gets slot 4
    cache.allocator.free(b[:1])
    assert cache.evict(1) == 1
    assert cache.allocator.free_slots().tolist()[-1] == 4  # the [3] leaf, not [2]
    assert cache.match_prefix([1, 2]).prefix_len == 2


def test_one_block_stored_per_insert_with_page_size_1() -> None:
    cache = RadixCache(enable_kv_cache_events=True)
    cache.take_events()
    cache.insert([1, 2])
    (stored,) = cache.take_events()
    assert stored.block_hashes == (7470307888890966271, -1634645291211865391) and stored.token_ids == (1, 2)


@pytest.mark.parametrize(("lora_names", "block_hash", "lora_name"), [
    (None, 7470307888890966271, None),                                     # the plain hash, no name
    ({"key1": "adapter-a"}, -7747564068335195817, "adapter-a"),            # namespaced under the adapter
])
def test_extra_key_is_namespaced_only_for_a_registered_lora_adapter(lora_names, block_hash, lora_name) -> None:
    cache = RadixCache(enable_kv_cache_events=True, kv_event_lora_names=lora_names)
    cache.take_events()
    cache.insert(RadixKey([1], extra_key="key1"))
    assert [(e.block_hashes, e.lora_name) for e in cache.take_events()] == [((block_hash,), lora_name)]


def test_register_lora_applies_to_later_events() -> None:
    cache = RadixCache(enable_kv_cache_events=True)
    cache.insert(RadixKey([1], extra_key="key1"))
    cache.register_lora("key1", "adapter-a")
    cache.take_events()
    cache.evict(1)  # SGLang looks the name up when it publishes, not when the node was made
    assert cache.take_events() == [BlockRemoved((-7747564068335195817,), "GPU")]


def test_reset_while_locked_drops_the_tree_with_a_warning() -> None:
    cache = RadixCache(page_size=2, kv_pool_size=16)
    slots = cache.allocator.alloc(6)
    cache.insert([1, 2, 3, 4], slots[:4])
    cache.insert([5, 6], slots[4:])
    held = cache.match_prefix([1, 2, 3, 4]).last_node
    cache.inc_lock_ref(held)
    assert cache.reset(refuse_if_locked=True) is False and cache.total_size() == 6
    with pytest.warns(RuntimeWarning, match=r"dropped 1 locked node\(s\) holding 4 tokens"):
        assert cache.reset() is True
    assert cache.total_size() == 0 and (cache.evictable_size(), cache.protected_size()) == (0, 0)
    assert cache.allocator.available_size() == 16 - 4  # [5 6] freed; the locked [1..4] stay the request's
    assert cache.tree_slots.owned().tolist() == []
    with pytest.raises(ValueError, match="not from before a reset"):
        cache.dec_lock_ref(held)  # SGLang fails an assertion here
    cache.insert([1, 2, 3, 4], slots[:4])  # the request's slots can go into the new tree


@pytest.mark.parametrize(("policy", "config", "case", "expected"), [
    ("tlru", {"threshold": 3, "next_prompt_estimate": 0}, "tlru_drains_tel_safe_tails_first",
     ["[7 8]", "[20 21 22 23 24 25]"]),
    ("lru", None, "lru_on_the_tlru_ops", ["[20 21 22 23 24 25]", "[7 8]"]),
])
def test_tlru_evicts_a_tel_safe_tail_before_an_older_conversation(policy, config, case, expected) -> None:
    """Conversation [1..8] (8 tokens, budget 8 - 3 = 5) keeps its first 6 cached: its tail
    [7 8] is TEL-safe and goes before the older [20..25], which LRU evicts first."""
    freed = [s["freed"][0] for s in CASES[case]["steps"] if s.get("freed")][:2]
    assert [f"[{' '.join(map(str, f))}]" for f in freed] == expected  # SGLang 0.5.23's order
    cache = RadixCache(eviction_policy=policy, eviction_policy_config=config)
    for tokens in (range(1, 7), range(20, 26), range(1, 9)):
        cache.insert(list(tokens))
    evicted = []
    for _ in expected:
        before = set(cache.snapshot()["first_tokens"])
        cache.evict(1)
        (gone,) = before - set(cache.snapshot()["first_tokens"])
        evicted.append(gone)
    assert evicted == expected


def test_hits_are_counted_once_per_request() -> None:
    cache = RadixCache(page_size=2)
    cache.insert([1, 2, 3, 4])
    cache.insert([1, 2, 3, 4, 5, 6], inserted_len=4)  # the same request, one chunk further
    assert cache.snapshot()["hit_count"].to_list() == [0, 1, 1]
    cache.insert([1, 2, 3, 4, 5, 6])  # another request
    assert cache.snapshot()["hit_count"].to_list() == [0, 2, 2]


def test_unregistered_namespaces_share_published_ids() -> None:
    """An extra_key that is not a registered LoRA adapter publishes the plain ids, so an
    index cannot tell its blocks from the shared namespace's (SGLang 0.5.23: the
    ``extra_key_of_a_registered_lora_adapter`` case's "key2" store equals the plain one)."""
    plain = CASES["page1_insert_is_one_block_stored"]["steps"][1]["events"][0][1]
    key2 = CASES["extra_key_of_a_registered_lora_adapter"]["steps"][3]["events"][0][1]
    assert plain == key2
    cache = RadixCache(enable_kv_cache_events=True)
    cache.insert(RadixKey([1, 2], extra_key="key2"))
    cache.insert([1, 2])
    assert [list(e.block_hashes) for e in cache.take_events()[1:]] == [plain, plain]
