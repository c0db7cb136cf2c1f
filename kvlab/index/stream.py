"""Score one query over an index fed by a stream of KV-event deliveries, step by step.

What a router sees as the events trickle in: at each step's time the deliveries due are
ingested (:class:`~kvlab.index.faults.DeliveryReplay`), then a
:class:`~kvlab.index.scorers.Scorer` scores the query on every pod and picks one. Run it on the
deliveries of a :class:`~kvlab.index.faults.FaultInjector` (delayed, coalesced, lossy) and on
the same messages delivered at once (the truth), and :meth:`StreamReplay.picks` says which
picks were wrong — index staleness, one step at a time (notebook 07).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl

from kvlab.core.validate import check_count, check_positive, check_real
from kvlab.index.faults import Delivery, DeliveryReplay
from kvlab.index.ingest import EventIngestor
from kvlab.index.memory import InMemoryIndex
from kvlab.index.scorers import LongestPrefixScorer, Scorer
from kvlab.index.select import check_pod_list

__all__ = ["StreamReplay", "replay_stream"]

_SCHEMA = {"step": pl.Int64, "time_s": pl.Float64, "pod": pl.String, "score": pl.Float64, "picked": pl.Boolean}


@dataclass(frozen=True, eq=False)
class StreamReplay:
    """What :func:`replay_stream` returns.

    Attributes:
        scores: one row per step and pod: ``step`` (i64), ``time_s`` (f64, the step's time),
            ``pod`` (str), ``score`` (f64, the query's score; 0.0 where the scorer gives none),
            ``picked`` (bool, the router's pick at that step).
        ingestor: the :class:`~kvlab.index.ingest.EventIngestor` after the last step (its
            ``index`` and its ``stats``: sequence gaps, duplicates ...).

    Example:
        >>> from kvlab.events import BlockStored, EventBatch
        >>> from kvlab.index.faults import FaultInjector
        >>> stored = BlockStored([101], None, [1, 2, 3, 4], 4, None, "GPU", None)
        >>> deliveries = FaultInjector(delay_s=5.0).inject([(0.0, "pod-a", 0, EventBatch(0.0, [stored]))])
        >>> query = EventIngestor(InMemoryIndex(), block_size=4).hasher.block_keys([1, 2, 3, 4])
        >>> run = replay_stream(deliveries, query, ["pod-a", "pod-b"], [0.0, 5.0], block_size=4)
        >>> run.scores.filter("picked")["pod"].to_list()[1:], run.scores["score"].to_list()
        (['pod-a'], [0.0, 0.0, 1.0, 0.0])
    """

    scores: pl.DataFrame
    ingestor: EventIngestor

    def picks(self, truth: StreamReplay | pl.DataFrame) -> pl.DataFrame:
        """Each step's pick and whether it was wrong: another pod's ``truth`` score is higher.

        Args:
            truth: the same query scored on the true cache state (e.g. :func:`replay_stream` of the
                messages delivered at once), or its ``scores`` frame; same steps and pods.

        Returns:
            One row per step: ``step``, ``time_s``, ``pick`` (str), ``wrong`` (bool).

        Raises:
            ValueError: ``truth`` does not score the same steps and pods.
        """
        frame = truth.scores if isinstance(truth, StreamReplay) else truth
        if not isinstance(frame, pl.DataFrame) or frame.select("step", "pod").rows() != \
                self.scores.select("step", "pod").rows():
            raise ValueError("truth must score the same steps and pods as this replay")
        best = frame.select("step", "pod", true_score="score").with_columns(
            best_score=pl.col("true_score").max().over("step"))
        return self.scores.join(best, on=["step", "pod"]).filter("picked").select(
            "step", "time_s", pick="pod", wrong=pl.col("true_score") < pl.col("best_score"))


def replay_stream(deliveries: Sequence[Delivery], query_keys: Sequence[int], pods: Sequence[str],
                  step_s: Sequence[float], *, scorer: Scorer | None = None, block_size: int = 16,
                  seed: int = 0) -> StreamReplay:
    """Score ``query_keys`` on ``pods`` after each step's deliveries reach a fresh index.

    An :class:`~kvlab.index.memory.InMemoryIndex` behind an
    :class:`~kvlab.index.ingest.EventIngestor` is fed ``deliveries`` up to each time of
    ``step_s`` (in order); then ``scorer`` scores the query and picks a pod (seeded ties).

    Args:
        deliveries: :class:`~kvlab.index.faults.Delivery` records sorted by ``delivered_s``.
        query_keys: the query's request keys (:func:`~kvlab.index.scorers.request_keys_for_tokens`).
        pods: the routable pods, each once.
        step_s: the steps' times, seconds, non-decreasing.
        scorer: the routing rule (default llm-d's :class:`~kvlab.index.scorers.LongestPrefixScorer`).
        block_size: the ingestor's block size (≥ 1).
        seed: the router's tie-breaking seed (≥ 0).

    Returns:
        A :class:`StreamReplay`.

    Raises:
        ValueError: a bad delivery list (as :class:`~kvlab.index.faults.DeliveryReplay`), pod
            list, time (not a number, or earlier than the step before), scorer, size or seed.
    """
    scorer = LongestPrefixScorer() if scorer is None else scorer
    if not isinstance(scorer, Scorer):
        raise ValueError(f"scorer must be a kvlab.index Scorer, got {type(scorer).__name__}")
    pods = check_pod_list(pods)
    times = [check_real(f"step_s[{i}]", t) for i, t in enumerate(step_s)]
    ingestor = EventIngestor(InMemoryIndex(), block_size=check_positive("block_size",
                                                                                  block_size))
    replay = DeliveryReplay(ingestor, deliveries)
    rng = np.random.default_rng(check_count("seed", seed))
    rows = []
    for step, t in enumerate(times):
        replay.advance_to(t)
        scores = scorer.score(query_keys, ingestor.index, pods)
        pick = scorer.select(query_keys, ingestor.index, pods, rng=rng)
        rows += [(step, t, pod, scores.get(pod, 0.0), pod == pick) for pod in pods]
    return StreamReplay(pl.DataFrame(rows, schema=_SCHEMA, orient="row"), ingestor)
