"""RadixIndex against Dynamo's indexer scenarios T-D1..T-D7 (spec C.3), the parent rule (D3),
the cascade (D4) and what it means for engine mappings and prefix scores.

Upstream's tests name block i by local hash i and external hash 100*i; a kvlab node is keyed
by a chained request key, so here the blocks of a path ``(b0, ..., bn)`` get the request key
``rk(path)`` (digits of the path behind a 1) and the engine key ``ek(path)`` (behind a 2): the
same block content under two prefixes is two nodes, as in Dynamo's tree. T-D8 (Dynamo's local
hash of a token block) is about hashing, not the index.
"""

from __future__ import annotations

import pytest

from kvlab.index.memory import InMemoryIndex
from kvlab.index.radix import ParentNotFoundError, RadixIndex
from kvlab.index.types import PodEntry


def rk(path: tuple[int, ...]) -> int:
    return int("1" + "".join(f"{b:02d}" for b in path))


def ek(path: tuple[int, ...]) -> int:
    return int("2" + "".join(f"{b:02d}" for b in path))


def paths(blocks: tuple[int, ...], prefix: tuple[int, ...] = ()) -> list[tuple[int, ...]]:
    return [prefix + blocks[:i + 1] for i in range(len(blocks))]


def store(index, worker: str, blocks: tuple[int, ...], parent: tuple[int, ...] = (), tier: str = "gpu") -> None:
    """A BlockStored of ``blocks`` after the worker's block ``parent`` (the root when empty)."""
    chain = paths(blocks, parent)
    index.add([ek(p) for p in chain], [rk(p) for p in chain], [PodEntry(worker, tier)],
              parent=rk(parent) if parent else None)


def remove(index, worker: str, path: tuple[int, ...], tier: str = "gpu") -> None:
    """A BlockRemoved of the block at ``path``."""
    index.evict(ek(path), "engine", [PodEntry(worker, tier)])


def query(blocks: tuple[int, ...]) -> list[int]:
    return [rk(p) for p in paths(blocks)]


# ---- spec C.3 --------------------------------------------------------------------------------
def test_t_d1_to_t_d3_stores_removes_and_a_store_under_a_parent():
    index = RadixIndex()
    store(index, "W0", (1, 2, 3))
    assert index.find_matches(query((1, 2, 3))) == {"W0": 3}  # T-D1
    store(index, "W1", (1, 4, 5))
    assert index.find_matches(query((1, 2, 3))) == {"W0": 3, "W1": 1}  # T-D2
    remove(index, "W1", (1, 4, 5))
    remove(index, "W1", (1, 4))
    store(index, "W1", (2, 6, 7), parent=(1,))  # block 2 exists under 1: it keeps its place
    assert index.find_matches(query((1, 2, 3))) == {"W0": 3, "W1": 2}  # T-D3
    assert index.find_matches(query((1, 2, 6, 7))) == {"W0": 2, "W1": 4}
    assert index.find_matches(query((1, 4, 5))) == {"W0": 1, "W1": 1}
    assert (index.tree_size("W0"), index.tree_size("W1"), index.tree_size("W9")) == (3, 4, 0)


def test_t_d4_unknown_parent_is_rejected_and_an_unknown_block_removal_is_a_no_op():
    index = RadixIndex()
    store(index, "W0", (1, 2))
    with pytest.raises(ParentNotFoundError, match=f"parent {rk((9,))}"):
        store(index, "W0", (3,), parent=(9,))
    with pytest.raises(ParentNotFoundError, match="'W1'"):  # the parent exists, but W1 does not hold it
        store(index, "W1", (3,), parent=(1,))
    with pytest.raises(ParentNotFoundError, match=r"\['W2'\]"):  # rejected whole: W0's entry is not added either
        index.add([ek((1, 2, 3))], [rk((1, 2, 3))], [PodEntry("W0"), PodEntry("W2")], parent=rk((1, 2)))
    assert issubclass(ParentNotFoundError, ValueError)
    remove(index, "W0", (7, 7))  # Dynamo reports BlockNotFound; the kvlab contract (rule L7) is a silent no-op
    remove(index, "W1", (1,))  # a block W1 does not hold
    assert dict(index.items()) == {rk((1,)): (PodEntry("W0"),), rk((1, 2)): (PodEntry("W0"),)}
    assert index.get_request_key(ek((1, 2, 3))) is None and index.tree_size("W2") == 0


def test_t_d5_remove_worker():
    index = RadixIndex()
    store(index, "W0", (0,))
    store(index, "W1", (0,))
    index.remove_worker("W0")
    assert index.find_matches(query((0,))) == {"W1": 1}
    assert index.tree_size("W0") == 0 and index.lookup(query((0,))) == {rk((0,)): (PodEntry("W1"),)}


def test_t_d6_clear_then_re_store():
    index = RadixIndex()
    store(index, "W0", (0, 1, 3))
    store(index, "W1", (0, 2, 3))
    index.clear("W0")
    assert index.find_matches(query((0, 2))) == {"W1": 2}
    assert index.find_matches(query((0, 1, 3))) == {"W1": 1}
    store(index, "W0", (4, 5))
    assert index.find_matches(query((4, 5))) == {"W0": 2}
    assert index.tree_size("W0") == 2 and index.tree_size("W1") == 3


def test_t_d7_early_exit_stops_after_a_node_with_one_worker():
    index = RadixIndex()
    store(index, "W0", (0, 1, 2))
    store(index, "W1", (0,))
    assert index.find_matches(query((0, 1, 2)), early_exit=True) == {"W0": 2, "W1": 1}
    assert index.find_matches(query((0, 1)), early_exit=True) == {"W0": 2, "W1": 1}
    assert index.find_matches(query((0, 1, 2))) == {"W0": 3, "W1": 1}


def test_find_matches_counts_every_pod_on_the_path_and_stops_at_the_first_missing_child():
    index = RadixIndex()
    store(index, "W0", (1, 2, 3))
    store(index, "W1", (1, 2, 3))
    remove(index, "W1", (1, 2))  # W1 keeps blocks 1 and 3: D6 counts it at 3 too (no intersection)
    assert index.find_matches(query((1, 2, 3))) == {"W0": 3, "W1": 2}
    assert index.lookup(query((1, 2, 3)), {"W1"}) == {rk((1,)): (PodEntry("W1"),)}
    assert index.find_matches(query((1, 9, 3))) == {"W0": 1, "W1": 1}
    assert index.find_matches([rk((1, 2))]) == {}  # a walk starts at the root
    assert index.find_matches([]) == {}
    index.add([1], [rk((1, 2))], [PodEntry("W2", "cpu")])  # no parent: an existing node keeps its place
    index.add(None, [55], [PodEntry("W2")])  # a new key without parent goes under the root
    assert index.find_matches(query((1, 2))) == {"W0": 2, "W1": 1, "W2": 1}
    assert index.find_matches([55]) == {"W2": 1}


@pytest.mark.parametrize(("call", "field"), [
    (lambda ix: ix.find_matches([1], early_exit=1), "early_exit"),
    (lambda ix: ix.find_matches([0]), r"request_keys\[0\]"),
    (lambda ix: ix.find_matches("ab"), "request_keys"),
    (lambda ix: ix.tree_size(""), "pod"),
    (lambda ix: ix.remove_worker(3), "pod"),
])
def test_bad_input_names_the_field(call, field):
    with pytest.raises(ValueError, match=field):
        call(RadixIndex())


# ---- the cascade (D4) ---------------------------------------------------------------------------
def test_a_block_left_without_entries_drops_its_subtree_and_the_mappings_into_it():
    index = RadixIndex()
    store(index, "W0", (1, 2, 3))
    store(index, "W1", (1, 2, 3))
    remove(index, "W0", (1, 2))
    assert index.find_matches(query((1, 2, 3))) == {"W0": 2, "W1": 3}  # W1 still holds block 2
    remove(index, "W1", (1, 2))
    assert index.find_matches(query((1, 2, 3))) == {"W0": 1, "W1": 1}
    assert index.lookup(query((1, 2, 3)), stop="never") == {rk((1,)): (PodEntry("W0"), PodEntry("W1"))}
    assert (index.tree_size("W0"), index.tree_size("W1")) == (1, 1)
    assert index.get_request_key(ek((1, 2))) is None  # evicted by its own engine key (rule L7)
    assert index.get_request_key(ek((1, 2, 3))) is None  # the cascade evicted block 3 for both workers
    assert index.get_request_key(ek((1,))) == rk((1,))
    with pytest.raises(ParentNotFoundError):  # W0 lost block 3: a store after it is rejected
        store(index, "W0", (4,), parent=(1, 2, 3))
    store(index, "W0", (2,), parent=(1,))
    assert index.find_matches(query((1, 2, 3))) == {"W0": 2, "W1": 1}


def test_flat_index_keeps_what_the_cascade_drops_so_prefix_scores_can_differ_after_a_re_store():
    radix, flat = RadixIndex(), InMemoryIndex()
    for index in (radix, flat):
        store(index, "W0", (1, 2, 3, 4))
        store(index, "W1", (1, 2))
        remove(index, "W0", (1, 2))
        remove(index, "W1", (1, 2))  # block 2 empty: the radix drops 3 and 4
        store(index, "W0", (2,), parent=(1,))
    assert list(radix.lookup(query((1, 2, 3, 4)), {"W0"})) == [rk((1,)), rk((1, 2))]
    assert list(flat.lookup(query((1, 2, 3, 4)), {"W0"})) == [rk(p) for p in paths((1, 2, 3, 4))]


def test_clear_cascades_but_keeps_the_mappings_of_the_blocks_it_empties():
    index = RadixIndex()
    store(index, "W1", (1, 2, 3))
    store(index, "W0", (1, 2))
    remove(index, "W1", (1, 2))  # W0 still holds block 2; W1 keeps 1 and 3
    index.clear("W0")  # block 2 empty: block 3 goes too, W1's entry with it
    assert dict(index.items()) == {rk((1,)): (PodEntry("W1"),)}
    assert index.tree_size("W1") == 1 and index.tree_size("W0") == 0
    assert index.get_request_key(ek((1, 2))) == rk((1, 2))  # rule L8: emptied by clear, the mapping stays
    assert index.get_request_key(ek((1, 2, 3))) is None  # evicted by the cascade


def test_tier_scoped_clear_keeps_blocks_another_tier_holds():
    index = RadixIndex()
    store(index, "W0", (1, 2))
    store(index, "W0", (1,), tier="cpu")
    index.clear("W0", "gpu")
    assert dict(index.items()) == {rk((1,)): (PodEntry("W0", "cpu"),)}
    assert index.find_matches(query((1, 2))) == {"W0": 1}


def test_speculative_entries_expire_and_their_nodes_go():
    index = RadixIndex()
    store(index, "W0", (1,))
    index.add_speculative(query((1, 2)), "W1", now_s=0.0, ttl_s=1.0)
    assert index.find_matches(query((1, 2))) == {"W0": 1, "W1": 2}
    assert index.tree_size("W1") == 2
    assert index.expire(1.0) == 2
    assert index.find_matches(query((1, 2))) == {"W0": 1} and index.tree_size("W1") == 0
    assert dict(index.items()) == {rk((1,)): (PodEntry("W0"),)}
