"""KV events as frozen dataclasses: what an engine publishes when its prefix cache changes.

Models vLLM 0.33's ``vllm/distributed/kv_events.py`` (docs/specs/hashing.md §1.7):
``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared`` and the ``EventBatch`` envelope.
SGLang publishes the same shapes (§5). Field names, declaration order and defaults are
vLLM's: the wire codec (:mod:`kvlab.events.wire`) derives the map keys, the array
layout's positions and msgspec's ``omit_defaults`` rule (maps only) from them, so a
field without a default here is one vLLM always sends. :data:`VLLM_FIELDS` lists vLLM
0.33's fields per class; the one kvlab extension, ``AllBlocksCleared.medium`` (a reset
scoped to one tier), is not among them and is written only when set.

Block hashes are kept exactly as published (``ExternalBlockHash = bytes | int``): a u64
when ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`` (the default), the raw 32- or 16-byte
digest otherwise, a signed int64 from SGLang; one event's hashes (and its parent) are all
of one kind, and a bytes hash is never empty. :meth:`BlockStored.block_keys_u64` gives
kvlab's u64 block keys (llm-d ``getHashAsUint64``, Dynamo ``BlockHashValue::into_u64``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvlab.core.validate import U64_MAX, check_int, check_real, check_str, check_u64
from kvlab.hashing.base import check_block_size, normalize_engine_hash

#: A block hash as published in an event: the u64 / int64 form or the raw digest bytes.
ExternalBlockHash = bytes | int

_I64_MIN = -(1 << 63)
#: How deep arrays may nest inside one ``extra_keys`` entry (vLLM's nest a few levels).
_MAX_KEY_DEPTH = 32


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _as_tuple(name: str, value: object) -> tuple:
    if not isinstance(value, (list, tuple, np.ndarray)):
        raise ValueError(f"{name} must be a list or tuple, got {type(value).__name__} {value!r}")
    return tuple(value)


def _check_hash(name: str, value: object) -> ExternalBlockHash:
    try:
        normalize_engine_hash(value)  # type: ignore[arg-type]
    except ValueError as err:
        raise ValueError(f"{name}: {err}") from None
    if isinstance(value, (bytes, bytearray)):
        if not value:
            raise ValueError(f"{name}: an engine block hash must not be empty bytes, got {bytes(value)!r}")
        return bytes(value)
    return int(value)  # type: ignore[call-overload]


def _kind(value: ExternalBlockHash) -> str:
    return "bytes" if isinstance(value, bytes) else "an integer"


def _check_hashes(name: str, value: object) -> tuple[ExternalBlockHash, ...]:
    """Each hash checked, and all of one kind: vLLM sends an event's hashes either all as
    ints or all as digest bytes (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``)."""
    hashes = tuple(_check_hash(f"{name}[{i}]", h) for i, h in enumerate(_as_tuple(name, value)))
    for i, h in enumerate(hashes[1:], start=1):
        if _kind(h) != _kind(hashes[0]):
            raise ValueError(f"{name} mixes integer and bytes hashes: {name}[{i}] is {_kind(h)} {h!r} but "
                             f"{name}[0] is {_kind(hashes[0])} {hashes[0]!r}; an event's hashes are all "
                             f"ints or all digest bytes")
    return hashes


def _check_tokens(name: str, value: object) -> tuple[int, ...]:
    if isinstance(value, np.ndarray) and value.ndim == 1 and np.issubdtype(value.dtype, np.unsignedinteger):
        return tuple(value.tolist())  # an unsigned array's values are u64 already
    tokens = _as_tuple(name, value)
    # fast path (one event carries a block's worth of tokens per stored block): plain ints in range
    if all(type(token) is int for token in tokens) and (not tokens or (min(tokens) >= 0 and max(tokens) <= U64_MAX)):
        return tokens
    return tuple(check_u64(f"{name}[{i}]", token) for i, token in enumerate(tokens))


def _check_opt_int(name: str, value: object, low: int) -> int | None:
    """``None``, or an integer in ``[low, 2**64)`` (vLLM's msgpack ints: int64 or uint64)."""
    return check_int(name, value, low=low, high=U64_MAX, optional=True)


def _freeze_key(name: str, value: object, depth: int = 0) -> object:
    """One extra-key item as an immutable msgpack value (arrays become tuples)."""
    if isinstance(value, (list, tuple)):
        if depth >= _MAX_KEY_DEPTH:
            raise ValueError(f"{name} nests arrays more than {_MAX_KEY_DEPTH} levels deep; vLLM's extra keys nest "
                             f"only a few levels")
        return tuple([_freeze_key(f"{name}[{i}]", item, depth + 1) for i, item in enumerate(value)])
    if isinstance(value, bytearray):
        return bytes(value)
    if _is_int(value):
        if not _I64_MIN <= value <= U64_MAX:  # type: ignore[operator]
            raise ValueError(f"{name} must fit 64 bits, got {value!r}")
        return int(value)  # type: ignore[call-overload]
    if value is None or isinstance(value, (str, bytes, bool, float)):
        return value
    raise ValueError(f"{name} must be None, bool, int, float, str, bytes or a tuple of them, "
                     f"got {type(value).__name__} {value!r}")


def _check_extra_keys(value: object, num_blocks: int) -> tuple[tuple | None, ...] | None:
    if value is None:
        return None
    entries = _as_tuple("extra_keys", value)
    if len(entries) != num_blocks:
        raise ValueError(f"extra_keys has {len(entries)} entries but block_hashes has {num_blocks}; "
                         f"vLLM sends one entry (a tuple or None) per block")
    frozen = []
    for i, entry in enumerate(entries):
        if entry is not None and not isinstance(entry, (list, tuple)):
            raise ValueError(f"extra_keys[{i}] must be None or a tuple, got {type(entry).__name__} {entry!r}")
        frozen.append(_freeze_key(f"extra_keys[{i}]", entry))
    return tuple(frozen)  # type: ignore[arg-type]


def _check_lookahead(value: object, num_blocks: int) -> tuple[tuple[int, ...], ...] | None:
    """vLLM 0.33's ``lookahead_token_ids``: one token list per block, or ``None``."""
    if value is None:
        return None
    lists = _as_tuple("lookahead_token_ids", value)
    if len(lists) != num_blocks:
        raise ValueError(f"lookahead_token_ids has {len(lists)} lists but block_hashes has {num_blocks}; vLLM 0.33 "
                         f"sends one list of lookahead tokens per block")
    return tuple(_check_tokens(f"lookahead_token_ids[{i}]", tokens) for i, tokens in enumerate(lists))


def _keys_u64(hashes: Sequence[ExternalBlockHash]) -> tuple[int, ...]:
    return tuple(normalize_engine_hash(h) for h in hashes)


@dataclass(frozen=True)
class BlockStored:
    """Blocks were stored (cached) in one tier of one engine.

    Models vLLM 0.33 ``BlockStored`` (``vllm/distributed/kv_events.py``; emitted per
    ``cache_full_blocks`` call and per KV-cache group, docs/specs/hashing.md §1.7) and
    SGLang's (one per page, coalesced; §5). The first seven fields have no default:
    vLLM always sends them, even when null.

    Attributes:
        block_hashes: the stored blocks' hashes, chained, in order (u64/int64 ints or
            digest bytes, as published).
        parent_block_hash: hash of the block before the first stored one; ``None`` when
            the chain starts at block 0.
        token_ids: all tokens of the stored blocks, concatenated; empty or exactly
            ``len(block_hashes) * block_size`` tokens.
        block_size: tokens per block (the KV-cache group's block size; smaller for
            vLLM's partial-block stores and SGLang's partial last page), >= 1.
        lora_id: deprecated LoRA adapter id (``lora_request.adapter_id``); SGLang: null.
        medium: the tier, e.g. ``"GPU"``, ``"CPU"``, ``"STORAGE"`` (vLLM offload),
            ``"CPU_PINNED"``, ``"DISK"`` (SGLang); ``None`` when unspecified.
        lora_name: LoRA adapter name, or ``None``.
        extra_keys: per-block extra hash inputs in vLLM's untagged event form, one entry
            (a tuple, or ``None``) per block, e.g. ``(("img-0", -1), "salt")``; ``None``
            when not sent.
        group_idx: KV-cache group index (>= 0).
        kv_cache_spec_kind: the group's KV-cache spec kind (e.g. ``"full_attention"``).
        kv_cache_spec_sliding_window: the group's sliding window in tokens (>= 1).
        locality: ``"LOCAL"`` or ``"REMOTE"`` relative to the publisher.
        ownership: the secondary offloading tier that generated the event, if any.
        session_id: the request's session id.
        lookahead_token_ids: per block, the tokens after it that its hash looked ahead
            at (EAGLE / MTP, §1.5): one list per entry of ``block_hashes``, e.g.
            ``((5, 6), (9, 10))``; ``None`` when lookahead hashing is off.

    Lists are stored as tuples (extra-key arrays too), bytearrays as bytes.

    Raises:
        ValueError: naming the field and value: a hash that is not bytes or a 64-bit
            integer, an empty bytes hash, ``block_hashes`` mixing ints and bytes, a
            ``parent_block_hash`` of the other kind than ``block_hashes``, a negative or
            non-integer token id, ``block_size < 1``, a token count that is neither 0
            nor ``len(block_hashes) * block_size``, an ``extra_keys`` list whose length
            differs from ``len(block_hashes)`` or that nests arrays over 32 levels deep,
            a ``lookahead_token_ids`` that is not one token list per block,
            a non-string ``medium`` / ``lora_name`` / ..., a negative ``group_idx``.

    Example:
        >>> ev = BlockStored(block_hashes=[2**63 + 5, -2], parent_block_hash=None,
        ...                  token_ids=[1, 2, 3, 4, 5, 6, 7, 8], block_size=4,
        ...                  lora_id=None, medium="GPU", lora_name=None, group_idx=0)
        >>> ev.block_hashes, ev.block_keys_u64()
        ((9223372036854775813, -2), (9223372036854775813, 18446744073709551614))
        >>> ev.parent_key_u64() is None
        True
    """

    block_hashes: tuple[ExternalBlockHash, ...]
    parent_block_hash: ExternalBlockHash | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: tuple[tuple | None, ...] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: tuple[tuple[int, ...], ...] | None = None

    def __post_init__(self) -> None:
        hashes = _check_hashes("block_hashes", self.block_hashes)
        parent = None if self.parent_block_hash is None else _check_hash("parent_block_hash",
                                                                           self.parent_block_hash)
        if parent is not None and hashes and _kind(parent) != _kind(hashes[0]):
            raise ValueError(f"parent_block_hash is {_kind(parent)} {parent!r} but block_hashes[0] is "
                             f"{_kind(hashes[0])} {hashes[0]!r}; vLLM sends the parent in the same form as "
                             f"the hashes")
        tokens = _check_tokens("token_ids", self.token_ids)
        block_size = check_block_size(self.block_size)
        if tokens and len(tokens) != len(hashes) * block_size:
            raise ValueError(
                f"token_ids has {len(tokens)} tokens but {len(hashes)} block_hashes x block_size "
                f"{block_size} = {len(hashes) * block_size}; token_ids must be empty or hold every "
                f"token of the stored blocks")
        for name in ("medium", "lora_name", "kv_cache_spec_kind", "locality", "ownership", "session_id"):
            check_str(name, getattr(self, name), optional=True)
        checked = {
            "block_hashes": hashes, "parent_block_hash": parent, "token_ids": tokens, "block_size": block_size,
            "lora_id": _check_opt_int("lora_id", self.lora_id, _I64_MIN),
            "extra_keys": _check_extra_keys(self.extra_keys, len(hashes)),
            "group_idx": _check_opt_int("group_idx", self.group_idx, 0),
            "kv_cache_spec_sliding_window": _check_opt_int("kv_cache_spec_sliding_window",
                                                           self.kv_cache_spec_sliding_window, 1),
            "lookahead_token_ids": _check_lookahead(self.lookahead_token_ids, len(hashes)),
        }
        for name, value in checked.items():
            object.__setattr__(self, name, value)

    def block_keys_u64(self) -> tuple[int, ...]:
        """kvlab's u64 block keys of :attr:`block_hashes` (``normalize_engine_hash`` of each:
        bytes → last 8 bytes big-endian, int64 → two's complement, u64 kept)."""
        return _keys_u64(self.block_hashes)

    def parent_key_u64(self) -> int | None:
        """:attr:`parent_block_hash` as a u64 key, ``None`` when the chain starts here."""
        return None if self.parent_block_hash is None else normalize_engine_hash(self.parent_block_hash)


@dataclass(frozen=True)
class BlockRemoved:
    """Blocks were removed (evicted) from one tier of one engine.

    Models vLLM 0.33 ``BlockRemoved`` (docs/specs/hashing.md §1.7; vLLM emits one per
    evicted hash, ``_emit_block_removed_events``) and SGLang's (one per radix node, all
    its page hashes; §5).

    Attributes:
        block_hashes: the removed blocks' hashes, as published (ints or digest bytes).
        medium: the tier (see :class:`BlockStored`), or ``None``; always sent.
        group_idx: KV-cache group index (>= 0), or ``None``.
        locality: ``"LOCAL"`` or ``"REMOTE"`` relative to the publisher, or ``None``.
        ownership: the secondary offloading tier that generated the event, or ``None``.

    Raises:
        ValueError: naming the field and value (a hash that is not bytes or a 64-bit
            integer, an empty bytes hash, ``block_hashes`` mixing ints and bytes, a
            non-string medium, a negative group index ...).

    Example:
        >>> ev = BlockRemoved(block_hashes=[bytes(31) + b"\\x07"], medium="CPU")
        >>> ev.block_keys_u64()
        (7,)
    """

    block_hashes: tuple[ExternalBlockHash, ...]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "block_hashes", _check_hashes("block_hashes", self.block_hashes))
        for name in ("medium", "locality", "ownership"):
            check_str(name, getattr(self, name), optional=True)
        object.__setattr__(self, "group_idx", _check_opt_int("group_idx", self.group_idx, 0))

    def block_keys_u64(self) -> tuple[int, ...]:
        """kvlab's u64 block keys of :attr:`block_hashes` (see :meth:`BlockStored.block_keys_u64`)."""
        return _keys_u64(self.block_hashes)


@dataclass(frozen=True, repr=False)
class AllBlocksCleared:
    """Every block of the engine's prefix cache was dropped (prefix-cache reset), or, with
    :attr:`medium`, every block of one tier.

    Models vLLM 0.33 ``AllBlocksCleared`` (no fields; docs/specs/hashing.md §1.7) and
    SGLang's (§5): both clear the whole cache and name no tier. ``medium`` is a kvlab
    extension (not in :data:`VLLM_FIELDS`) so a reset scoped to one tier can be expressed
    (issue 7; llm-d logs and ignores a tier on this event and clears the pod, index_blend.md
    L19). The wire codec writes it only when it is not ``None``, so
    ``AllBlocksCleared()`` stays byte-exact against vLLM (:mod:`kvlab.events.wire`).

    Attributes:
        medium: the tier that was reset (see :class:`BlockStored`), or ``None``: every
            tier, as vLLM means it.

    Raises:
        ValueError: a ``medium`` that is neither ``None`` nor a string.

    Example:
        >>> AllBlocksCleared() == AllBlocksCleared(), AllBlocksCleared("CPU") == AllBlocksCleared()
        (True, False)
    """

    medium: str | None = None

    def __post_init__(self) -> None:
        check_str("medium", self.medium, optional=True)

    def __repr__(self) -> str:
        """``AllBlocksCleared()`` as vLLM's, the extension shown only when set."""
        return "AllBlocksCleared()" if self.medium is None else f"AllBlocksCleared(medium={self.medium!r})"


#: Any KV event.
KVEvent = BlockStored | BlockRemoved | AllBlocksCleared
#: The event classes; a class's ``__name__`` is its wire tag (msgspec ``tag=True``).
EVENT_TYPES: tuple[type, ...] = (BlockStored, BlockRemoved, AllBlocksCleared)
#: Each event type's fields in vLLM 0.33's schema, in declaration order (docs/specs/hashing.md
#: §1.7); declared fields not listed here are kvlab extensions, written only when not ``None``.
VLLM_FIELDS: dict[type, tuple[str, ...]] = {
    BlockStored: ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name",
                  "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window", "locality",
                  "ownership", "session_id", "lookahead_token_ids"),
    BlockRemoved: ("block_hashes", "medium", "group_idx", "locality", "ownership"),
    AllBlocksCleared: (),
}


#: The bound on :attr:`EventBatch.ts` (exclusive), as a float: what the wire's float64 carries and
#: decodes back (an int just below 2**64 rounds up to it, so it is refused too).
_TS_LIMIT_S = float(2**64)


@dataclass(frozen=True)
class EventBatch:
    """The events one engine step published, as one message.

    Models vLLM 0.33 ``EventBatch`` / ``KVEventBatch`` (docs/specs/hashing.md §1.7;
    SGLang's ``attn_dp_rank`` fills the same slot, §5).

    Attributes:
        ts: publish time, seconds since the epoch (``time.time()``), in ``[0, 2**64)``
            once stored as a float (an int is converted first).
        events: the events, in order.
        data_parallel_rank: the publishing DP rank (>= 0); vLLM's publisher always sets
            it (0 by default); ``None`` only for a batch sent without it.

    Raises:
        ValueError: ``ts`` not a finite number in ``[0, 2**64)`` (negative, NaN,
            infinite, 2**64 or more, not a number), an item of ``events`` that is not a KV
            event, a negative or non-integer ``data_parallel_rank``.

    Example:
        >>> batch = EventBatch(1700000002, [BlockRemoved([5], medium="GPU"), AllBlocksCleared()], 1)
        >>> batch.ts, len(batch.events)
        (1700000002.0, 2)
    """

    ts: float
    events: tuple[KVEvent, ...]
    data_parallel_rank: int | None = None

    def __post_init__(self) -> None:
        ts = check_real("ts", self.ts, low=0.0, high=_TS_LIMIT_S, high_open=True)  # seconds since the epoch
        events = _as_tuple("events", self.events)
        for i, event in enumerate(events):
            if not isinstance(event, EVENT_TYPES):
                raise ValueError(f"events[{i}] must be a BlockStored, BlockRemoved or AllBlocksCleared, "
                                 f"got {type(event).__name__} {event!r}")
        object.__setattr__(self, "ts", ts)
        object.__setattr__(self, "events", events)
        object.__setattr__(self, "data_parallel_rank",
                           _check_opt_int("data_parallel_rank", self.data_parallel_rank, 0))
