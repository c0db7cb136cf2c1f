"""Routers: the ``Router.select(request, view, now) -> Decision`` interface (cluster_sim.md §6.6).

A router sees a :class:`ClusterView`: load snapshots (live, or refreshed every
``snapshot_interval_s``, C18), the event-fed index (stale through the fault injector, C18),
the time model's prefill estimate and the router's own seeded generator (C24). It returns a
:class:`Decision`: the worker, optionally a decode worker (P/D), a cache transfer to run first
(``transfer_from``, ``transfer_blocks``: Mooncake's Conductor copies a prefix) or a rejection
(HTTP 429: a ``rejected`` row, never a dropped one).

=====================  ==============================================================
router                 rule
=====================  ==============================================================
:class:`RandomRouter`  uniform over the routable workers
:class:`RoundRobin`    in turn
:class:`LeastLoaded`   fewest requests routed to a worker and not finished (ties: lowest index; Vidur LOR)
:class:`ScorerRouter`  any :mod:`kvlab.index.scorers` scorer over the index (llm-d, Dynamo, SGLang, Opal)
=====================  ==============================================================

Mooncake's Conductor, local cache-aware and load balancing are in
:mod:`kvlab.sim.cluster.conductor` (registered in :data:`ROUTERS` there).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from kvlab.core.result import to_jsonable
from kvlab.core.validate import check_count, check_flag, check_real, check_str
from kvlab.index.base import Index
from kvlab.index.scorers import LongestPrefixScorer, Scorer, get_scorer
from kvlab.index.select import PodLoad


@dataclass(frozen=True)
class Decision:
    """A router's answer for one request.

    Attributes:
        worker: the worker to prefill on (a name from ``view.workers``).
        decode_worker: the decode worker (P/D); ``None``: the cluster picks the least loaded.
        transfer_from: copy prefix blocks from this worker's cache to ``worker`` (priced on the
            network) before the request is queued there.
        transfer_blocks: the request's leading blocks ``worker`` holds after the copy (>= 1 with
            ``transfer_from``); only those it does not hold at the decision are sent (none: no copy).
        reject: refuse the request (a ``rejected`` row).
        predicted_ttft_s: the router's TTFT prediction, if it makes one (reported).

    >>> Decision("w1").reject, Decision("w0", transfer_from="w1", transfer_blocks=8).transfer_blocks
    (False, 8)
    """

    worker: str
    decode_worker: str | None = None
    transfer_from: str | None = None
    transfer_blocks: int = 0
    reject: bool = False
    predicted_ttft_s: float | None = None

    def __post_init__(self) -> None:
        check_str("Decision.worker", self.worker, nonempty=True)
        check_str("Decision.decode_worker", self.decode_worker, nonempty=True, optional=True)
        check_str("Decision.transfer_from", self.transfer_from, nonempty=True, optional=True)
        check_count("Decision.transfer_blocks", self.transfer_blocks)
        check_flag("Decision.reject", self.reject)
        check_real("Decision.predicted_ttft_s", self.predicted_ttft_s, low=0.0, optional=True)
        if self.transfer_from is not None and self.transfer_from == self.worker:
            raise ValueError(f"Decision.transfer_from={self.transfer_from!r} is the chosen worker itself")
        if (self.transfer_from is None) != (self.transfer_blocks == 0):
            raise ValueError(f"Decision.transfer_from={self.transfer_from!r} needs transfer_blocks >= 1 and "
                             f"transfer_blocks={self.transfer_blocks} needs transfer_from")


@dataclass(frozen=True)
class WorkerLoad:
    """A worker's load signal as a router sees it (taken at ``time_s``; stale between snapshots).

    ``queued_prefill_s`` is the sum of the predicted prefill seconds of the requests routed to the
    worker whose first token is not out yet (on their way, waiting, loading or prefilling): each
    predicted once, when routed, by the time model on the prompt less the blocks the worker held
    then (or received by a cache transfer). Mooncake Conductor's ``T_queue``.

    >>> WorkerLoad(0.0, waiting=2, running=3).requests
    5
    """

    time_s: float
    waiting: int = 0
    running: int = 0
    fetching: int = 0
    free_blocks: int = 0
    used_blocks: int = 0
    cached_blocks: int = 0
    queued_prefill_tokens: int = 0
    queued_prefill_s: float = 0.0
    incoming: int = 0

    @property
    def requests(self) -> int:
        """Requests routed to the worker and not finished: incoming (routed, not yet queued: an
        arrival overhead, a cache transfer or a P/D handoff on the way) + waiting + loading + running."""
        return self.incoming + self.waiting + self.fetching + self.running


@dataclass(frozen=True)
class RequestView:
    """What a router may read of a request: position, id, arrival, lengths, engine block keys."""

    index: int
    request_id: int
    arrival_s: float
    input_tokens: int
    output_tokens: int
    engine_keys: Sequence[int]


class ClusterView:
    """The cluster as a router sees it (built by the simulation; see the module docstring).

    Attributes:
        workers: the routable (prefill or mixed) worker names, in index order.
        decode_workers: the decode worker names (P/D), maybe empty.
        index: the event-fed :class:`~kvlab.index.Index`, or ``None`` when no router needs it.
        rng: the router's seeded generator.
        block_size: engine block size, tokens.
        estimate_prefill_s: ``(prompt tokens, cached tokens) -> seconds`` of a prefill alone on a
            worker (the time model).
        estimate_transfer_s: ``blocks -> seconds`` to copy that many blocks between workers (the
            network device's read time, one operation).
        estimate_decode_s: ``(decoding requests, their context tokens in all) -> seconds`` of one
            decode-only step (the time model).
        shared_pods: index pods every worker reads besides its own (the global store, C20).
    """

    def __init__(self, workers: list[str], decode_workers: list[str], loads: Callable[[], Mapping[str, WorkerLoad]],
                 index: Index | None, request_keys: Callable[[RequestView], list[int]] | None,
                 estimate_prefill_s: Callable[[int, int], float], rng: np.random.Generator, block_size: int,
                 estimate_transfer_s: Callable[[int], float], estimate_decode_s: Callable[[int, int], float],
                 shared_pods: list[str] | None = None) -> None:
        self.workers, self.decode_workers = workers, decode_workers
        self._loads, self.index, self._request_keys = loads, index, request_keys
        self.estimate_prefill_s = estimate_prefill_s
        self.estimate_transfer_s = estimate_transfer_s
        self.estimate_decode_s = estimate_decode_s
        self.rng = rng
        self.block_size = block_size
        self.shared_pods = list(shared_pods or [])

    def loads(self) -> Mapping[str, WorkerLoad]:
        """Every worker's :class:`WorkerLoad` (live, or the last snapshot)."""
        return self._loads()

    def request_keys(self, request: RequestView) -> list[int]:
        """The request's index keys (llm-d request keys, rule L18).

        Raises:
            ValueError: the simulation keeps no index (the router did not ask for one).
        """
        if self._request_keys is None:
            raise ValueError("this simulation keeps no index; give the router uses_index = True")
        return self._request_keys(request)

    def prefix_blocks(self, request: RequestView, worker: str) -> int:
        """The request's leading blocks the index says ``worker`` holds or can read (any tier, its
        own or a shared pod's)."""
        keys = self.request_keys(request)
        hits = self.index.lookup(keys, [worker, *self.shared_pods]) if keys else {}
        return next((i for i, key in enumerate(keys) if key not in hits), len(keys))


class Router:
    """The router plug-in contract: :meth:`select`; ``uses_index`` asks for the event-fed index."""

    name = "router"
    uses_index = False

    def to_dict(self) -> dict[str, object]:
        """The router's type and name (echoed in a run's configuration)."""
        return {"type": type(self).__name__, "name": self.name}

    def select(self, request: RequestView, view: ClusterView, now: float) -> Decision:  # pragma: no cover
        """The :class:`Decision` for ``request`` at ``now`` (simulated seconds)."""
        raise NotImplementedError


class RandomRouter(Router):
    """Uniformly random over the routable workers (the router's seeded generator).

    >>> RandomRouter().name
    'random'
    """

    name = "random"

    def select(self, request: RequestView, view: ClusterView, now: float) -> Decision:  # noqa: ARG002
        """A uniform draw."""
        return Decision(view.workers[int(view.rng.integers(len(view.workers)))])


class RoundRobin(Router):
    """Each routable worker in turn, from ``w0`` (Dynamo's mocker default).

    >>> RoundRobin().name
    'round_robin'
    """

    name = "round_robin"

    def __init__(self) -> None:
        self.next = 0

    def select(self, request: RequestView, view: ClusterView, now: float) -> Decision:  # noqa: ARG002
        """The next worker in turn."""
        worker = view.workers[self.next % len(view.workers)]
        self.next += 1
        return Decision(worker)


class LeastLoaded(Router):
    """Fewest outstanding requests (:attr:`WorkerLoad.requests`: on their way, waiting, loading,
    running), ties to the lowest index (Vidur's least-outstanding-requests global scheduler).

    >>> LeastLoaded().name
    'least_loaded'
    """

    name = "least_loaded"

    def select(self, request: RequestView, view: ClusterView, now: float) -> Decision:  # noqa: ARG002
        """The argmin of outstanding requests."""
        loads = view.loads()
        return Decision(min(view.workers, key=lambda w: loads[w].requests))


class ScorerRouter(Router):
    """Any :class:`~kvlab.index.scorers.Scorer` over the event-fed index (llm-d, Dynamo, SGLang,
    Opal): the scorer's ``select`` with each worker's :class:`~kvlab.index.select.PodLoad` built
    from its load signal (active blocks, queued prefill blocks, outstanding requests, cached
    blocks as the tree size).

    Args:
        scorer: a Scorer, or a scorer name of :data:`~kvlab.index.scorers.SCORERS`
            (``None``: llm-d's longest prefix).

    Raises:
        ValueError: not a Scorer or an unknown name.

    >>> ScorerRouter("longest_prefix").scorer.name
    'longest_prefix'
    """

    name = "scorer"
    uses_index = True

    def __init__(self, scorer: Scorer | str | None = None) -> None:
        if scorer is None:
            scorer = LongestPrefixScorer()
        elif isinstance(scorer, str):
            scorer = get_scorer(scorer)
        if not isinstance(scorer, Scorer):
            raise ValueError(f"scorer must be a kvlab.index Scorer or its name, got {scorer!r}")
        self.scorer = scorer

    def to_dict(self) -> dict[str, object]:
        """Type, ``scorer:<name>`` and the scorer's options."""
        options = {k: to_jsonable(v) for k, v in sorted(vars(self.scorer).items()) if not k.startswith("_")}
        return {"type": type(self).__name__, "name": f"scorer:{self.scorer.name}", "scorer": options}

    def select(self, request: RequestView, view: ClusterView, now: float) -> Decision:  # noqa: ARG002
        """The scorer's pick (its own tie rule, the router's generator)."""
        loads = view.loads()
        bs = view.block_size
        pod_loads = {w: PodLoad(active_blocks=loads[w].used_blocks,
                                queued_prefill_blocks=loads[w].queued_prefill_tokens / bs,
                                running_requests=loads[w].requests, tree_size_blocks=loads[w].cached_blocks)
                     for w in view.workers}
        pod = self.scorer.select(view.request_keys(request), view.index, view.workers, loads=pod_loads,
                                 rng=view.rng)
        return Decision(pod)


#: Router names for :func:`get_router` (and the CLI's ``--router``).
ROUTERS: dict[str, Callable[[], Router]] = {
    "random": RandomRouter, "round_robin": RoundRobin, "least_loaded": LeastLoaded, "scorer": ScorerRouter,
}


def get_router(name: str) -> Router:
    """A router by name: one of :data:`ROUTERS`, or ``scorer:<scorer name>`` (e.g.
    ``scorer:dynamo_cost``) for a :class:`ScorerRouter` over that scorer.

    Raises:
        ValueError: an unknown name (the message lists them).

    >>> get_router("scorer:longest_prefix").scorer.name, get_router("least_loaded").name
    ('longest_prefix', 'least_loaded')
    """
    if isinstance(name, str) and name.startswith("scorer:"):
        return ScorerRouter(name.split(":", 1)[1])
    factory = ROUTERS.get(name) if isinstance(name, str) else None
    if factory is None:
        raise ValueError(f"unknown router {name!r}; routers are {sorted(ROUTERS)} or 'scorer:<scorer name>'")
    return factory()
