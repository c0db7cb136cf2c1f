"""KV events into an index: llm-d's event pool, with sequence numbers checked per publisher.

Models llm-d ``pkg/kvevents/pool.go`` :: ``processEventBatch`` / ``handleDeviceTierUpdate``
(docs/specs/index_blend.md §A.4-A.6, rules L17-L19). Per event, in batch order:

* ``BlockStored`` with tokens: the parent engine key (if any) must resolve through
  :meth:`~kvlab.index.Index.get_request_key`, else the event is skipped (``unknown_parent=
  "drop"``, llm-d) or held until a store maps that key (``"defer"``, kvlab's recovery:
  :mod:`kvlab.index.deferred`); request keys are
  recomputed from the tokens at the canonical block size (:class:`~kvlab.hashing.llmd_hash.LlmdHasher`,
  rule L18: the chain starts at the parent's request key, or at the root of the LoRA name,
  else of the topic's model); a trailing partial canonical block gets no key; tokens shorter
  than one canonical block drop the event (L17). Then ``add(engine keys, request keys,
  [pod@tier(+group)])``.
* ``BlockStored`` with engine keys and no tokens: a tier update (L17, a CPU offload): each
  engine key resolved (deduplicated, unknown ones skipped), ``add(None, keys, [entry])``.
* ``BlockRemoved``: ``evict(engine key, "engine", [entry])`` per hash.
* ``AllBlocksCleared``: ``clear(pod)``; only the event's tier when it names one (a
  kvlab extension, issue 7; llm-d logs the tier and clears all, L19).

Choices where llm-d is silent or kvlab differs (documented, tested):

* An unknown parent drops the whole chain under llm-d's rule: a later store chaining from
  the skipped blocks names a parent that is unknown too. Both modes count what they keep
  out of the index: stores (:attr:`IngestStats.skipped`, :attr:`IngestStats.deferred`) and
  canonical blocks (:attr:`IngestStats.dropped_blocks`); held stores are
  :attr:`EventIngestor.pending_stores` (docs/index_truth.md).

* Sequence numbers (llm-d does not check them) are tracked per publisher, the pair
  (pod, ``data_parallel_rank``): vLLM's DP ranks publish separately, each from seq 0. A
  batch ahead of the next expected seq is a *gap*: reported (:class:`SeqGap`, a counter,
  ``on_gap``), then applied. A batch behind it is not applied: a *late* one if its seq was
  inside a reported gap or below the first seq seen, a *duplicate* otherwise — so nothing
  removed comes back.
* Publisher restart: a batch behind the expected seq whose publish time ``ts`` is later
  than that of every batch applied from the publisher (its seq went back while its clock
  went on) is a restart. The restarted engine's cache is empty, so the pod is cleared (all
  tiers: index entries do not record the DP rank), tracking restarts at 0 (a seq above 0
  is then a gap) and the batch is applied. A duplicate keeps its original ``ts``, so it is
  never taken for a restart; batches all sent with one ``ts`` never restart. A batch ahead
  of the expected seq but older than the last applied one was sent before a restart and
  delayed past it: it is *late*, not applied.
* Engine keys past the last full canonical block are not mapped (counted): llm-d would
  map them to the last request key, whose tokens they do not hold. Engine and canonical
  block sizes that are not multiples of one another are an error for that event.
* ``extra_keys`` are not hashed: keys are text keys (llm-d's multimodal features are
  not modelled); stores that carried any are counted.
* With engine blocks smaller than canonical ones, a parent engine key resolves to its
  canonical block's key even when it is not that block's last engine block (llm-d's
  ``GetRequestKey``, L6): such a store chains from the wrong point, as upstream.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from kvlab.core.validate import check_choice, check_flag, check_positive, check_str, check_u64
from kvlab.events.types import BlockRemoved, BlockStored, EventBatch
from kvlab.events.wire import DecodedBatch
from kvlab.hashing.llmd_hash import LlmdHasher
from kvlab.index.base import Index
from kvlab.index.deferred import DEFAULT_MAX_DEFERRED, DeferredStores, HeldStore
from kvlab.index.ingest_stats import SKIP_REASONS, EventError, IngestStats, SeqGap
from kvlab.index.types import ENGINE_KEY, PodEntry, tier_of_medium

#: What :class:`EventIngestor` does with a store whose parent it does not know:
#: ``"drop"`` it (llm-d) or ``"defer"`` it until a store maps the parent.
UNKNOWN_PARENT_MODES = ("drop", "defer")
#: The topic prefix of llm-d's sharding key (``kv@<pod-id>@<model>``, rule L19).
TOPIC_PREFIX = "kv"


@dataclass
class _Publisher:
    expected: int
    last_ts: float
    missing: list[tuple[int, int]]  # [expected, got) ranges of reported gaps since the last restart


def parse_topic(topic: str) -> tuple[str, str]:
    """``(pod, model)`` of an llm-d topic ``kv@<pod-id>@<model>`` (rule L19; the model may hold ``@``).

    Raises:
        ValueError: a topic not of that form (quoted in the message).

    Example:
        >>> parse_topic("kv@pod-1@meta-llama/Llama-3.1-8B")
        ('pod-1', 'meta-llama/Llama-3.1-8B')
    """
    parts = topic.split("@", 2) if isinstance(topic, str) else []
    if len(parts) != 3 or parts[0] != TOPIC_PREFIX or not parts[1] or not parts[2]:
        raise ValueError(f"topic must be 'kv@<pod-id>@<model>' (llm-d's KV-events topic), got {topic!r}")
    return parts[1], parts[2]


class EventIngestor:
    """Applies KV-event batches to an :class:`~kvlab.index.Index`, as llm-d's event pool does.

    Models llm-d ``kvevents.Pool`` (rules L17-L19) plus per-publisher sequence checks; see
    the module docstring for the rules and choices. A refused event (the index raised
    ``ValueError`` or ``LookupError``: an unknown tier, a parent the radix index does not
    hold ...) is recorded in :attr:`stats` and the rest of its batch is applied.

    Args:
        index: the index to feed.
        block_size: llm-d's canonical block size (``BlockSizeTokens``, default 16).
        hash_seed: llm-d ``HashSeed`` (default ``""``).
        model_name: the model salted into the chain root when the caller gives none
            (:meth:`ingest` takes it from the topic).
        hasher: an :class:`~kvlab.hashing.llmd_hash.LlmdHasher` to use instead of the
            three arguments above (give one or the other).
        on_gap: called as ``on_gap(pod, expected_seq, got_seq)`` for every gap.
        use_groups: put an event's ``group_idx`` into :attr:`PodEntry.group` (llm-d
            ``pod@tier+group``); ``False`` ignores groups.
        initial_seq: the seq a publisher's first batch should carry (``0`` for a stream
            recorded from its start: a higher first seq is a gap); ``None``: the first
            batch seen sets the baseline (a subscriber joining a running publisher).
        unknown_parent: ``"drop"`` (llm-d: skip a store whose parent engine key is
            unknown) or ``"defer"`` (hold it until a store maps the parent; see
            :mod:`kvlab.index.deferred`).
        max_deferred: stores held at most under ``"defer"`` (the oldest is dropped, counted).

    Attributes:
        stats: the :class:`IngestStats`.
        hasher: the request-key hasher.

    Raises:
        ValueError: ``index`` not an Index, ``hasher`` given with the other hashing
            arguments, a bad block size, seed, model name, ``initial_seq``,
            ``unknown_parent`` or ``max_deferred``.

    Example:
        >>> from kvlab.index.memory import InMemoryIndex
        >>> index = InMemoryIndex()
        >>> ingestor = EventIngestor(index, block_size=4)
        >>> stored = BlockStored([11, 12], None, list(range(8)), 4, None, "GPU", None)
        >>> ingestor.ingest_batch("pod-a", 0, EventBatch(0.0, [stored]))
        'applied'
        >>> ingestor.ingest_batch("pod-a", 2, EventBatch(1.0, [BlockRemoved([12], "GPU")]))
        'gap'
        >>> ingestor.ingest_batch("pod-a", 2, EventBatch(1.0, [BlockRemoved([12], "GPU")]))
        'duplicate'
        >>> len(index.pod_keys("pod-a")), ingestor.stats.gaps
        (1, [SeqGap(pod='pod-a', expected_seq=1, got_seq=2, data_parallel_rank=None)])
    """

    def __init__(self, index: Index, *, block_size: int | None = None, hash_seed: str | None = None,
                 model_name: str | None = None, hasher: LlmdHasher | None = None,
                 on_gap: Callable[[str, int, int], object] | None = None, use_groups: bool = True,
                 initial_seq: int | None = None, unknown_parent: str = "drop",
                 max_deferred: int = DEFAULT_MAX_DEFERRED) -> None:
        if not isinstance(index, Index):
            raise ValueError(f"index must be a kvlab.index.Index, got {type(index).__name__}")
        if hasher is None:
            hasher = LlmdHasher(block_size=16 if block_size is None else block_size,
                                hash_seed=hash_seed or "", model_name=model_name or "")
        elif not isinstance(hasher, LlmdHasher):
            raise ValueError(f"hasher must be an LlmdHasher, got {type(hasher).__name__}")
        elif (block_size, hash_seed, model_name) != (None, None, None):
            raise ValueError("give either hasher or block_size / hash_seed / model_name, not both")
        if on_gap is not None and not callable(on_gap):
            raise ValueError(f"on_gap must be callable or None, got {on_gap!r}")
        use_groups = check_flag("use_groups", use_groups)
        self.index = index
        self.hasher = hasher
        self.on_gap = on_gap
        self.use_groups = use_groups
        self.initial_seq = None if initial_seq is None else check_u64("initial_seq", initial_seq)
        self.unknown_parent = check_choice("unknown_parent", unknown_parent, UNKNOWN_PARENT_MODES)
        self._deferred = DeferredStores(check_positive("max_deferred", max_deferred))  # used under "defer" only
        self.stats = IngestStats()
        self._publishers: dict[tuple[str, int | None], _Publisher] = {}

    @property
    def block_size(self) -> int:
        """The canonical block size (tokens per request key)."""
        return self.hasher.block_size

    @property
    def max_deferred(self) -> int:
        """Stores held at most under ``unknown_parent="defer"``."""
        return self._deferred.max_stores

    @property
    def pending_stores(self) -> list[HeldStore]:
        """The stores held now for a parent not yet mapped, oldest first (``"defer"`` only)."""
        return self._deferred.held()

    # ---- batches ----------------------------------------------------------------------
    def ingest(self, message: DecodedBatch) -> str:
        """Apply a decoded ZMQ message; the pod and model come from its topic (rule L19).

        Returns:
            The batch's outcome, one of :data:`BATCH_OUTCOMES`.

        Raises:
            ValueError: not a :class:`~kvlab.events.DecodedBatch`, or a topic not of the
                form ``kv@<pod-id>@<model>``.
        """
        if not isinstance(message, DecodedBatch):
            raise ValueError(f"message must be a DecodedBatch, got {type(message).__name__}")
        pod, model = parse_topic(message.topic)
        return self.ingest_batch(pod, message.seq, message.batch, model=model)

    def ingest_batch(self, pod: str, seq: int, batch: EventBatch, *, model: str | None = None) -> str:
        """Apply one batch of ``pod``'s events, in order, if its seq says it is new.

        Args:
            pod: the publishing pod's identifier.
            seq: the batch's sequence number (per publisher, from 0).
            batch: the events.
            model: the model salted into chain roots (``None``: the hasher's).

        Returns:
            ``"applied"``, ``"gap"`` (applied after a gap), ``"restart"`` (pod cleared,
            then applied), ``"duplicate"`` or ``"late"`` (not applied).

        Raises:
            ValueError: an empty or non-string pod or model, a bad seq, ``batch`` not an
                :class:`~kvlab.events.EventBatch`. Errors of single events are recorded
                in :attr:`stats` instead.
        """
        check_str("pod", pod, nonempty=True)
        check_str("model", model, nonempty=True, optional=True)
        seq = check_u64("seq", seq)
        if not isinstance(batch, EventBatch):
            raise ValueError(f"batch must be an EventBatch, got {type(batch).__name__}")
        outcome = self._sequence(pod, seq, batch)
        self.stats.batches[outcome] += 1
        if outcome in ("duplicate", "late"):
            self.stats.pods.setdefault(pod, Counter())["late" if outcome == "late" else "duplicates"] += 1
            return outcome
        self.stats.pods.setdefault(pod, Counter())["batches"] += 1
        self.stats.last_seq[(pod, batch.data_parallel_rank)] = seq
        for i, event in enumerate(batch.events):
            self._apply(pod, seq, i, event, model)
        return outcome

    def _sequence(self, pod: str, seq: int, batch: EventBatch) -> str:
        """Update the publisher's tracking for ``seq``; the batch's outcome."""
        key = (pod, batch.data_parallel_rank)
        state = self._publishers.get(key)
        outcome = "applied"
        if state is None:  # seqs below the baseline were never seen: "late" if they come
            start = seq if self.initial_seq is None else self.initial_seq
            state = self._publishers[key] = _Publisher(start, batch.ts, [(0, start)] if start else [])
        elif batch.ts < state.last_ts and seq >= state.expected:  # sent before a restart, delayed past it
            return "late"
        elif seq < state.expected:
            if batch.ts <= state.last_ts:
                return "late" if any(lo <= seq < hi for lo, hi in state.missing) else "duplicate"
            self.index.clear(pod)
            self._drop_held(self._deferred.drop_pod(pod), "cleared")
            self.stats.pods.setdefault(pod, Counter())["restarts"] += 1
            state.expected, state.missing = 0, []
            outcome = "restart"
        if seq > state.expected:
            self._gap(pod, state, seq, batch.data_parallel_rank)
            outcome = "gap" if outcome == "applied" else outcome
        state.expected, state.last_ts = seq + 1, max(state.last_ts, batch.ts)
        return outcome

    def _gap(self, pod: str, state: _Publisher, seq: int, rank: int | None) -> None:
        gap = SeqGap(pod, state.expected, seq, rank)
        state.missing.append((state.expected, seq))
        self.stats.gaps.append(gap)
        counts = self.stats.pods.setdefault(pod, Counter())
        counts["gaps"] += 1
        counts["missed_seqs"] += seq - state.expected
        if self.on_gap is not None:
            self.on_gap(pod, state.expected, seq)

    # ---- events -----------------------------------------------------------------------
    def _apply(self, pod: str, seq: int, i: int, event: object, model: str | None) -> None:
        try:
            kind = self._apply_event(pod, seq, i, event, model)
        except (ValueError, LookupError) as err:
            self._error(pod, seq, i, event, err)
            return
        if kind in SKIP_REASONS:
            self.stats.skipped[kind] += 1
        else:
            self.stats.applied[kind] += 1

    def _error(self, pod: str, seq: int, i: int, event: object, err: Exception) -> None:
        self.stats.errors.append(EventError(pod, seq, i, type(event).__name__, f"{type(err).__name__}: {err}"))
        self.stats.skipped["error"] += 1

    def _entry(self, pod: str, medium: str | None, group_idx: int | None) -> PodEntry:
        return PodEntry(pod, tier_of_medium(medium), group=group_idx if self.use_groups else None)

    def _apply_event(self, pod: str, seq: int, i: int, event: object, model: str | None) -> str:
        """Apply one event; the kind applied or the reason it was skipped."""
        if isinstance(event, BlockStored):
            return self._store(pod, seq, i, event, model)
        if isinstance(event, BlockRemoved):
            entry = self._entry(pod, event.medium, event.group_idx)
            for key in event.block_keys_u64():
                self.index.evict(key, ENGINE_KEY, [entry])
                if self._deferred:  # only held stores need the note
                    self._deferred.note_removed(key, entry)
            return "BlockRemoved"
        medium = getattr(event, "medium", None)  # AllBlocksCleared (EventBatch admits only the three)
        tier = None if medium is None else tier_of_medium(medium)
        self.index.clear(pod, tier)
        self._drop_held(self._deferred.drop_pod(pod, tier), "cleared")
        return "AllBlocksCleared"

    def _store(self, pod: str, seq: int, i: int, event: BlockStored, model: str | None) -> str:
        """Rules L17-L19 for one ``BlockStored``; an unknown parent as ``unknown_parent`` says."""
        entry = self._entry(pod, event.medium, event.group_idx)
        engine_keys = event.block_keys_u64()
        if not event.token_ids:
            return self._tier_update(list(engine_keys), entry) if engine_keys else "empty"
        if event.extra_keys is not None and any(e is not None for e in event.extra_keys):
            self.stats.extra_keys_ignored += 1
        parent_engine = event.parent_key_u64()
        parent = None
        if parent_engine:  # None or 0 (llm-d EmptyBlockHash): the chain starts at the root
            parent = self.index.get_request_key(parent_engine)
            if parent is None:
                if self.unknown_parent == "drop":
                    self.stats.dropped_blocks["unknown_parent"] += len(event.token_ids) // self.block_size
                    return "unknown_parent"
                held = HeldStore(pod, seq, i, entry, event, model, parent_engine, engine_keys)
                self._drop_held(self._deferred.hold(held), "overflow")
                return "deferred"
        kind, mapped = self._add_store(entry, event, engine_keys, model, parent)
        if self._deferred:
            self._resolve(mapped)
        return kind

    def _add_store(self, entry: PodEntry, event: BlockStored, engine_keys: tuple[int, ...], model: str | None,
                   parent: int | None) -> tuple[str, list[int]]:
        """Add a store whose parent resolved to ``parent``; its kind and the engine keys it mapped."""
        start = parent if parent is not None else self.hasher.root_key(event.lora_name or model)
        request_keys = self.hasher.block_hashes(event.token_ids, parent_key=start)
        if not request_keys:
            return "partial_block", []
        mapped = self._mapped_engine_keys(list(engine_keys), len(request_keys), event.block_size)
        self.index.add(mapped, request_keys, [entry], parent=parent)
        if self._deferred:
            self._deferred.note_stored(mapped, entry)
        return "BlockStored", mapped

    def _resolve(self, mapped: list[int]) -> None:
        """Apply the held stores waiting for the engine keys just mapped, and theirs in turn."""
        queue = list(reversed(mapped))
        while queue and self._deferred:
            for held in self._deferred.release(queue.pop()):
                try:  # the parent is mapped now: it resolves
                    kind, keys = self._add_store(held.entry, held.event, held.engine_keys, held.model,
                                                 self.index.get_request_key(held.parent))
                    for key in held.removed:  # what the pod removed after the store
                        self.index.evict(key, ENGINE_KEY, [held.entry])
                except (ValueError, LookupError) as err:
                    self._error(held.pod, held.seq, held.event_index, held.event, err)
                    continue
                self.stats.deferred["resolved"] += 1
                if kind != "BlockStored":
                    self.stats.skipped[kind] += 1
                queue.extend(reversed(keys))

    def _drop_held(self, dropped: list[HeldStore], fate: str) -> None:
        for held in dropped:
            self.stats.deferred[fate] += 1
            self.stats.dropped_blocks[fate] += len(held.event.token_ids) // self.block_size

    def _mapped_engine_keys(self, engine_keys: list[int], num_request: int, engine_block: int) -> list[int]:
        """The engine keys whose blocks lie inside the ``num_request`` full canonical blocks."""
        canonical = self.block_size
        if canonical % engine_block == 0:
            kept = num_request * (canonical // engine_block)
            self.stats.unmapped_engine_keys += len(engine_keys) - kept
            return engine_keys[:kept]
        if engine_block % canonical == 0:
            return engine_keys
        raise ValueError(f"BlockStored.block_size {engine_block} and the canonical block_size {canonical} "
                         f"are not multiples of one another; its engine keys cannot be mapped to request keys")

    def _tier_update(self, engine_keys: list[int], entry: PodEntry) -> str:
        """Rule L17: add ``entry`` to the request keys the engine keys already map to."""
        looked_up = [self.index.get_request_key(key) for key in engine_keys]
        self.stats.unresolved_engine_keys += looked_up.count(None)
        resolved = list(dict.fromkeys(key for key in looked_up if key is not None))
        if not resolved:
            return "unresolved_tier_update"
        self.index.add(None, resolved, [entry])
        return "tier_update"
