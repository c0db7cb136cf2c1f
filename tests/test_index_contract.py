"""The Index contract on every backend: llm-d's index scenarios T-L1..T-L16 (spec A.8), the
Part E choices of kvlab.index.base (union mapping, stop rule, tier-scoped clear, speculative
TTLs), bad input, and a differential test against naive dict-of-sets references.

RadixIndex drops a block's subtree when the block is left without entries (Dynamo rule D4);
the scenarios where that shows (T-L9) state its expected result beside the flat backends'.
T-L14/T-L15 test InMemoryIndex's bounds only. T-L17 (MaxCost of llm-d's cost-aware Ristretto
backend) has no test: kvlab does not build that backend.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kvlab.index.base import Index, entry_sort_key
from kvlab.index.memory import InMemoryIndex
from kvlab.index.radix import ParentNotFoundError, RadixIndex
from kvlab.index.types import PodEntry


def gpu(pod: str, **kw: object) -> PodEntry:
    return PodEntry(pod, "gpu", **kw)


def cpu(pod: str, **kw: object) -> PodEntry:
    return PodEntry(pod, "cpu", **kw)


@pytest.fixture(params=["memory", "radix", "redis"])
def index_factory(request: pytest.FixtureRequest):
    """``make(**kwargs) -> Index``: a fresh, empty index of the parametrized backend."""
    if request.param == "memory":
        return InMemoryIndex
    if request.param == "radix":
        return RadixIndex
    return request.getfixturevalue("redis_index_factory")


@pytest.fixture
def index(index_factory) -> Index:
    return index_factory()


def is_radix(index: Index) -> bool:
    return isinstance(index, RadixIndex)


# ---- spec A.8 scenarios (expected values are llm-d's) -------------------------------------
def test_t_l1_add_then_lookup_gives_every_entry(index):
    index.add([1], [10], [gpu("p1"), gpu("p2")])
    assert index.lookup([10]) == {10: (gpu("p1"), gpu("p2"))}
    assert index.lookup([10], []) == index.lookup([10], None) == {10: (gpu("p1"), gpu("p2"))}  # empty filter: all


def test_t_l2_second_add_extends_the_entry_set_whole_tuple(index):
    index.add([1], [10], [gpu("p1"), gpu("p2")])
    index.add([1], [10], [gpu("p1"), cpu("p2"), gpu("p3")])
    assert index.lookup([10]) == {10: (gpu("p1"), cpu("p2"), gpu("p2"), gpu("p3"))}


def test_t_l3_pod_filter(index):
    index.add([1], [10], [gpu("p1"), gpu("p2"), gpu("p3")])
    assert index.lookup([10], {"p1"}) == {10: (gpu("p1"),)}
    assert index.lookup([10], ["p1", "p3"]) == {10: (gpu("p1"), gpu("p3"))}
    assert index.lookup([10], {"p999"}) == {}


def test_t_l4_evict_matches_the_whole_tuple(index):
    index.add([1], [10], [gpu("p1"), gpu("p2"), gpu("p3")])
    index.evict(1, "engine", [gpu("p1"), cpu("p3")])
    assert index.lookup([10]) == {10: (gpu("p2"), gpu("p3"))}


def test_t_l5_speculative_add_without_engine_keys_maps_nothing(index):
    index.add(None, [10], [gpu("p", speculative=True)])
    assert index.lookup([10]) == {10: (gpu("p", speculative=True),)}
    assert index.get_request_key(10) is None
    assert index.pod_keys("p") == set() and index.pod_keys("p", speculative=True) == {10}
    assert index.pod_tier_counts() == {}


def test_t_l6_one_to_one_mapping(index):
    index.add([100, 200, 300, 400], [1000, 2000, 3000, 4000], [gpu("p")])
    assert [index.get_request_key(e) for e in (100, 200, 300, 400)] == [1000, 2000, 3000, 4000]


def test_t_l7_many_engine_keys_to_one_request_key(index):
    index.add([10, 11, 12, 13], [9000], [gpu("p")])
    assert [index.get_request_key(e) for e in (10, 11, 12, 13)] == [9000] * 4
    index.evict(10, "engine", [gpu("p")])
    assert index.lookup([9000], stop="never") == {}
    assert index.get_request_key(10) is None
    assert index.get_request_key(11) == 9000  # the other engine keys' mappings stay (stale, as upstream)


def test_t_l8_one_engine_key_to_many_request_keys(index):
    index.add([500], [5000, 5001, 5002, 5003], [gpu("p")])
    assert index.get_request_key(500) == 5003
    index.evict(500, "engine", [gpu("p")])
    assert index.lookup([5000, 5001, 5002, 5003], stop="never") == {}
    assert index.get_request_key(500) is None


def test_t_l9_evicting_a_middle_block(index):
    index.add([700, 701, 702], [7000, 7001, 7002], [gpu("p")])
    index.evict(701, "engine", [gpu("p")])
    assert index.lookup([7000]) == {7000: (gpu("p"),)}
    assert index.lookup([7001]) == {}
    if is_radix(index):  # D4: block 7001 held by no pod drops its subtree, 7002 with it
        assert index.lookup([7002]) == {} and index.get_request_key(702) is None
    else:
        assert index.lookup([7002]) == {7002: (gpu("p"),)} and index.get_request_key(702) == 7002
    assert index.lookup([7000, 7001, 7002]) == {7000: (gpu("p"),)}


def test_t_l10_evict_keeps_the_mapping_while_another_tier_holds_the_block(index):
    index.add([1], [10], [gpu("p")])
    index.add(None, [10], [cpu("p")])  # CPU offload: tier update without engine keys (rule L17)
    index.evict(1, "engine", [gpu("p")])
    assert index.lookup([10]) == {10: (cpu("p"),)}
    assert index.get_request_key(1) == 10
    index.evict(1, "engine", [cpu("p")])
    assert index.lookup([10]) == {}
    assert index.get_request_key(1) is None


def test_t_l11_groups_are_distinct_entries(index):
    index.add([1], [10], [gpu("p", group=0), gpu("p", group=1)])
    assert index.lookup([10]) == {10: (gpu("p", group=0), gpu("p", group=1))}
    index.evict(1, "engine", [gpu("p", group=1)])
    assert index.lookup([10]) == {10: (gpu("p", group=0),)}
    index.evict(1, "engine", [gpu("p", group=0)])
    assert index.lookup([10]) == {}


def test_t_l12_clear_removes_every_variant_of_the_pod(index):
    index.add([1], [10], [gpu("pod-tiers"), cpu("pod-tiers"), gpu("pod-tiers", group=1), gpu("pod-other")])
    index.clear("pod-tiers")
    assert index.lookup([10]) == {10: (gpu("pod-other"),)}


def test_t_l13_clear_leaves_others_and_a_re_added_pod_is_visible(index):
    index.add([1], [10], [gpu("A"), gpu("B")])
    index.clear("A")
    assert index.lookup([10]) == {10: (gpu("B"),)}
    index.clear("B")
    assert index.lookup([10]) == {}
    assert index.get_request_key(1) == 10  # rule L8: the mapping stays and resolves to nothing
    index.add([1], [10], [gpu("A")])
    assert index.lookup([10]) == {10: (gpu("A"),)}


def test_t_l14_in_memory_size_bounds_request_keys():
    index = InMemoryIndex(size=2)
    for engine_key, request_key in [(1, 11), (2, 12), (3, 13)]:
        index.add([engine_key], [request_key], [gpu("p")])
    assert index.lookup([11, 12, 13], stop="never") == {12: (gpu("p"),), 13: (gpu("p"),)}  # upstream's map
    assert index.lookup([11, 12, 13]) == {}  # our default stops at the missing 11


def test_t_l14_lookup_recency_decides_the_victim():
    index = InMemoryIndex(size=2)
    index.add(None, [11], [gpu("p")])
    index.add(None, [12], [gpu("p")])
    index.lookup([11])  # a promoting get: 12 is now least recently used
    index.add(None, [13], [gpu("p")])
    assert set(index.lookup([11, 12, 13], stop="never")) == {11, 13}
    index.clear("q")  # a peek: does not promote 11
    index.add(None, [14], [gpu("p")])
    assert set(index.lookup([11, 12, 13, 14], stop="never")) == {13, 14}


def test_in_memory_size_bounds_engine_keys_too():
    index = InMemoryIndex(size=2)
    index.add([1, 2], [11, 12], [gpu("p")])
    assert index.get_request_key(1) == 11  # a promoting get: engine key 2 is now least recently used
    index.add([3], [13], [gpu("p")])
    assert [index.get_request_key(e) for e in (1, 2, 3)] == [11, None, 13]


def test_t_l15_in_memory_pod_cache_size_bounds_entries_per_key():
    index = InMemoryIndex(pod_cache_size=2)
    index.add([1], [10], [gpu("p1"), gpu("p2"), gpu("p3")])
    assert index.lookup([10]) == {10: (gpu("p2"), gpu("p3"))}
    index.add([1], [10], [gpu("p2")])  # re-adding refreshes p2: p3 is the least recent now
    index.add([1], [10], [gpu("p4")])
    assert index.lookup([10]) == {10: (gpu("p2"), gpu("p4"))}


def test_t_l16_speculative_and_confirmed_entries_coexist(index):
    index.add([1], [10], [gpu("p")])
    index.add(None, [10], [gpu("p", speculative=True)])
    assert index.lookup([10]) == {10: (gpu("p"), gpu("p", speculative=True))}
    index.evict(10, "request", [gpu("p", speculative=True)])
    assert index.lookup([10]) == {10: (gpu("p"),)}
    assert index.get_request_key(1) == 10


# ---- Part E choices ----------------------------------------------------------------------
def test_re_add_unions_request_keys_and_the_highest_position_wins(index):
    index.add([1], [5000, 5001], [gpu("p")])
    index.add([1], [6000], [gpu("p")])  # position 0: below 5001's position 1
    assert index.get_request_key(1) == 5001
    index.add([2], [9], [gpu("p")])
    index.add([2], [10], [gpu("p")])  # equal positions: the larger decimal string, "9" > "10"
    assert index.get_request_key(2) == 9
    index.evict(2, "engine", [gpu("p")])  # from both request keys of the union
    assert index.lookup([9], stop="never") == index.lookup([10], stop="never") == {}
    assert index.get_request_key(2) is None


def test_lookup_stops_at_the_first_miss_unless_stop_never(index):
    index.add([1, 2, 3], [10, 20, 30], [gpu("A")])
    index.add(None, [10], [gpu("B")])
    index.add(None, [30], [gpu("B")])  # T-S7's "prefix break" for B
    assert index.lookup([10, 20, 30], {"B"}) == {10: (gpu("B"),)}
    assert index.lookup([10, 20, 30], {"B"}, stop="never") == {10: (gpu("B"),), 30: (gpu("B"),)}
    assert list(index.lookup([10, 99, 30])) == [10]
    assert list(index.lookup([10, 99, 30], stop="never")) == [10, 30]
    assert index.lookup([99, 10]) == {}


def test_clear_is_scoped_to_a_tier_and_keeps_mappings(index):
    index.add([1, 2], [10, 20], [gpu("p"), cpu("p"), gpu("q")])
    index.clear("p", "cpu")
    assert index.lookup([10, 20]) == {10: (gpu("p"), gpu("q")), 20: (gpu("p"), gpu("q"))}
    assert index.pod_tier_counts() == {"p": {"gpu": 2}, "q": {"gpu": 2}}
    index.clear("q")
    index.clear("p", "gpu")
    assert index.lookup([10, 20], stop="never") == {}
    assert [index.get_request_key(1), index.get_request_key(2)] == [10, 20]


def test_speculative_entries_expire_on_the_logical_clock(index):
    index.add([1], [10], [gpu("p")])
    entry = index.add_speculative([10, 20], "p", now_s=10.0, ttl_s=2.0)
    index.add_speculative([30], "q", now_s=11.0)  # default TTL 2 s (llm-d defaultSpeculativeTTL)
    assert entry == gpu("p", speculative=True)
    assert index.lookup([10, 20, 30], stop="never") == {10: (gpu("p"), entry), 20: (entry,),
                                                         30: (gpu("q", speculative=True),)}
    assert index.expire(11.999) == 0
    assert index.expire(12.0) == 2
    assert index.lookup([10, 20, 30], stop="never") == {10: (gpu("p"),), 30: (gpu("q", speculative=True),)}
    assert index.expire(100.0) == 1 and index.expire(200.0) == 0
    assert index.lookup([10, 20, 30], stop="never") == {10: (gpu("p"),)}


def test_views_items_pod_keys_and_counts(index):
    index.add([1, 2], [10, 20], [gpu("p"), cpu("q", group=1)])
    index.add(None, [30], [gpu("p", speculative=True)])
    assert dict(index.items()) == {10: (gpu("p"), cpu("q", group=1)), 20: (gpu("p"), cpu("q", group=1)),
                                   30: (gpu("p", speculative=True),)}
    assert index.pod_keys("p") == {10, 20} and index.pod_keys("p", speculative=True) == {10, 20, 30}
    assert index.pod_keys("q", "gpu") == set() and index.pod_keys("q", "cpu") == {10, 20}
    assert index.pod_tier_counts() == {"p": {"gpu": 2}, "q": {"cpu": 2}}


# ---- bad input ---------------------------------------------------------------------------
@pytest.mark.parametrize(("call", "field"), [
    (lambda ix: ix.add([1], [], [gpu("p")]), "request_keys"),
    (lambda ix: ix.add([1], [0], [gpu("p")]), r"request_keys\[0\]"),
    (lambda ix: ix.add([1], [10], []), "entries"),
    (lambda ix: ix.add([1], [10], [gpu("p"), PodEntry("p", "hbm")]), "tier"),
    (lambda ix: ix.add([1, 2], [10, 20, 30], [gpu("p")]), "ratio|engine|request"),
    (lambda ix: ix.add([1], [10], "p"), "entries"),
    (lambda ix: ix.lookup([]), "request_keys"),
    (lambda ix: ix.lookup([10], "p1"), "pods"),
    (lambda ix: ix.lookup([10], [""]), "pod"),
    (lambda ix: ix.lookup([10], stop="sometimes"), "stop"),
    (lambda ix: ix.evict(1, "block", [gpu("p")]), "key_type"),
    (lambda ix: ix.evict(0 - 1, "engine", [gpu("p")]), "key"),
    (lambda ix: ix.evict(1, "engine", []), "entries"),
    (lambda ix: ix.clear("p", "hbm"), "tier"),
    (lambda ix: ix.clear(""), "pod"),
    (lambda ix: ix.get_request_key(2**64), "engine_key"),
    (lambda ix: ix.add_speculative([10], "p", now_s=1.0, ttl_s=-1.0), "ttl_s"),
    (lambda ix: ix.expire(float("nan")), "now_s"),
])
def test_bad_input_raises_value_error_naming_the_field_and_changes_nothing(index, call, field):
    index.add([5], [50], [gpu("keep")])
    with pytest.raises(ValueError, match=field):
        call(index)
    assert dict(index.items()) == {50: (gpu("keep"),)} and index.get_request_key(5) == 50


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"size": -1}, "size"), ({"size": 0}, "size"), ({"size": 1.5}, "size"), ({"size": True}, "size"),
    ({"pod_cache_size": 0}, "pod_cache_size"), ({"pod_cache_size": "10"}, "pod_cache_size"),
    ({"tiers": "gpu"}, "tiers"), ({"tiers": ["GPU"]}, "tier"),
])
def test_in_memory_bad_capacity_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        InMemoryIndex(**kwargs)


def test_a_tier_named_twice_is_refused_naming_it(index_factory):
    with pytest.raises(ValueError) as info:
        index_factory(tiers=["gpu", "cpu", "gpu"])
    assert str(info.value) == "tiers lists 'gpu' twice, got ['gpu', 'cpu', 'gpu']"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"pod": ""}, "PodEntry.pod must be a non-empty str, got ''"),
    ({"pod": "p", "tier": ""}, "PodEntry.tier must be a non-empty str, got ''"),
    ({"pod": "p", "speculative": 1}, "PodEntry.speculative must be a bool, got 1"),
    ({"pod": "p", "group": -1}, "PodEntry.group must be an integer in [0, 2**64) or None, got -1"),
    ({"pod": "p", "group": 2**64}, "PodEntry.group must be an integer in [0, 2**64) or None, got 18446744073709551616"),
    ({"pod": "p", "group": 2**70},
     "PodEntry.group must be an integer in [0, 2**64) or None, got 1180591620717411303424"),
    ({"pod": "p", "group": True}, "PodEntry.group must be an integer in [0, 2**64) or None, got True"),
    ({"pod": "p", "group": 1.0}, "PodEntry.group must be an integer in [0, 2**64) or None, got 1.0"),
])
def test_pod_entry_refuses_bad_fields_naming_them(kwargs, message):
    with pytest.raises(ValueError) as info:
        PodEntry(**kwargs)
    assert str(info.value) == message


def test_pod_entry_group_takes_what_an_event_group_idx_takes():
    """Events carry group_idx in [0, 2**64) (kvlab.events); every such group makes an entry."""
    from kvlab.events import BlockRemoved

    top = BlockRemoved([1], "GPU", group_idx=2**64 - 1).group_idx
    entry = PodEntry("p", group=top)
    assert entry.group == 2**64 - 1 and PodEntry.from_json(entry.to_json()) == entry
    with pytest.raises(ValueError, match="group_idx"):
        BlockRemoved([1], "GPU", group_idx=2**64)


def test_custom_tiers(index_factory):
    index = index_factory(tiers=("gpu", "hbm"))
    index.add([1], [10], [PodEntry("p", "HBM")])
    assert index.lookup([10]) == {10: (PodEntry("p", "hbm"),)}
    with pytest.raises(ValueError, match="cpu"):
        index.add([1], [10], [cpu("p")])


# ---- differential: every backend against naive dict-of-sets references -------------------
#: A static trie of request keys: each chain extends a prefix of another; PARENT_OF is the trie.
CHAINS = [[11, 12, 13, 14, 15], [11, 12, 23, 24], [11, 32, 33], [41, 42, 43]]
PARENT_OF = {chain[i]: chain[i - 1] for chain in CHAINS for i in range(1, len(chain))}
KEY_SPACE = sorted({key for chain in CHAINS for key in chain})
PODS = ["p0", "p1", "p2"]
VARIANTS = [lambda pod: gpu(pod), lambda pod: cpu(pod), lambda pod: gpu(pod, speculative=True)]  # 9 entries <= 10
#: The engine key of a block's first engine block, per engine:request block count ratio of a store.
ENGINE_KEY_OF = {"1:1": lambda k: k + 1000, "2:1": lambda k: 20000 + 10 * k + 1, "1:2": lambda k: k + 5000}
#: Every engine key a store can write (2:1 stores write two per block: +1 and +2).
ENGINE_SPACE = sorted({f(k) for f in ENGINE_KEY_OF.values() for k in KEY_SPACE} | {20002 + 10 * k for k in KEY_SPACE})


def engine_keys_for(keys: list[int], ratio: str) -> list[int] | None:
    if ratio == "none":
        return None
    if ratio == "2:1":
        return [ENGINE_KEY_OF["2:1"](k) + j for k in keys for j in (0, 1)]
    if ratio == "1:2" and len(keys) % 2 == 0:
        return [ENGINE_KEY_OF["1:2"](k) for k in keys[::2]]
    return [ENGINE_KEY_OF["1:1"](k) for k in keys]


class FlatReference:
    """The contract on plain dicts: request key -> set of entries, engine key -> {request key: position}."""

    def __init__(self) -> None:
        self.data: dict[int, set[PodEntry]] = {}
        self.engine: dict[int, dict[int, int]] = {}

    def add(self, engine_keys, request_keys, entries, parent) -> bool:  # noqa: ARG002 - the Index contract's signature
        if engine_keys is not None:
            n = max(len(engine_keys), len(request_keys))
            for i in range(n):
                engine_key = engine_keys[i * len(engine_keys) // n]
                self.engine.setdefault(engine_key, {})[request_keys[i * len(request_keys) // n]] = i
        for key in request_keys:
            self.data.setdefault(key, set()).update(entries)
        return True

    def _remove(self, keys, match) -> None:
        for key in keys:
            if key in self.data:
                self.data[key] = {e for e in self.data[key] if not match(e)}
                if not self.data[key]:
                    del self.data[key]

    def evict(self, key, key_type, entries) -> None:
        if key_type == "engine":
            if key not in self.engine:
                return
            request_keys = list(self.engine[key])
            self._remove(request_keys, lambda e: e in entries)
            if not any(k in self.data for k in request_keys):
                self.engine.pop(key, None)  # a cascade may have dropped it already
        else:
            self._remove([key], lambda e: e in entries)

    def clear(self, pod, tier) -> None:
        self._remove(list(self.data), lambda e: e.pod == pod and (tier is None or e.tier == tier))

    def get_request_key(self, engine_key):
        positions = self.engine.get(engine_key)
        return max(positions, key=lambda k: (positions[k], str(k))) if positions else None

    def lookup_never(self) -> dict[int, tuple[PodEntry, ...]]:
        return {k: tuple(sorted(self.data[k], key=entry_sort_key)) for k in KEY_SPACE if k in self.data}

    def pod_tier_counts(self) -> dict[str, dict[str, int]]:
        counts: dict[str, dict[str, int]] = {}
        for entries in self.data.values():
            for e in entries:
                if not e.speculative:
                    counts.setdefault(e.pod, {}).setdefault(e.tier, 0)
                    counts[e.pod][e.tier] += 1
        return {pod: dict(sorted(tiers.items())) for pod, tiers in sorted(counts.items())}

    def dynamo_matches(self, chain) -> dict[str, int]:
        """D6 on the static trie: +1 per pod at each key reached, stop at the first absent key."""
        scores: dict[str, int] = {}
        for key in chain:
            if key not in self.data:
                break
            for pod in {e.pod for e in self.data[key]}:
                scores[pod] = scores.get(pod, 0) + 1
        return dict(sorted(scores.items()))


class CascadeReference(FlatReference):
    """FlatReference plus Dynamo's rules on the static trie: the parent rule (D3) and the
    cascade (D4; a cascade's evictions drop engine mappings left without entries)."""

    def __init__(self) -> None:
        super().__init__()
        self.cascaded_any = False

    def add(self, engine_keys, request_keys, entries, parent) -> bool:
        if parent is not None and not {e.pod for e in entries} <= {e.pod for e in self.data.get(parent, ())}:
            return False
        return super().add(engine_keys, request_keys, entries, parent)

    def _remove(self, keys, match) -> None:
        super()._remove(keys, match)
        orphans = [k for k in self.data if any(a not in self.data for a in ancestors(k))]
        for key in orphans:
            del self.data[key]
        self.cascaded_any |= bool(orphans)
        for engine_key in [e for e, pos in self.engine.items() if set(pos) & set(orphans)]:
            if not any(k in self.data for k in self.engine[engine_key]):
                del self.engine[engine_key]


def ancestors(key: int) -> list[int]:
    out = []
    while key in PARENT_OF:
        key = PARENT_OF[key]
        out.append(key)
    return out


def prefix_scores(lookup: dict[int, tuple[PodEntry, ...]], chain: list[int]) -> dict[str, int]:
    """Per pod: consecutive keys of ``chain`` from the first where the pod has an entry."""
    scores: dict[str, int] = {}
    alive = None
    for key in chain:
        pods = {e.pod for e in lookup.get(key, ())}
        alive = pods if alive is None else alive & pods
        for pod in alive:
            scores[pod] = scores.get(pod, 0) + 1
    return scores


STORE = st.tuples(st.just("store"), st.integers(0, 2), st.sampled_from([0, 0, 1, 2]), st.integers(0, len(CHAINS) - 1),
                  st.integers(0, 5), st.integers(1, 4), st.sampled_from(["1:1", "1:1", "2:1", "1:2", "none"]))
# evict_held picks a (key, entry) the references hold, then an engine key mapped to it (else the request key)
EVICT_HELD = st.tuples(st.just("evict_held"), st.integers(0, 2**16), st.booleans())
OPS = st.one_of(
    STORE, STORE, STORE, EVICT_HELD, EVICT_HELD,
    st.tuples(st.just("evict_engine"), st.sampled_from(ENGINE_SPACE), st.integers(0, 2), st.integers(0, 2)),
    st.tuples(st.just("clear"), st.integers(0, 2), st.sampled_from([None, "gpu", "cpu"])),
)


def apply_op(op: tuple, index: Index, flat: FlatReference, cascade: CascadeReference) -> None:
    """One op on the index and both references; a store extends a prefix the pod holds (flat view)."""
    if op[0] == "store":
        _, pod_i, variant_i, chain_i, start, length, ratio = op
        chain, pod = CHAINS[chain_i], PODS[pod_i]
        start = min(start, prefix_scores(flat.lookup_never(), chain).get(pod, 0), len(chain) - 1)
        keys = chain[start:start + length]
        parent = chain[start - 1] if start else None
        engine_keys, entries = engine_keys_for(keys, ratio), [VARIANTS[variant_i](pod)]
        flat.add(engine_keys, keys, entries, parent)
        if cascade.add(engine_keys, keys, entries, parent) or not is_radix(index):
            index.add(engine_keys, keys, entries, parent=parent)
        else:  # D3: the pod lost the parent to a cascade
            with pytest.raises(ParentNotFoundError):
                index.add(engine_keys, keys, entries, parent=parent)
        return
    if op[0] == "clear":
        for target in (index, flat, cascade):
            target.clear(PODS[op[1]], op[2])
        return
    if op[0] == "evict_engine":
        key, key_type, entries = op[1], "engine", [VARIANTS[op[3]](PODS[op[2]])]
    else:
        held = sorted(((k, e) for k, es in flat.data.items() for e in es),
                      key=lambda ke: (ke[0], entry_sort_key(ke[1])))
        if not held:
            return
        key, entry = held[op[1] % len(held)]
        mapped = sorted(e for e, positions in flat.engine.items() if key in positions)
        key, key_type, entries = (mapped[op[1] % len(mapped)], "engine", [entry]) if mapped and op[2] else (
            key, "request", [entry])
    for target in (index, flat, cascade):
        target.evict(key, key_type, entries)


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
          deadline=None)
@given(ops=st.lists(OPS, min_size=5, max_size=30))
@example(ops=[  # a cascade, then a re-store that makes the prefix scores differ, then a store radix rejects (D3)
    ("store", 0, 0, 0, 0, 4, "1:1"), ("store", 1, 0, 0, 0, 2, "1:1"), ("evict_engine", 1012, 0, 0),
    ("evict_engine", 1012, 1, 0), ("store", 0, 0, 0, 1, 1, "1:1"), ("store", 0, 0, 0, 4, 1, "1:1")])
def test_differential_against_naive_references(index_factory, ops):
    """Flat backends equal FlatReference; RadixIndex equals CascadeReference (and its find_matches
    Dynamo's D6 count). Prefix scores: a cascade only lowers them, and before any cascade all agree."""
    index = index_factory()
    flat, cascade = FlatReference(), CascadeReference()
    model = cascade if is_radix(index) else flat
    for op in ops:
        apply_op(op, index, flat, cascade)
        got = index.lookup(KEY_SPACE, stop="never")
        assert got == model.lookup_never()
        assert index.pod_tier_counts() == model.pod_tier_counts()
        assert {e: index.get_request_key(e) for e in ENGINE_SPACE} == {e: model.get_request_key(e)
                                                                        for e in ENGINE_SPACE}
        for chain in CHAINS:
            held_prefix = {}
            for key in chain:
                if key not in got:
                    break
                held_prefix[key] = got[key]
            assert index.lookup(chain) == held_prefix
            ours, flats = prefix_scores(got, chain), prefix_scores(flat.lookup_never(), chain)
            assert all(ours.get(pod, 0) <= flats.get(pod, 0) for pod in PODS)  # a cascade only removes
            if not cascade.cascaded_any:
                assert ours == flats
            if is_radix(index):
                assert index.find_matches(chain) == cascade.dynamo_matches(chain)
