"""SGLang's radix eviction strategies (``--radix-eviction-policy``) as tiny node scores.

Models ``sgl-project/sglang : python/sglang/srt/mem_cache/evict_policy.py`` (SGLang
0.5.x, docs/specs/engines.md §2.1 rule S7), with upstream's class names. Each strategy has
one method, ``get_priority(node)``, returning a sortable score; the cache evicts the
evictable leaf with the **lowest** score first. Ties of every score are broken by LRU
(then node id), because :class:`~kvlab.engines.sglang.radix_cache.RadixCache` orders heap
entries as ``(score, last_access_time, node_id)`` — SGLang's ``TreeNode.__lt__`` compares
``last_access_time``.

==============  =============================================  ==================================
name            score (lowest evicted first)                   class
==============  =============================================  ==================================
``lru``         ``last_access_time``                           :class:`LRUStrategy` (default)
``lfu``         ``(hit_count, last_access_time)``              :class:`LFUStrategy`
``fifo``        ``creation_time``                              :class:`FIFOStrategy`
``mru``         ``-last_access_time``                          :class:`MRUStrategy`
``filo``        ``-creation_time``                             :class:`FILOStrategy`
``priority``    ``(priority, last_access_time)``               :class:`PriorityStrategy`
``slru``        ``(1 if hit_count >= 2 else 0, last_access)``  :class:`SLRUStrategy` (threshold 2)
``tlru``        ``(-1 if TEL-safe else 0, last_access_time)``  :class:`TLRUStrategy`
==============  =============================================  ==================================

``slru`` and ``tlru`` take parameters (SGLang's ``--radix-eviction-policy-config``, a JSON
object passed to the class as keyword arguments): pass them as ``config`` to
:func:`get_eviction_strategy` or as ``eviction_policy_config`` to the cache.

These are not :mod:`kvlab.policies` plug-ins: those are flat per-block policies (a
reference class plus numba kernel hooks over dense block ids) for cache-level replay,
where any block may be a victim. Radix eviction orders *whole leaf nodes* of a tree — a
victim is a variable-length token span, only leaves are candidates and a parent becomes
one when its last child goes (prefix closure, rule S8) — so a strategy here only scores a
node; the tree walk, the heap and the prefix closure stay in the cache. A score can order
victims but cannot pin a node (locks do that).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Protocol

from kvlab.core.validate import check_count, check_positive
from kvlab.engines.sglang.tree_node import TreeNode

#: A sortable eviction score: an int or a tuple of ints.
Score = int | tuple[int, int]


class EvictionStrategy(Protocol):
    """What the radix cache needs from a strategy (SGLang ``EvictionStrategy``): a name
    (its ``--radix-eviction-policy`` value) and a node score.

    Example:
        >>> strategy: EvictionStrategy = get_eviction_strategy("fifo")
        >>> strategy.name, strategy.get_priority(TreeNode(node_id=1, now=3))
        ('fifo', 3)
    """

    name: str

    def get_priority(self, node: TreeNode) -> Score:
        """The node's eviction score; lower is evicted first."""
        ...


class LRUStrategy:
    """Least recently used first. Models SGLang ``LRUStrategy``.

    Example:
        >>> LRUStrategy().get_priority(TreeNode(node_id=1, now=5))
        5
    """

    name = "lru"

    def get_priority(self, node: TreeNode) -> Score:
        """``last_access_time``."""
        return node.last_access_time


class LFUStrategy:
    """Fewest hits first, LRU among equals. Models SGLang ``LFUStrategy``.

    Example:
        >>> LFUStrategy().get_priority(TreeNode(node_id=1, now=5))
        (0, 5)
    """

    name = "lfu"

    def get_priority(self, node: TreeNode) -> Score:
        """``(hit_count, last_access_time)``."""
        return (node.hit_count, node.last_access_time)


class FIFOStrategy:
    """Oldest node first. Models SGLang ``FIFOStrategy``.

    Example:
        >>> FIFOStrategy().get_priority(TreeNode(node_id=1, now=5))
        5
    """

    name = "fifo"

    def get_priority(self, node: TreeNode) -> Score:
        """``creation_time``."""
        return node.creation_time


class MRUStrategy:
    """Most recently used first. Models SGLang ``MRUStrategy``.

    Example:
        >>> MRUStrategy().get_priority(TreeNode(node_id=1, now=5))
        -5
    """

    name = "mru"

    def get_priority(self, node: TreeNode) -> Score:
        """``-last_access_time``."""
        return -node.last_access_time


class FILOStrategy:
    """Newest node first. Models SGLang ``FILOStrategy``.

    Example:
        >>> FILOStrategy().get_priority(TreeNode(node_id=1, now=5))
        -5
    """

    name = "filo"

    def get_priority(self, node: TreeNode) -> Score:
        """``-creation_time``."""
        return -node.creation_time


class PriorityStrategy:
    """Lowest request priority first, LRU among equals. Models SGLang
    ``PriorityStrategy``; a node keeps the highest priority of the requests that
    inserted through it.

    Example:
        >>> PriorityStrategy().get_priority(TreeNode(node_id=1, now=5, priority=2))
        (2, 5)
    """

    name = "priority"

    def get_priority(self, node: TreeNode) -> Score:
        """``(priority, last_access_time)``."""
        return (node.priority, node.last_access_time)


class SLRUStrategy:
    """Segmented LRU: nodes hit fewer than ``protected_threshold`` times (probationary)
    go before the others (protected), LRU within a segment. Models SGLang
    ``SLRUStrategy`` (threshold 2: a new leaf has one hit, so one reuse protects it).

    Args:
        protected_threshold: hits that move a node to the protected segment (>= 1).

    Raises:
        ValueError: ``protected_threshold`` not an integer >= 1.

    Example:
        >>> node = TreeNode(node_id=1, now=5)
        >>> node.hit_count = 2
        >>> SLRUStrategy().get_priority(node)
        (1, 5)
    """

    name = "slru"

    def __init__(self, protected_threshold: int = 2) -> None:
        self.protected_threshold = check_positive("protected_threshold", protected_threshold)

    def get_priority(self, node: TreeNode) -> Score:
        """``(1 if hit_count >= protected_threshold else 0, last_access_time)``."""
        return (1 if node.hit_count >= self.protected_threshold else 0, node.last_access_time)


class TLRUStrategy:
    """Tail-optimized LRU (T-LRU, Zhang et al., arXiv:2510.15152): evict first the part of a
    conversation that cannot change its next turn's TTFT, then plain LRU.

    Models SGLang 0.5.23 ``TLRUStrategy``. A branch that reached ``L`` tokens
    (``node.tlru_history_len``) and whose next prompt is expected to add
    ``next_prompt_estimate`` tokens needs only ``L + next_prompt_estimate - threshold``
    of them cached; a node whose removal still leaves that many cached above it
    (``tlru_cached_prefix_len - len(key)``) is *TEL-safe* and scores -1, ahead of every
    other node (0); LRU within each group. Both parameters are token counts (the paper
    states blocks: multiply by the page size). The cache keeps the two node depths while
    it runs this strategy (:mod:`kvlab.engines.sglang.tree_core`), as SGLang's
    ``UnifiedRadixCache`` does — upstream refuses ``tlru`` on any other tree cache, and its
    server also refuses ``threshold <= next_prompt_estimate`` (then no node is ever
    TEL-safe and T-LRU is LRU, as with the defaults here).

    Args:
        threshold: the TTFT budget in tokens (an integer >= 0).
        next_prompt_estimate: the expected next prompt, in tokens (an integer >= 0).

    Raises:
        ValueError: a parameter that is not an integer >= 0.

    Example:
        >>> from kvlab.engines.sglang.tree_node import RadixKey
        >>> node = TreeNode(node_id=1, now=5)
        >>> node.tlru_cached_prefix_len = node.tlru_history_len = 100  # a leaf 100 tokens deep
        >>> strategy = TLRUStrategy(threshold=40)  # budget 100 - 40 = 60 tokens
        >>> node.key = RadixKey(range(30))  # 70 tokens above it: TEL-safe
        >>> strategy.get_priority(node)
        (-1, 5)
        >>> node.key = RadixKey(range(50))  # 50 above: it counts toward the budget
        >>> strategy.get_priority(node)
        (0, 5)
    """

    name = "tlru"

    def __init__(self, threshold: int = 0, next_prompt_estimate: int = 0) -> None:
        self.threshold = check_count("threshold", threshold)
        self.next_prompt_estimate = check_count("next_prompt_estimate", next_prompt_estimate)

    def get_priority(self, node: TreeNode) -> Score:
        """``(-1 if TEL-safe else 0, last_access_time)``."""
        budget = max(node.tlru_history_len + self.next_prompt_estimate - self.threshold, 0)
        tel_safe = node.tlru_cached_prefix_len - len(node.key) >= budget
        return (-1 if tel_safe else 0, node.last_access_time)


#: The strategies by ``--radix-eviction-policy`` name.
EVICTION_STRATEGIES: dict[str, type] = {cls.name: cls for cls in (
    LRUStrategy, LFUStrategy, FIFOStrategy, MRUStrategy, FILOStrategy, PriorityStrategy, SLRUStrategy,
    TLRUStrategy)}


def get_eviction_strategy(name: str, config: Mapping[str, int] | None = None) -> EvictionStrategy:
    """A fresh strategy object by ``--radix-eviction-policy`` name (case-insensitive, as
    SGLang lower-cases it), built with ``config`` as keyword arguments
    (``--radix-eviction-policy-config``).

    Models SGLang ``mem_cache/utils.py :: get_eviction_strategy``.

    Raises:
        ValueError: unknown name (the message lists the known names); ``config`` not a
            mapping, or a key the strategy does not take (names the key and the policy),
            or a bad value (from the strategy).

    Example:
        >>> get_eviction_strategy("LFU").name
        'lfu'
        >>> get_eviction_strategy("slru", {"protected_threshold": 4}).protected_threshold
        4
    """
    strategy = EVICTION_STRATEGIES.get(name.lower()) if isinstance(name, str) else None
    if strategy is None:
        raise ValueError(f"eviction_policy must be one of {list(EVICTION_STRATEGIES)}, got {name!r}")
    if config is not None and not isinstance(config, Mapping):
        raise ValueError(f"eviction_policy_config must be a mapping of keyword arguments or None, got {config!r}")
    if not config:
        return strategy()
    params = list(inspect.signature(strategy).parameters)
    unknown = [key for key in config if key not in params]
    if unknown:
        raise ValueError(f"eviction_policy_config has {unknown[0]!r}, which the {strategy.name!r} policy does not "
                         f"take (it takes {list(params) or 'nothing'})")
    return strategy(**config)
