"""A seeded fault injector between KV-event publishers and an index, and a replay clock.

Models what can happen to KV events on their way to a cluster index: Opal's worker-side
coalescing (events flushed every ``kvcevent_coalesce_time`` = 30 s, docs/specs/index_blend.md
O8/O26), network delay and jitter, loss, duplication, reordering and publisher restarts.
:meth:`FaultInjector.inject` turns messages ``(sent_s, pod, seq, batch)`` into
:class:`Delivery` records in delivery order; :class:`DeliveryReplay` feeds them to an
:class:`~kvlab.index.ingest.EventIngestor` up to any logical time, so a notebook can set
the index's view beside the true cache state at that time (staleness).

Per message, in send order (restarts first, see below): lost with probability ``loss_p``;
else delivered at ``flush(sent_s) + delay_s + U[0, jitter_s)``, where ``flush`` is the
identity, or with ``coalesce_s`` the pod's next flush tick strictly after ``sent_s``
(ticks at ``k * coalesce_s``, as Opal's periodic timer); with probability ``duplicate_p``
a copy follows ``duplicate_lag_s`` later. Then, per pod, each pair of consecutive
deliveries swaps places (and delivery times) with probability ``swap_p``. Ties keep send
order. Three uniforms are drawn per message and one per adjacent pair of a pod, whatever
the options, so the draws do not shift when one option changes.

Restarts ``(time_s, pod)``: the pod's publisher restarts with an empty cache. The injector
sends what kvlab takes a restarted publisher to send: at ``time_s`` a batch of seq 0 holding
``AllBlocksCleared()`` (SGLang's cache publishes it from its constructor; vLLM sends no
such batch, but its cache is empty too), with ``ts`` the restart time, or just after the
pod's last ``ts`` if that is later, so the ingestor sees a seq going back while the
publisher's clock goes on (its restart rule). The pod's later messages are renumbered
from 1, keeping their relative seqs. The restart batch is subject to the faults like any
other. The injector changes deliveries only: to model an engine restart, the source
stream must come from an engine restarted at the same time.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from kvlab.core.validate import check_count, check_real, check_str, rng_from_seed
from kvlab.events.types import AllBlocksCleared, EventBatch
from kvlab.index.ingest import EventIngestor


@dataclass(frozen=True)
class Delivery:
    """One message as the index receives it.

    Attributes:
        delivered_s: when it reaches the ingestor (logical seconds).
        sent_s: when the publisher sent it.
        pod: the publishing pod.
        seq: the sequence number it carries (renumbered after a restart).
        batch: the events.
        copy: a duplicate of an earlier delivery.
    """

    delivered_s: float
    sent_s: float
    pod: str
    seq: int
    batch: EventBatch
    copy: bool = False


def _check_message(i: int, message: object) -> tuple[float, str, int, EventBatch]:
    if not isinstance(message, Sequence) or isinstance(message, (str, bytes)) or len(message) != 4:
        raise ValueError(f"messages[{i}] must be (sent_s, pod, seq, EventBatch), got {message!r}")
    sent_s, pod, seq, batch = message
    sent_s = check_real(f"messages[{i}] sent_s", sent_s, low=0.0)
    check_str(f"messages[{i}] pod", pod, nonempty=True)
    seq = check_count(f"messages[{i}] seq", seq)
    if not isinstance(batch, EventBatch):
        raise ValueError(f"messages[{i}] batch must be an EventBatch, got {type(batch).__name__}")
    return sent_s, pod, seq, batch


class FaultInjector:
    """Delays, coalesces, loses, duplicates, reorders and restarts KV-event messages, seeded.

    Models the delivery path between engines' KV-event publishers and a cluster index
    (see the module docstring for the exact rules; coalescing is Opal's
    ``kvcevent_coalesce_time``, O8/O26). With every option at its default the output is
    the input in send order, each delivered when sent.

    Args:
        seed: an int seed or a ``numpy.random.Generator`` (drawn from in order).
        delay_s: fixed delay added to every message (>= 0).
        jitter_s: a random delay ``U[0, jitter_s)`` added per message (reorders when it
            exceeds the gap between messages).
        coalesce_s: hold each pod's messages and flush them every ``coalesce_s`` seconds
            (Opal's default is 30); ``None`` sends at once.
        loss_p: probability that a message is lost.
        duplicate_p: probability that a delivered message is delivered twice.
        duplicate_lag_s: how long after the original the copy arrives (>= 0).
        swap_p: probability that a delivery swaps with the pod's next one.
        restarts: ``(time_s, pod)`` publisher restarts.

    Attributes:
        stats: ``Counter`` of ``"messages"``, ``"lost"``, ``"duplicated"``, ``"swapped"``,
            ``"restarts"`` over every :meth:`inject` call.

    Raises:
        ValueError: a negative or non-finite time, a probability outside [0, 1], a
            ``coalesce_s`` of 0, a malformed restart (names the field and value).

    Example:
        >>> batch = EventBatch(0.0, [])
        >>> injector = FaultInjector(seed=1, coalesce_s=30.0)
        >>> [(d.delivered_s, d.seq) for d in injector.inject([(1.0, "p", 0, batch), (29.0, "p", 1, batch)])]
        [(30.0, 0), (30.0, 1)]
        >>> lossy = FaultInjector(seed=1, loss_p=1.0)
        >>> lossy.inject([(1.0, "p", 0, batch)]), lossy.stats["lost"]
        ([], 1)
    """

    def __init__(self, *, seed: int | np.random.Generator = 0, delay_s: float = 0.0, jitter_s: float = 0.0,
                 coalesce_s: float | None = None, loss_p: float = 0.0, duplicate_p: float = 0.0,
                 duplicate_lag_s: float = 0.0, swap_p: float = 0.0,
                 restarts: Iterable[tuple[float, str]] = ()) -> None:
        self.rng = rng_from_seed("seed", seed)
        self.delay_s = check_real("delay_s", delay_s, low=0.0)
        self.jitter_s = check_real("jitter_s", jitter_s, low=0.0)
        self.coalesce_s = check_real("coalesce_s", coalesce_s, low=0.0, low_open=True, optional=True)
        self.loss_p = check_real("loss_p", loss_p, low=0.0, high=1.0)
        self.duplicate_p = check_real("duplicate_p", duplicate_p, low=0.0, high=1.0)
        self.duplicate_lag_s = check_real("duplicate_lag_s", duplicate_lag_s, low=0.0)
        self.swap_p = check_real("swap_p", swap_p, low=0.0, high=1.0)
        self.restarts = self._check_restarts(restarts)
        self.stats: Counter = Counter()

    @staticmethod
    def _check_restarts(restarts: Iterable[tuple[float, str]]) -> list[tuple[float, str]]:
        if isinstance(restarts, (str, bytes)):
            raise ValueError(f"restarts must be (time_s, pod) pairs, got {restarts!r}")
        checked = []
        for i, restart in enumerate(restarts):
            if not isinstance(restart, Sequence) or isinstance(restart, (str, bytes)) or len(restart) != 2:
                raise ValueError(f"restarts[{i}] must be a (time_s, pod) pair, got {restart!r}")
            pod = check_str(f"restarts[{i}] pod", restart[1], nonempty=True)
            checked.append((check_real(f"restarts[{i}] time_s", restart[0], low=0.0), pod))
        return sorted(checked)

    def inject(self, messages: Iterable[Sequence]) -> list[Delivery]:
        """The deliveries of ``messages`` (any order; taken in send order, ties as given).

        Args:
            messages: ``(sent_s, pod, seq, batch)`` tuples: send time in seconds (>= 0),
                pod id, the publisher's seq, the :class:`~kvlab.events.EventBatch`.

        Returns:
            :class:`Delivery` records sorted by ``delivered_s`` (lost ones absent).

        Raises:
            ValueError: a malformed message (names its index and field).
        """
        checked = [_check_message(i, m) for i, m in enumerate(messages)]
        sent = self._restarted(sorted(checked, key=lambda m: m[0]))
        draws = self.rng.random((len(sent), 3))
        slots: list[tuple[float, int, Delivery]] = []  # (delivered_s, order, delivery)
        for order, ((sent_s, pod, seq, batch), (u_loss, u_dup, u_jitter)) in enumerate(zip(sent, draws)):
            self.stats["messages"] += 1
            if u_loss < self.loss_p:
                self.stats["lost"] += 1
                continue
            at = float(self._flush(sent_s) + self.delay_s + u_jitter * self.jitter_s)
            slots.append((at, 2 * order, Delivery(at, sent_s, pod, seq, batch)))
            if u_dup < self.duplicate_p:
                self.stats["duplicated"] += 1
                lag = at + self.duplicate_lag_s
                slots.append((lag, 2 * order + 1, Delivery(lag, sent_s, pod, seq, batch, copy=True)))
        slots.sort(key=lambda slot: slot[:2])
        return [d for _, _, d in sorted(self._swapped(slots), key=lambda slot: slot[:2])]

    def _flush(self, sent_s: float) -> float:
        """When a message sent at ``sent_s`` leaves its pod (Opal's flush tick, or at once)."""
        if self.coalesce_s is None:
            return sent_s
        return (math.floor(sent_s / self.coalesce_s) + 1) * self.coalesce_s

    def _restarted(self, sent: list[tuple[float, str, int, EventBatch]]) -> list[tuple[float, str, int, EventBatch]]:
        """Insert each restart's seq-0 clear and renumber the pod's later messages from 1."""
        out, last_ts, base = [], {}, {}  # base: pod -> (first seq after its last restart) or None
        restarts = iter(self.restarts)
        pending = next(restarts, None)
        for message in [*sent, (math.inf, "", 0, None)]:
            while pending is not None and pending[0] <= message[0]:
                time_s, pod = pending
                ts = max(time_s, math.nextafter(last_ts[pod], math.inf)) if pod in last_ts else time_s
                out.append((time_s, pod, 0, EventBatch(ts, [AllBlocksCleared()])))
                last_ts[pod], base[pod] = ts, None
                self.stats["restarts"] += 1
                pending = next(restarts, None)
            sent_s, pod, seq, batch = message
            if batch is None:
                break
            if pod in base:
                first = base[pod] = seq if base[pod] is None else base[pod]
                seq = seq - first + 1
            last_ts[pod] = max(last_ts.get(pod, batch.ts), batch.ts)
            out.append((sent_s, pod, seq, batch))
        return out

    def _swapped(self, slots: list[tuple[float, int, Delivery]]) -> list[tuple[float, int, Delivery]]:
        """Per pod, swap consecutive deliveries (times and places) with probability ``swap_p``."""
        by_pod: dict[str, list[int]] = {}
        for i, (_, _, delivery) in enumerate(slots):
            by_pod.setdefault(delivery.pod, []).append(i)
        out = list(slots)
        for pod in sorted(by_pod):
            positions = by_pod[pod]
            draws = self.rng.random(max(len(positions) - 1, 0))
            j = 0
            while j < len(positions) - 1:
                if draws[j] < self.swap_p:
                    a, b = positions[j], positions[j + 1]
                    (at_a, order_a, da), (at_b, order_b, db) = out[a], out[b]
                    out[a] = (at_a, order_a, _at(db, at_a))
                    out[b] = (at_b, order_b, _at(da, at_b))
                    self.stats["swapped"] += 1
                    j += 2
                else:
                    j += 1
        return out


def _at(delivery: Delivery, delivered_s: float) -> Delivery:
    return Delivery(delivered_s, delivery.sent_s, delivery.pod, delivery.seq, delivery.batch, delivery.copy)


class DeliveryReplay:
    """Feeds deliveries to an ingestor in order, up to a logical time, on demand.

    Lets a notebook step a clock and compare the index's view with the true cache state
    at each time (index staleness under delay, coalescing, loss ...).

    Args:
        ingestor: the :class:`~kvlab.index.ingest.EventIngestor` to feed.
        deliveries: :class:`Delivery` records sorted by ``delivered_s``.

    Attributes:
        now_s: the time reached (``-inf`` before the first :meth:`advance_to`).
        applied: deliveries handed to the ingestor so far.

    Raises:
        ValueError: ``ingestor`` not an EventIngestor, an item not a Delivery, or
            deliveries out of time order.

    Example:
        >>> from kvlab.index.memory import InMemoryIndex
        >>> replay = DeliveryReplay(EventIngestor(InMemoryIndex()),
        ...                         FaultInjector(delay_s=2.0).inject([(0.0, "p", 0, EventBatch(0.0, []))]))
        >>> replay.advance_to(1.0), replay.advance_to(2.0), replay.pending
        (0, 1, 0)
    """

    def __init__(self, ingestor: EventIngestor, deliveries: Sequence[Delivery]) -> None:
        if not isinstance(ingestor, EventIngestor):
            raise ValueError(f"ingestor must be an EventIngestor, got {type(ingestor).__name__}")
        self.deliveries = list(deliveries)
        for i, delivery in enumerate(self.deliveries):
            if not isinstance(delivery, Delivery):
                raise ValueError(f"deliveries[{i}] must be a Delivery, got {type(delivery).__name__}")
            if i and delivery.delivered_s < self.deliveries[i - 1].delivered_s:
                raise ValueError(f"deliveries[{i}] is delivered at {delivery.delivered_s}, before deliveries[{i - 1}] "
                                 f"({self.deliveries[i - 1].delivered_s}); sort them by delivered_s")
        self.ingestor = ingestor
        self.now_s = -math.inf
        self.applied = 0

    @property
    def pending(self) -> int:
        """Deliveries not yet handed to the ingestor."""
        return len(self.deliveries) - self.applied

    def advance_to(self, t_s: float) -> int:
        """Ingest every delivery with ``delivered_s <= t_s`` not yet ingested; returns how many.

        Raises:
            ValueError: ``t_s`` not a number, or earlier than :attr:`now_s` (time does not go back).
        """
        t_s = check_real("t_s", t_s, low=self.now_s, finite=False)  # >= now_s: time does not go back
        start = self.applied
        while self.applied < len(self.deliveries) and self.deliveries[self.applied].delivered_s <= t_s:
            d = self.deliveries[self.applied]
            self.ingestor.ingest_batch(d.pod, d.seq, d.batch)
            self.applied += 1
        self.now_s = float(t_s)
        return self.applied - start
