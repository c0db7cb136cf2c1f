"""Pod loads and the pure selection rules behind the scorers: ties, Dynamo's cost and sampler, SGLang's balance check.

Everything here works on plain numbers, so the upstream examples can be checked exactly
(docs/specs/index_blend.md §C.2, rules D8-D10; docs/specs/engines.md §2.3); the scorers of
:mod:`kvlab.index.scorers` feed it the overlaps they read from an index. Every random
choice draws from a caller's seeded :class:`numpy.random.Generator` over candidates in the
caller's order, so a seed reproduces a choice.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from kvlab.core.validate import check_count, check_real, check_rng, check_str


@dataclass(frozen=True)
class PodLoad:
    """What a router knows about one pod's load, beside the index (the caller tracks it).

    Attributes:
        active_blocks: KV blocks in use by the pod's running requests (Dynamo's active
            decode blocks, rule D8).
        queued_prefill_blocks: prompt blocks already waiting for prefill on the pod (newer
            Dynamo adds them to a request's prefill cost, rule D8); may be fractional.
        running_requests: requests routed to the pod and not finished (SGLang's load,
            engines.md §2.3; Opal's outstanding count, rule O3).
        tree_size_blocks: blocks the router believes the pod caches (Dynamo's radix-tree
            size tie-break, rule D9; SGLang's smallest-tree fallback).

    Raises:
        ValueError: a field negative, not finite, or (``running_requests``,
            ``tree_size_blocks``) not an integer; the message names the field.

    Example:
        >>> PodLoad(active_blocks=12, running_requests=3)
        PodLoad(active_blocks=12.0, queued_prefill_blocks=0.0, running_requests=3, tree_size_blocks=0)
    """

    active_blocks: float = 0.0
    queued_prefill_blocks: float = 0.0
    running_requests: int = 0
    tree_size_blocks: int = 0

    def __post_init__(self) -> None:
        for name in ("active_blocks", "queued_prefill_blocks"):
            object.__setattr__(self, name, check_real(f"PodLoad.{name}", getattr(self, name), low=0.0))
        for name in ("running_requests", "tree_size_blocks"):
            object.__setattr__(self, name, check_count(f"PodLoad.{name}", getattr(self, name)))


#: The load of a pod the caller gave none for (Dynamo defaults a worker without load data to zero).
NO_LOAD = PodLoad()


def check_pod_list(pods: object) -> list[str]:
    """The routable pods as a list, in the caller's order, each named once (a repeat
    would weigh a pod twice in a uniform draw).

    Raises:
        ValueError: ``pods`` is a string or not a sequence, holds an empty or non-string id,
            or names a pod twice (the message names it and both positions).
    """
    if isinstance(pods, (str, bytes)) or not isinstance(pods, (Sequence, np.ndarray)):
        raise ValueError(f"pods must be a sequence of pod identifiers, got {pods!r}")
    first: dict[str, int] = {}
    for i, pod in enumerate(pods):
        check_str(f"pods[{i}]", pod, nonempty=True)
        if pod in first:
            raise ValueError(f"pods lists {pod!r} twice (pods[{first[pod]}] and pods[{i}])")
        first[pod] = i
    return list(first)


def check_loads(loads: object) -> Mapping[str, PodLoad]:
    """``loads`` (``{pod: PodLoad}``), or an empty mapping for ``None``.

    Raises:
        ValueError: not a mapping, or a value that is not a :class:`PodLoad`.
    """
    if loads is None:
        return {}
    if not isinstance(loads, Mapping):
        raise ValueError(f"loads must be a mapping pod -> PodLoad, got {loads!r}")
    for pod, load in loads.items():
        if not isinstance(load, PodLoad):
            raise ValueError(f"loads[{pod!r}] must be a PodLoad, got {type(load).__name__} {load!r}")
    return loads


def pick_uniform(candidates: Sequence[str], rng: np.random.Generator) -> str:
    """One of ``candidates`` uniformly at random (one draw from ``rng``), without a draw when there is one.

    Raises:
        ValueError: no candidates.
    """
    if not candidates:
        raise ValueError("candidates must not be empty")
    if len(candidates) == 1:
        return candidates[0]
    return candidates[int(check_rng("rng", rng).integers(len(candidates)))]


def pick_max(scores: Mapping[str, float], pods: Sequence[str], rng: np.random.Generator) -> str | None:
    """The pod with the highest score, uniformly at random among ties; a pod without a
    score counts 0, so no positive score means uniform over ``pods``.

    Opal's MaxPrefix rule O5 (no scores or max 0 -> Random; else random among the tied);
    also the max-score picker an llm-d scheduler puts after the longest-prefix scorer.

    Returns:
        A pod of ``pods``, or ``None`` when ``pods`` is empty (nothing to route to).

    Example:
        >>> import numpy as np
        >>> pick_max({"a": 2.0, "b": 3.0}, ["a", "b", "c"], np.random.default_rng(0))
        'b'
    """
    pods = check_pod_list(pods)
    if not pods:
        return None
    values = [float(scores.get(pod, 0.0)) for pod in pods]
    best = max(values)
    return pick_uniform([pod for pod, value in zip(pods, values) if value == best], rng)


def dynamo_cost(prefill_blocks: float, decode_blocks: float, *, overlap_weight: float = 1.0) -> float:
    """Dynamo's classic worker cost (rule D8): ``overlap_weight * prefill_blocks + decode_blocks``; lowest wins.

    Args:
        prefill_blocks: blocks the worker would still prefill for the request (its
            blocks minus the worker's cached overlap, plus queued prefill).
        decode_blocks: the worker's active blocks plus the request's blocks.
        overlap_weight: ``overlap_score_weight`` (default 1.0; 0 = pure load balancing).

    Raises:
        ValueError: a negative or non-finite argument.

    Example (router docs: W2 caches 5 of 10 blocks, 5 active decode blocks):
        >>> dynamo_cost(5, 5)
        10.0
    """
    return (check_real("overlap_weight", overlap_weight, low=0.0)
            * check_real("prefill_blocks", prefill_blocks, low=0.0)
            + check_real("decode_blocks", decode_blocks, low=0.0))


def dynamo_cost_2026(raw_prefill_blocks: float, decode_blocks: float, *, device_overlap_blocks: float = 0.0,
                     host_overlap_blocks: float = 0.0, disk_overlap_blocks: float = 0.0,
                     shared_beyond_blocks: float = 0.0, active_requests: float = 0.0,
                     overlap_score_credit: float = 1.0, credit_decay_factor: float = 1.0,
                     host_cache_hit_weight: float = 0.75, disk_cache_hit_weight: float = 0.25,
                     shared_cache_multiplier: float = 0.0, prefill_load_scale: float = 1.0,
                     decode_active_request_weight: float = 0.0) -> float:
    """Dynamo's newest worker cost (rule D10), lowest wins::

        credit = overlap_score_credit * credit_decay_factor * device_overlap_blocks
                 + host_cache_hit_weight * host_overlap_blocks + disk_cache_hit_weight * disk_overlap_blocks
                 + shared_cache_multiplier * shared_beyond_blocks
        cost   = prefill_load_scale * max(0, raw_prefill_blocks - credit) + decode_blocks
                 + decode_active_request_weight * active_requests

    Args:
        raw_prefill_blocks: the request's blocks plus the worker's queued prefill blocks.
        decode_blocks: the worker's decode blocks if the request goes there.
        device_overlap_blocks, host_overlap_blocks, disk_overlap_blocks: the worker's
            cached prefix per tier (GPU, pinned host memory, disk).
        shared_beyond_blocks: blocks of a shared store (e.g. Mooncake) at positions past
            the device prefix (Dynamo's ``hits_beyond(device overlap)``).
        credit_decay_factor: ``1 / (1 + decay * normalised excess queued prefill)``, 1
            without decay.
        The weights default to Dynamo's documented defaults (host 0.75; the shared
        multiplier is off unless a shared cache is configured).

    Raises:
        ValueError: a negative or non-finite argument.

    Example (upstream ``test_shared_cache_hits_scoring``: 4 blocks, block size 1, the shared
    store holds all 4, multiplier 0.5; W0 caches 2 on device):
        >>> dynamo_cost_2026(4, 0, device_overlap_blocks=2, shared_beyond_blocks=2, shared_cache_multiplier=0.5)
        1.0
        >>> dynamo_cost_2026(4, 0, shared_beyond_blocks=4, shared_cache_multiplier=0.5)
        2.0
    """
    values = {name: check_real(name, value, low=0.0) for name, value in locals().items()}
    credit = (values["overlap_score_credit"] * values["credit_decay_factor"] * values["device_overlap_blocks"]
              + values["host_cache_hit_weight"] * values["host_overlap_blocks"]
              + values["disk_cache_hit_weight"] * values["disk_overlap_blocks"]
              + values["shared_cache_multiplier"] * values["shared_beyond_blocks"])
    return (values["prefill_load_scale"] * max(0.0, values["raw_prefill_blocks"] - credit) + values["decode_blocks"]
            + values["decode_active_request_weight"] * values["active_requests"])


def dynamo_select(costs: Mapping[str, float], rng: np.random.Generator, *, temperature: float = 0.0,
                  tree_sizes: Mapping[str, int] | None = None) -> str | None:
    """Dynamo's choice among worker costs (rule D9).

    ``temperature == 0``: the lowest cost; ties go to the smallest tree size
    (``tree_sizes``, missing = 0), then uniformly at random. ``temperature > 0``: all costs
    equal -> uniform; otherwise worker ``i`` is drawn with probability proportional to
    ``exp(-(cost_i - min) / ((max - min) * temperature))`` (costs normalised by their range,
    negated: cheaper is likelier), by a cumulative sum over ``costs`` in order.

    Returns:
        A key of ``costs``, or ``None`` when ``costs`` is empty.

    Raises:
        ValueError: a non-finite cost, a negative or non-finite temperature, a bad ``rng``.

    Example (upstream selector tests, T-D9):
        >>> import numpy as np
        >>> dynamo_select({"w0": 5.0, "w1": 3.0, "w2": 7.0, "w3": 3.5}, np.random.default_rng(0))
        'w1'
    """
    temperature = check_real("temperature", temperature, low=0.0)
    check_rng("rng", rng)
    pods = list(costs)
    values = np.array([float(costs[pod]) for pod in pods], dtype=np.float64)
    if not np.all(np.isfinite(values)):
        raise ValueError(f"costs must be finite numbers, got {dict(costs)!r}")
    if not pods:
        return None
    low, high = float(values.min()), float(values.max())
    if temperature == 0.0:
        tied = [pod for pod, value in zip(pods, values) if value == low]
        sizes = {pod: (tree_sizes or {}).get(pod, 0) for pod in tied}
        smallest = min(sizes.values())
        return pick_uniform([pod for pod in tied if sizes[pod] == smallest], rng)
    if low == high:
        return pick_uniform(pods, rng)
    weights = np.exp(-(values - low) / ((high - low) * temperature))
    cumulative = np.cumsum(weights / weights.sum())
    index = int(np.searchsorted(cumulative, rng.random(), side="right"))
    return pods[min(index, len(pods) - 1)]


def sglang_imbalanced(loads: Iterable[int], *, abs_threshold: float, rel_threshold: float) -> bool:
    """SGLang router's load-imbalance test: ``max - min > abs_threshold`` and ``max > rel_threshold * min``.

    Models sgl-model-gateway ``CacheAwarePolicy::select_worker`` (docs/specs/engines.md
    §2.3): when it holds, the router ignores the cache and picks the least-loaded worker.
    No loads is balanced.

    Example (defaults 64 and 1.5):
        >>> sglang_imbalanced([100, 10], abs_threshold=64, rel_threshold=1.5)
        True
        >>> sglang_imbalanced([1000, 900], abs_threshold=64, rel_threshold=1.5)
        False
    """
    values = list(loads)
    if not values:
        return False
    low, high = min(values), max(values)
    return high - low > abs_threshold and high > rel_threshold * low
