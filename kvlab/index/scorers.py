"""Scorers: plug-ins that rank pods for a request from one :class:`~kvlab.index.Index`.

Every scorer has the same shape (docs/specs/index_blend.md §A.7, §B.2, §C.2; Part E choices 4-6):

* ``score(request_keys, index, pods=None, *, loads=None) -> {pod: score}`` looks the
  request's keys up (filtered to ``pods``; ``None`` = every pod) and hands the lookup map to
  ``score_lookup(request_keys, hits, pods=None, loads=None)``, the pure part. What a score
  means is the scorer's own (Part E choice 5): llm-d's weighted block count, Opal's
  matched fraction, Dynamo's cost (:attr:`Scorer.lower_is_better`), SGLang's match rate.
* ``select(request_keys, index, pods, *, loads=None, rng) -> pod | None`` routes: ``pods``
  are the routable pods in the caller's order; ties are broken with the caller's seeded
  :class:`numpy.random.Generator` (Part E choice 6); ``None`` only when ``pods`` is empty.
* ``score_tokens(tokens, index, hasher, ...)`` is llm-d's flow (rule L21): tokens ->
  request keys (:func:`request_keys_for_tokens`) -> lookup -> score.
* ``loads`` is ``{pod: PodLoad}`` from the caller (the index knows no load); the two
  prefix scorers ignore it.

Scores only read the consecutive prefix of each pod from key 0, so they do not depend on
the lookup's stop rule (Part E choice 1), except that Opal's MaxPrefix, whose candidates are
the pods holding *any* key, asks for ``stop="never"``. Every tier counts as a hit for the
scorers other than llm-d's, which weighs tiers (Part E choice 4). Speculative entries
score as confirmed ones (rule L16). :data:`SCORERS` / :func:`get_scorer` name the four.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import ClassVar

import numpy as np

from kvlab.core.validate import check_choice, check_count, check_real, check_rng
from kvlab.hashing.base import BlockHasher, as_u32_tokens
from kvlab.index.base import Index
from kvlab.index.select import (
    NO_LOAD,
    PodLoad,
    check_loads,
    check_pod_list,
    dynamo_cost,
    dynamo_select,
    pick_max,
    pick_uniform,
    sglang_imbalanced,
)
from kvlab.index.types import KNOWN_TIERS, PodEntry, check_keys

#: llm-d ``DefaultKVCacheBackendConfig`` tier weights (rule L20); a tier not listed weighs 1.0.
DEFAULT_TIER_WEIGHTS = {"gpu": 1.0, "cpu": 0.8}
#: ``fallback`` of :class:`CacheAwareScorer`: below the threshold, the smallest tree or the least loaded pod.
CACHE_AWARE_FALLBACKS = ("smallest_tree", "least_loaded")

Hits = Mapping[int, Sequence[PodEntry]]


def request_keys_for_tokens(tokens: Sequence[int] | np.ndarray, hasher: BlockHasher, *,
                            truncate_prompt_tokens: int = 0) -> list[int]:
    """The request keys of a prompt (rule L21): its full blocks' keys from ``hasher``, as u64 ints.

    Args:
        tokens: ``int[num_tokens]`` token ids.
        hasher: the index's key scheme, e.g. :class:`kvlab.hashing.llmd_hash.LlmdHasher`
            (llm-d's request keys); its :meth:`~kvlab.hashing.base.BlockHasher.block_keys`
            gives the same integer keys on the event side and here (Opal quirk O12 fixed).
        truncate_prompt_tokens: keep only the LAST this many tokens when ``0 < N <
            num_tokens`` (llm-d ``TruncatePromptTokens``); 0 = no truncation.

    Raises:
        ValueError: invalid tokens, ``hasher`` not a ``BlockHasher``, a negative or
            non-integer ``truncate_prompt_tokens``.

    Example:
        >>> from kvlab.hashing.llmd_hash import LlmdHasher
        >>> hasher = LlmdHasher(block_size=1)
        >>> request_keys_for_tokens([1, 2, 3, 4, 5], hasher, truncate_prompt_tokens=3) == hasher.block_hashes([3, 4, 5])
        True
    """
    if not isinstance(hasher, BlockHasher):
        raise ValueError(f"hasher must be a kvlab.hashing BlockHasher, got {type(hasher).__name__} {hasher!r}")
    n = check_count("truncate_prompt_tokens", truncate_prompt_tokens)
    token_ids = as_u32_tokens(tokens)
    if 0 < n < len(token_ids):
        token_ids = token_ids[len(token_ids) - n:]
    return [int(key) for key in hasher.block_keys(token_ids)]


def prefix_weights(request_keys: Sequence[int], hits: Hits, weight: Callable[[PodEntry], float],
                   pods: Iterable[str] | None = None) -> dict[str, float]:
    """Each pod's summed weight over its consecutive run of keys from key 0 (llm-d's
    ``LongestPrefixScorer.Score`` walk, rule L20).

    The pods present at key 0 (after the ``pods`` filter; ``None`` = all) start active with
    their key-0 weight; at each later key an active pod present there adds its weight, an
    absent one leaves for good; the walk stops when none is active. A pod's weight at a key
    is the max of ``weight(entry)`` over its entries there. Keys missing from ``hits``
    count as absent, so a prefix-only map and a full map give the same result.

    Returns:
        ``{pod: summed weight}`` sorted by pod; pods absent at key 0 are not in it.

    Example:
        >>> hits = {10: [PodEntry("a"), PodEntry("b")], 20: [PodEntry("a")], 30: [PodEntry("a"), PodEntry("b")]}
        >>> prefix_weights([10, 20, 30], hits, lambda entry: 1.0)
        {'a': 3.0, 'b': 1.0}
    """
    keep = None if pods is None else set(pods) or None
    totals: dict[str, float] = {}
    active: set[str] | None = None
    for key in request_keys:
        here: dict[str, float] = {}
        for entry in hits.get(key, ()):
            if (keep is None or entry.pod in keep) and (active is None or entry.pod in active):
                here[entry.pod] = max(here.get(entry.pod, float("-inf")), weight(entry))
        if active is None:
            totals, active = dict(here), set(here)
        else:
            active &= here.keys()
            for pod in active:
                totals[pod] += here[pod]
        if not active:
            break
    return dict(sorted(totals.items()))


def _count(_entry: PodEntry) -> float:
    return 1.0


class Scorer(ABC):
    """The scorer plug-in contract (see the module docstring for the common shape).

    Subclasses implement :meth:`score_lookup`; :meth:`select` defaults to the highest
    score, uniformly at random among ties (a pod without a score counts 0).

    Attributes:
        name: the registry name (:data:`SCORERS`).
        lower_is_better: ``True`` when a score is a cost.
        lookup_stop: the ``stop`` this scorer asks :meth:`Index.lookup` for.
    """

    name: ClassVar[str]
    lower_is_better: ClassVar[bool] = False
    lookup_stop: ClassVar[str] = "first_miss"

    @abstractmethod
    def score_lookup(self, request_keys: Sequence[int], hits: Hits, pods: Sequence[str] | None = None,
                     loads: Mapping[str, PodLoad] | None = None) -> dict[str, float]:
        """Scores from a lookup map ``{request key: entries}`` (either lookup stop rule)."""

    def score(self, request_keys: Sequence[int], index: Index, pods: Sequence[str] | None = None, *,
              loads: Mapping[str, PodLoad] | None = None) -> dict[str, float]:
        """Look ``request_keys`` up in ``index`` (filtered to ``pods``) and score the pods.

        Args:
            request_keys: u64 request keys in block order; empty is allowed (rule L20).
            index: any :class:`~kvlab.index.Index` backend.
            pods: the pods to score (each once), or ``None`` for every pod in the index.
            loads: ``{pod: PodLoad}`` for load-aware scorers.

        Raises:
            ValueError: a bad key, ``pods`` a string, holding a non-string or naming a pod
                twice, bad ``loads``.
        """
        keys = check_keys("request_keys", request_keys, allow_empty=True)
        pod_list = None if pods is None else check_pod_list(pods)
        loads = check_loads(loads)
        hits = index.lookup(keys, pod_list, stop=self.lookup_stop) if keys else {}
        return self.score_lookup(keys, hits, pod_list, loads)

    def score_tokens(self, tokens: Sequence[int] | np.ndarray, index: Index, hasher: BlockHasher, *,
                     pods: Sequence[str] | None = None, loads: Mapping[str, PodLoad] | None = None,
                     truncate_prompt_tokens: int = 0) -> dict[str, float]:
        """llm-d's ``ScoreTokens`` flow (rule L21): :func:`request_keys_for_tokens`, then :meth:`score`.

        Raises:
            ValueError: as :func:`request_keys_for_tokens` and :meth:`score`.
        """
        keys = request_keys_for_tokens(tokens, hasher, truncate_prompt_tokens=truncate_prompt_tokens)
        return self.score(keys, index, pods, loads=loads)

    def select(self, request_keys: Sequence[int], index: Index, pods: Sequence[str], *,
               loads: Mapping[str, PodLoad] | None = None, rng: np.random.Generator) -> str | None:
        """The pod to route to: the highest score, uniformly at random among ties.

        Args:
            pods: the routable pods (order fixes which draw picks which pod).
            rng: a seeded :class:`numpy.random.Generator`.

        Returns:
            A pod of ``pods``, or ``None`` when ``pods`` is empty.

        Raises:
            ValueError: as :meth:`score`; ``rng`` not a Generator.
        """
        pod_list = check_pod_list(pods)
        check_rng("rng", rng)
        if not pod_list:
            return None
        return pick_max(self.score(request_keys, index, pod_list, loads=loads), pod_list, rng)


class LongestPrefixScorer(Scorer):
    """llm-d's longest-prefix scorer with tier weights (rule L20, ``kvblock_scorer.go``).

    A pod's score is the sum, over its consecutive run of keys from key 0, of its max tier
    weight at each key; pods absent at key 0 are absent from the result; no keys -> ``{}``.

    Args:
        tier_weights: ``{tier: weight}``, default :data:`DEFAULT_TIER_WEIGHTS` (gpu 1.0, cpu
            0.8); an entry whose tier is not listed weighs 1.0.
        tiers: the tier names ``tier_weights`` may use (default
            :data:`~kvlab.index.types.KNOWN_TIERS`; pass an index's ``tiers`` for custom ones).

    Raises:
        ValueError: a weight name not in ``tiers`` (e.g. ``"GPU"``: names are lower-case), a
            negative or non-finite weight.

    Example:
        >>> from kvlab.index.memory import InMemoryIndex
        >>> index = InMemoryIndex()
        >>> index.add(None, [1001, 1002], [PodEntry("pod-a")])
        >>> index.add(None, [1002], [PodEntry("pod-b", "cpu")])
        >>> LongestPrefixScorer().score([1001, 1002], index)
        {'pod-a': 2.0}
        >>> LongestPrefixScorer().score([1002], index)
        {'pod-a': 1.0, 'pod-b': 0.8}
    """

    name = "longest_prefix"

    def __init__(self, tier_weights: Mapping[str, float] | None = None, *, tiers: Iterable[str] = KNOWN_TIERS) -> None:
        weights = dict(DEFAULT_TIER_WEIGHTS if tier_weights is None else tier_weights)
        allowed = set(tiers)
        for tier in weights:
            if tier not in allowed:
                raise ValueError(f"tier_weights names unknown tier {tier!r}; known tiers are {sorted(allowed)} "
                                 "(pass tiers=index.tiers for custom tiers)")
        self.tier_weights = {tier: check_real(f"tier_weights[{tier!r}]", value, low=0.0)
                             for tier, value in weights.items()}

    def score_lookup(self, request_keys: Sequence[int], hits: Hits, pods: Sequence[str] | None = None,
                     loads: Mapping[str, PodLoad] | None = None) -> dict[str, float]:  # noqa: ARG002 - the Scorer contract's signature; this scorer ignores load
        """Weighted consecutive-prefix scores (``loads`` unused)."""
        return prefix_weights(request_keys, hits, lambda entry: self.tier_weights.get(entry.tier, 1.0), pods)


class MaxPrefixScorer(Scorer):
    """Opal's MaxPrefix policy (rules O5, O11) over integer keys (quirk O12 fixed).

    Candidates are the pods holding *any* of the request's keys; a candidate's score is its
    consecutive run of keys from key 0 divided by the request's key count (in ``[0, 1]``;
    tiers are not weighed). :meth:`select`: no score above 0 -> uniform over ``pods``;
    otherwise uniform among the pods tied at the max.

    Example:
        >>> from kvlab.index.memory import InMemoryIndex
        >>> index = InMemoryIndex()
        >>> index.add(None, [1, 2, 3], [PodEntry("w1")])
        >>> MaxPrefixScorer().score([1, 2, 4], index)
        {'w1': 0.6666666666666666}
    """

    name = "max_prefix"
    lookup_stop = "never"

    def score_lookup(self, request_keys: Sequence[int], hits: Hits, pods: Sequence[str] | None = None,
                     loads: Mapping[str, PodLoad] | None = None) -> dict[str, float]:  # noqa: ARG002 - the Scorer contract's signature; this scorer ignores load
        """Matched fractions of every candidate (``loads`` unused)."""
        keep = None if pods is None else set(pods) or None
        candidates = {entry.pod for key in request_keys for entry in hits.get(key, ())
                      if keep is None or entry.pod in keep}
        matched = prefix_weights(request_keys, hits, _count, pods)
        return {pod: matched.get(pod, 0.0) / len(request_keys) for pod in sorted(candidates)}


class DynamoCostScorer(Scorer):
    """Dynamo's KV-router cost (rules D8, D9): ``overlap_weight * prefill_blocks + decode_blocks``, lowest wins.

    For a request of ``n`` keys and a pod with ``overlap`` consecutive cached blocks from
    key 0 (any tier, Part E choice 4): ``prefill_blocks = n - overlap + queued_prefill_blocks``
    and ``decode_blocks = active_blocks + n`` (:class:`PodLoad`; a pod without a load has
    zero load). Keys cover full blocks only, so this equals Dynamo's ``prefill tokens /
    block size``. Scored pods: ``pods`` (in its order) when given; else the pods in ``loads``
    (in its order) followed by the other pods holding key 0 (sorted) — Dynamo scores every
    worker it knows, so a pod holding the prefix is never left out for lacking a load.

    Args:
        overlap_weight: ``overlap_score_weight`` (default 1.0; 0 = pure load balancing).
        temperature: ``router_temperature`` (default 0: argmin; see :func:`dynamo_select`).

    Raises:
        ValueError: a negative or non-finite weight or temperature.

    Example:
        >>> from kvlab.index.memory import InMemoryIndex
        >>> index = InMemoryIndex()
        >>> index.add(None, [1, 2], [PodEntry("w0")])
        >>> loads = {"w0": PodLoad(active_blocks=3), "w1": PodLoad()}
        >>> DynamoCostScorer().score([1, 2, 3, 4], index, loads=loads)
        {'w0': 9.0, 'w1': 8.0}
        >>> DynamoCostScorer().score([1, 2, 3, 4], index, loads={"w1": PodLoad()})  # w0 holds key 0: scored too
        {'w1': 8.0, 'w0': 6.0}
    """

    name = "dynamo_cost"
    lower_is_better = True

    def __init__(self, overlap_weight: float = 1.0, temperature: float = 0.0) -> None:
        self.overlap_weight = check_real("overlap_weight", overlap_weight, low=0.0)
        self.temperature = check_real("temperature", temperature, low=0.0)

    def score_lookup(self, request_keys: Sequence[int], hits: Hits, pods: Sequence[str] | None = None,
                     loads: Mapping[str, PodLoad] | None = None) -> dict[str, float]:
        """Costs of the scored pods, in their order."""
        loads = loads or {}
        overlap = prefix_weights(request_keys, hits, _count, pods)
        candidates = pods or list(dict.fromkeys([*loads, *overlap]))  # overlap: the pods at key 0, sorted
        n = len(request_keys)
        costs = {}
        for pod in candidates:
            load = loads.get(pod, NO_LOAD)
            costs[pod] = dynamo_cost(n - overlap.get(pod, 0.0) + load.queued_prefill_blocks, load.active_blocks + n,
                                     overlap_weight=self.overlap_weight)
        return costs

    def select(self, request_keys: Sequence[int], index: Index, pods: Sequence[str], *,
               loads: Mapping[str, PodLoad] | None = None, rng: np.random.Generator) -> str | None:
        """Dynamo's choice (rule D9): the lowest cost at temperature 0 (ties: smallest
        ``tree_size_blocks``, then uniform), else a softmax draw; ``None`` for no pods."""
        pod_list = check_pod_list(pods)
        check_rng("rng", rng)
        loads = check_loads(loads)
        costs = self.score(request_keys, index, pod_list, loads=loads) if pod_list else {}
        sizes = {pod: loads.get(pod, NO_LOAD).tree_size_blocks for pod in pod_list}
        return dynamo_select(costs, rng, temperature=self.temperature, tree_sizes=sizes)


class CacheAwareScorer(Scorer):
    """SGLang router's ``cache_aware`` policy over the index (docs/specs/engines.md §2.3).

    Models sgl-model-gateway ``CacheAwarePolicy::select_worker``: when the pods' loads
    (``running_requests``) are imbalanced (:func:`sglang_imbalanced`) route to the least
    loaded pod; otherwise take the best match rate (consecutive cached blocks from key 0 /
    request blocks, any tier); above ``cache_threshold`` (strictly) route to the best-matching
    pod (ties: fewer running requests, then smaller tree, as the gateway's event-driven path
    orders them), else fall back to the pod with the smallest tree (``fallback=
    "smallest_tree"``, the SGLang router of 2025 and the spec) or the least loaded one
    (``"least_loaded"``, the 2026 gateway's approximate-tree paths). Remaining ties:
    uniformly at random. :meth:`score` gives the match rates of pods with a match.

    Args:
        cache_threshold: min match rate for cache routing, in ``[0, 1]`` (default 0.3).
        balance_abs_threshold: load gap above which loads may be imbalanced (default 64).
        balance_rel_threshold: ratio max/min above which loads may be imbalanced (default 1.5).
        fallback: one of :data:`CACHE_AWARE_FALLBACKS`.

    Raises:
        ValueError: a threshold out of range or not finite, an unknown ``fallback``.

    Example:
        >>> import numpy as np
        >>> from kvlab.index.memory import InMemoryIndex
        >>> index = InMemoryIndex()
        >>> index.add(None, [1, 2], [PodEntry("a")])
        >>> scorer = CacheAwareScorer()
        >>> scorer.score([1, 2, 3], index)
        {'a': 0.6666666666666666}
        >>> rng = np.random.default_rng(0)
        >>> scorer.select([1, 2, 3], index, ["a", "b"], rng=rng)
        'a'
        >>> scorer.select([1, 2, 3], index, ["a", "b"], loads={"a": PodLoad(running_requests=100)}, rng=rng)
        'b'
    """

    name = "cache_aware"

    def __init__(self, cache_threshold: float = 0.3, balance_abs_threshold: float = 64,
                 balance_rel_threshold: float = 1.5, fallback: str = "smallest_tree") -> None:
        self.cache_threshold = check_real("cache_threshold", cache_threshold, low=0.0, high=1.0)
        self.balance_abs_threshold = check_real("balance_abs_threshold", balance_abs_threshold, low=0.0)
        self.balance_rel_threshold = check_real("balance_rel_threshold", balance_rel_threshold, low=0.0)
        self.fallback = check_choice("fallback", fallback, CACHE_AWARE_FALLBACKS)

    def score_lookup(self, request_keys: Sequence[int], hits: Hits, pods: Sequence[str] | None = None,
                     loads: Mapping[str, PodLoad] | None = None) -> dict[str, float]:  # noqa: ARG002 - the Scorer contract's signature; this scorer ignores load
        """Match rates of the pods holding key 0 (``loads`` unused)."""
        matched = prefix_weights(request_keys, hits, _count, pods)
        return {pod: blocks / len(request_keys) for pod, blocks in matched.items()}

    def select(self, request_keys: Sequence[int], index: Index, pods: Sequence[str], *,
               loads: Mapping[str, PodLoad] | None = None, rng: np.random.Generator) -> str | None:
        """The SGLang rule above; ``None`` for no pods."""
        pod_list = check_pod_list(pods)
        check_rng("rng", rng)
        loads = check_loads(loads)
        if not pod_list:
            return None
        load = {pod: loads.get(pod, NO_LOAD) for pod in pod_list}

        def lowest(candidates: list[str], field: str) -> list[str]:
            best = min(getattr(load[pod], field) for pod in candidates)
            return [pod for pod in candidates if getattr(load[pod], field) == best]

        if sglang_imbalanced([load[pod].running_requests for pod in pod_list], abs_threshold=self.balance_abs_threshold,
                             rel_threshold=self.balance_rel_threshold):
            return pick_uniform(lowest(pod_list, "running_requests"), rng)
        rates = self.score(request_keys, index, pod_list)
        best_rate = max(rates.values(), default=0.0)
        if best_rate > self.cache_threshold:
            matched = [pod for pod in pod_list if rates.get(pod) == best_rate]
            return pick_uniform(lowest(lowest(matched, "running_requests"), "tree_size_blocks"), rng)
        field = "tree_size_blocks" if self.fallback == "smallest_tree" else "running_requests"
        return pick_uniform(lowest(pod_list, field), rng)


#: The scorers by name (:func:`get_scorer`).
SCORERS: dict[str, type[Scorer]] = {cls.name: cls for cls in
                                    (LongestPrefixScorer, MaxPrefixScorer, DynamoCostScorer, CacheAwareScorer)}


def get_scorer(name: str, **options: object) -> Scorer:
    """A scorer by registry name (case-insensitive, as Opal matches policy names, rule O1), built with ``options``.

    Raises:
        ValueError: an unknown name (the message lists the names); bad options, as the class raises.

    Example:
        >>> get_scorer("Longest_Prefix", tier_weights={"gpu": 1.0, "cpu": 0.5}).tier_weights
        {'gpu': 1.0, 'cpu': 0.5}
    """
    cls = SCORERS.get(name.lower()) if isinstance(name, str) else None
    if cls is None:
        raise ValueError(f"unknown scorer {name!r}; known scorers are {sorted(SCORERS)}")
    try:
        return cls(**options)
    except TypeError as err:  # an option the class does not take
        raise ValueError(f"bad options for scorer {cls.name!r}: {err}") from None
