"""A radix-tree backend modelled on NVIDIA Dynamo's KV router indexer (rules D2-D7).

Models ``ai-dynamo/dynamo`` ``lib/llm/src/kv_router/indexer.rs`` :: ``RadixTree``
(docs/specs/index_blend.md §C.1). Dynamo keys a node by the block's local hash under its
parent; here a node is keyed by its *request key*, which is chained (it identifies the
whole prefix), so one dict ``request key → node`` replaces Dynamo's per-worker maps of
external hashes. Each node keeps its parent, its children and the entries holding it.

The rules that differ from the flat backends (:class:`~kvlab.index.InMemoryIndex`):

* a store with a ``parent`` the pod does not hold is rejected whole (D3,
  :class:`ParentNotFoundError`); the keys of a store form a chain under the parent (or
  the root), and a node that exists already keeps its place;
* a node left with no entry is dropped **with its whole subtree** (D4 cascade, also on
  :meth:`~kvlab.index.Index.clear`), so every node in the tree holds an entry;
* a cascade *evicts* the entries of the descendants it drops: an engine key whose request
  keys then hold no entry loses its mapping, as :meth:`~kvlab.index.Index.evict` would do
  (so ``get_request_key`` never resolves to a block the cascade removed, and a later store
  naming it as parent is skipped by the ingestor, as Dynamo skips a store whose parent it
  lost). Keys emptied by the operation itself keep the contract: evict by engine key drops
  that engine key once all its request keys are empty; clear keeps mappings (rule L8).

Lookup is the contract's (a dict walk over the query keys; only a cascade makes it differ
from the flat backends); :meth:`RadixIndex.find_matches` is Dynamo's raw tree walk (D6).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from kvlab.core.validate import check_flag
from kvlab.index.base import Index, _check_pods, entry_sort_key
from kvlab.index.memory import sorted_request_keys
from kvlab.index.types import ENGINE_KEY, KNOWN_TIERS, PodEntry, check_keys


class ParentNotFoundError(ValueError):
    """A store names a parent block that the storing pod does not hold (Dynamo
    ``ParentBlockNotFound``, rule D3); nothing of the store was added."""


class _Node:
    """One block: its request key, parent, children by request key, entries by pod."""

    __slots__ = ("key", "parent", "children", "by_pod")

    def __init__(self, key: int, parent: _Node | None) -> None:
        self.key = key
        self.parent = parent
        self.children: dict[int, _Node] = {}
        self.by_pod: dict[str, set[PodEntry]] = {}


class RadixIndex(Index):
    """A radix tree of request keys with the entries holding each block (Dynamo D2-D7).

    Args:
        tiers: the tier names entries may carry (see :class:`~kvlab.index.Index`).

    Example (Dynamo's T-D2/T-D3 with block ``i`` as request key ``1000 + i``):
        >>> from kvlab.index.types import PodEntry
        >>> index = RadixIndex()
        >>> index.add([100, 200, 300], [1001, 1002, 1003], [PodEntry("w0")])
        >>> index.add([100, 400, 500], [1001, 1004, 1005], [PodEntry("w1")])
        >>> index.find_matches([1001, 1002, 1003])
        {'w0': 3, 'w1': 1}
        >>> index.add([600], [1006], [PodEntry("w1")], parent=1002)
        Traceback (most recent call last):
        ...
        kvlab.index.radix.ParentNotFoundError: parent 1002 is not held by pod(s) ['w1']; nothing added
        >>> index.evict(100, "engine", [PodEntry("w0"), PodEntry("w1")])   # block 1 empty: cascade
        >>> index.tree_size("w0"), index.find_matches([1001, 1002]), index.get_request_key(200)
        (0, {}, None)
    """

    def __init__(self, *, tiers: Iterable[str] = KNOWN_TIERS) -> None:
        super().__init__(tiers=tiers)
        self._root = _Node(0, None)
        self._nodes: dict[int, _Node] = {}  # request key -> node; every node holds an entry
        self._engine: dict[int, dict[int, int]] = {}  # engine key -> {request key: position}
        self._engine_of: dict[int, set[int]] = {}  # request key -> engine keys mapped to it
        self._pod_nodes: dict[str, set[int]] = {}  # pod -> request keys holding its entries (Dynamo's lookup)

    # ---- Dynamo's own queries ----------------------------------------------------------
    def find_matches(self, request_keys: Sequence[int], early_exit: bool = False) -> dict[str, int]:
        """Dynamo's overlap scores (rule D6): walk from the root along ``request_keys``; at
        each node reached, every pod holding an entry there gets +1; stop at the first key
        that is not a child of the previous node, or (``early_exit``) right after a node
        held by exactly one pod.

        Args:
            request_keys: u64 keys in block order (may be empty).
            early_exit: stop once a single pod is left on the path.

        Returns:
            ``{pod: matched blocks}`` sorted by pod; pods with 0 are absent.

        Raises:
            ValueError: a bad key; ``early_exit`` not a bool.
        """
        keys = check_keys("request_keys", request_keys, allow_empty=True)
        early_exit = check_flag("early_exit", early_exit)
        scores: dict[str, int] = {}
        node = self._root
        for key in keys:
            node = node.children.get(key)
            if node is None:
                break
            for pod in node.by_pod:
                scores[pod] = scores.get(pod, 0) + 1
            if early_exit and len(node.by_pod) == 1:
                break
        return dict(sorted(scores.items()))

    def tree_size(self, pod: str) -> int:
        """Blocks (nodes) holding an entry of ``pod``, any tier, speculative included: the
        size Dynamo compares to break a cost tie (rule D9); 0 for an unknown pod.

        Raises:
            ValueError: ``pod`` not a non-empty string.
        """
        _check_pods([pod])
        return len(self._pod_nodes.get(pod, ()))

    def remove_worker(self, pod: str) -> None:
        """Dynamo ``remove_worker`` (rule D5): ``clear(pod)`` over every tier. (Dynamo's clear
        keeps the worker's empty block map and remove_worker deletes it; here a pod holding
        no block has no record either way, so the two are one.)

        Raises:
            ValueError: ``pod`` not a non-empty string.
        """
        self.clear(pod)

    # ---- backend primitives ------------------------------------------------------------
    def _add(self, triples: list[tuple[int, int, int]] | None, request_keys: list[int], entries: list[PodEntry],
             parent: int | None) -> None:
        at = self._root
        if parent is not None:
            at = self._nodes.get(parent)
            missing = sorted({e.pod for e in entries if at is None or e.pod not in at.by_pod})
            if missing:
                raise ParentNotFoundError(f"parent {parent} is not held by pod(s) {missing}; nothing added")
        for key in request_keys:
            node = self._nodes.get(key)
            if node is None:
                node = self._nodes[key] = at.children[key] = _Node(key, at)
            for entry in entries:
                node.by_pod.setdefault(entry.pod, set()).add(entry)
                self._pod_nodes.setdefault(entry.pod, set()).add(key)
            at = node
        for engine_key, request_key, position in triples or ():
            self._engine.setdefault(engine_key, {})[request_key] = position
            self._engine_of.setdefault(request_key, set()).add(engine_key)

    def _lookup(self, request_keys: list[int], pods: frozenset[str] | None,
                stop_at_miss: bool) -> dict[int, tuple[PodEntry, ...]]:
        found: dict[int, tuple[PodEntry, ...]] = {}
        for key in request_keys:
            node = self._nodes.get(key)
            if node is not None:
                kept = [e for pod, held in node.by_pod.items() if pods is None or pod in pods for e in held]
                if kept:
                    found[key] = tuple(sorted(kept, key=entry_sort_key))
                    continue
            if stop_at_miss:
                break
        return found

    def _evict(self, key: int, key_type: str, entries: list[PodEntry]) -> None:
        if key_type == ENGINE_KEY:
            if key not in self._engine:
                return
            request_keys = list(self._engine[key])
        else:
            request_keys = [key]
        emptied = []
        for request_key in request_keys:
            node = self._nodes.get(request_key)
            if node is None:
                continue
            for entry in entries:
                self._remove_entry(node, entry)
            if not node.by_pod:
                emptied.append(node)
        cascaded = self._drop(emptied)
        if key_type == ENGINE_KEY and not any(request_key in self._nodes for request_key in request_keys):
            self._unmap(key)
        self._prune_mappings(cascaded)

    def _clear(self, pod: str, tier: str | None) -> None:
        emptied = []
        for key in list(self._pod_nodes.get(pod, ())):
            node = self._nodes[key]
            for entry in [e for e in node.by_pod[pod] if tier is None or e.tier == tier]:
                self._remove_entry(node, entry)
            if not node.by_pod:
                emptied.append(node)
        self._prune_mappings(self._drop(emptied))

    def _request_keys_of(self, engine_key: int) -> list[int]:
        positions = self._engine.get(engine_key)
        return sorted_request_keys(positions) if positions else []

    def _items(self) -> Iterator[tuple[int, Iterable[PodEntry]]]:
        for key, node in self._nodes.items():
            yield key, [e for held in node.by_pod.values() for e in held]

    # ---- tree upkeep -------------------------------------------------------------------
    def _remove_entry(self, node: _Node, entry: PodEntry) -> None:
        held = node.by_pod.get(entry.pod)
        if held is None or entry not in held:
            return
        held.remove(entry)
        if not held:
            del node.by_pod[entry.pod]
            self._forget(entry.pod, node.key)

    def _drop(self, emptied: list[_Node]) -> list[int]:
        """Detach each emptied node still in the tree with its subtree (D4); returns the
        keys of dropped nodes that still held entries (the cascade's evictions)."""
        cascaded = []
        for top in emptied:
            if self._nodes.get(top.key) is not top:
                continue  # dropped already, under an emptied ancestor
            del top.parent.children[top.key]
            stack = [top]
            while stack:
                node = stack.pop()
                del self._nodes[node.key]
                stack.extend(node.children.values())
                if node.by_pod:
                    cascaded.append(node.key)
                    for pod in node.by_pod:
                        self._forget(pod, node.key)
        return cascaded

    def _forget(self, pod: str, key: int) -> None:
        keys = self._pod_nodes[pod]
        keys.discard(key)
        if not keys:
            del self._pod_nodes[pod]

    def _prune_mappings(self, cascaded: list[int]) -> None:
        """Forget engine keys whose request keys all lost their nodes to a cascade."""
        for request_key in cascaded:
            for engine_key in list(self._engine_of.get(request_key, ())):
                if not any(key in self._nodes for key in self._engine[engine_key]):
                    self._unmap(engine_key)

    def _unmap(self, engine_key: int) -> None:
        for request_key in self._engine.pop(engine_key):
            engine_keys = self._engine_of[request_key]
            engine_keys.discard(engine_key)
            if not engine_keys:
                del self._engine_of[request_key]
