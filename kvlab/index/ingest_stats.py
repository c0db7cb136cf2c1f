"""The counters of :class:`~kvlab.index.EventIngestor`: batch outcomes, skips, gaps, errors.

Kept apart from the ingestor (and from the index state), as the counters of every kvlab
component are; the rules they count are in :mod:`kvlab.index.ingest`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

#: What :meth:`~kvlab.index.EventIngestor.ingest_batch` did with a batch.
BATCH_OUTCOMES = ("applied", "gap", "restart", "duplicate", "late")
#: Why an event applied nothing (keys of :attr:`IngestStats.skipped`); ``"deferred"``: held for
#: its parent (it may be applied later).
SKIP_REASONS = ("unknown_parent", "deferred", "partial_block", "unresolved_tier_update", "empty", "error")
#: Fates of deferred stores (keys of :attr:`IngestStats.deferred`).
DEFERRED_FATES = ("resolved", "overflow", "cleared")


@dataclass(frozen=True)
class SeqGap:
    """Batches a publisher skipped: seqs ``expected_seq .. got_seq - 1`` never arrived in time.

    Attributes:
        pod: the publishing pod.
        expected_seq: the seq the ingestor waited for.
        got_seq: the seq that arrived instead (> ``expected_seq``).
        data_parallel_rank: the publisher's DP rank (``None`` when the batch had none).
    """

    pod: str
    expected_seq: int
    got_seq: int
    data_parallel_rank: int | None = None


@dataclass(frozen=True)
class EventError:
    """An event the index refused (it raised); the rest of its batch was applied.

    Attributes:
        pod: the publishing pod.
        seq: the batch's sequence number.
        event_index: the event's 0-based position in the batch.
        event_type: ``"BlockStored"``, ``"BlockRemoved"`` or ``"AllBlocksCleared"``.
        message: the error's type and text.
    """

    pod: str
    seq: int
    event_index: int
    event_type: str
    message: str


@dataclass
class IngestStats:
    """Counters of an :class:`EventIngestor` (kept apart from the index state).

    Attributes:
        batches: batches by outcome (:data:`BATCH_OUTCOMES`).
        applied: events applied, by kind: ``"BlockStored"``, ``"tier_update"``,
            ``"BlockRemoved"``, ``"AllBlocksCleared"``.
        skipped: events that applied nothing, by reason (:data:`SKIP_REASONS`).
        deferred: stores held for an unknown parent (``skipped["deferred"]``) by fate
            (:data:`DEFERRED_FATES`): ``"resolved"`` (applied once a store mapped the
            parent), ``"overflow"`` (dropped, the holder full), ``"cleared"`` (dropped, their
            pod cleared or restarted).
        dropped_blocks: canonical blocks (full blocks of the stores' tokens) that unknown
            parents kept out of the index, by reason: ``"unknown_parent"`` (dropped on
            arrival), ``"overflow"``, ``"cleared"``.
        unresolved_engine_keys: engine keys of tier updates that no request key maps.
        unmapped_engine_keys: engine keys past a store's last full canonical block.
        extra_keys_ignored: stores whose ``extra_keys`` held a non-null entry (not hashed).
        gaps: every gap, in order found.
        errors: every refused event, in order.
        pods: per pod, counts of ``"batches"`` (applied), ``"gaps"``, ``"missed_seqs"``
            (total width of the gaps), ``"duplicates"``, ``"late"``, ``"restarts"``.
        last_seq: the last applied seq per publisher ``(pod, data_parallel_rank)``.
    """

    batches: Counter = field(default_factory=Counter)
    applied: Counter = field(default_factory=Counter)
    skipped: Counter = field(default_factory=Counter)
    deferred: Counter = field(default_factory=Counter)
    dropped_blocks: Counter = field(default_factory=Counter)
    unresolved_engine_keys: int = 0
    unmapped_engine_keys: int = 0
    extra_keys_ignored: int = 0
    gaps: list[SeqGap] = field(default_factory=list)
    errors: list[EventError] = field(default_factory=list)
    pods: dict[str, Counter] = field(default_factory=dict)
    last_seq: dict[tuple[str, int | None], int] = field(default_factory=dict)
