"""KV events on the wire: vLLM's ZMQ frames and msgpack payload, byte-exact both ways.

Models ``ZmqEventPublisher`` and the msgspec structs of vLLM 0.33
(``vllm/distributed/kv_events.py``; docs/specs/hashing.md §1.7); SGLang sends the same
format (§5). One message is three ZMQ frames::

    [topic (UTF-8), seq (8 bytes, big-endian, from 0), payload (msgpack)]
    payload = [ts: float64, events: [event, ...], data_parallel_rank]   # EventBatch, array_like

Each event is a tagged map (vLLM >= PR #42892), ``{"type": "BlockStored", ...}``, or
in the legacy positional layout, ``["BlockStored", block_hashes, ...]``. Both follow
msgspec's ``omit_defaults``: a field with a default is left out when it equals the
default; fields without one are always written, null included. A map's header is sized
by the struct's *declared* field count plus the tag, as msgspec does (BlockStored's 16
give a ``map16`` header even with 9 entries; BlockRemoved and AllBlocksCleared get a
``fixmap``); an array's header counts what is written (trailing defaults trimmed).

Decoding is strict about what vLLM's own decoder rejects (missing required fields,
wrong types, unknown event types) and lenient, but not silent, about additions:
map keys and array positions the 0.33 schema does not declare are ignored, as msgspec
ignores them, and listed in :attr:`DecodedBatch.unknown_fields`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import MISSING, Field, dataclass, fields

import msgpack

from kvlab.events.errors import EventDecodeError
from kvlab.events.types import EVENT_TYPES, EventBatch, KVEvent

#: The seq frame of the replay socket's end-of-replay message (``ZmqEventPublisher.END_SEQ``).
END_SEQ = (-1).to_bytes(8, "big", signed=True)
#: Event layouts: tagged maps (vLLM >= PR #42892) or positional arrays (before it).
LAYOUTS = ("map", "array")
_TAG = "type"
_BY_TAG: dict[str, type] = {cls.__name__: cls for cls in EVENT_TYPES}
_FRAME_NAMES = ("topic", "seq", "payload")


@dataclass(frozen=True)
class DecodedBatch:
    """One decoded ZMQ message.

    Attributes:
        topic: the topic frame, decoded as UTF-8 (vLLM's default is ``""``; llm-d expects
            ``kv@<pod-id>@<model>``).
        seq: the publisher's sequence number (from 0, per publisher).
        batch: the events.
        layout: ``"map"`` or ``"array"`` when every event used that layout (an empty
            batch counts as ``"map"``), ``"mixed"`` otherwise.
        unknown_fields: ``(event index, key)`` for every map key, or ``"[position]"`` of
            an array, that vLLM 0.33's schema does not declare; they were ignored.

    Example:
        >>> from kvlab.events.types import AllBlocksCleared
        >>> frames = encode_frames(EventBatch(1.5, [AllBlocksCleared()], 0), topic="kv@pod-1@m", seq=7)
        >>> decoded = decode_frames(frames)
        >>> decoded.topic, decoded.seq, decoded.layout, decoded.batch.events
        ('kv@pod-1@m', 7, 'map', (AllBlocksCleared(),))
    """

    topic: str
    seq: int
    batch: EventBatch
    layout: str
    unknown_fields: tuple[tuple[int, str], ...] = ()


def encode_frames(batch: EventBatch, *, topic: str = "", seq: int = 0, layout: str = "map") -> list[bytes]:
    """The three ZMQ frames vLLM 0.33's ``ZmqEventPublisher`` sends for ``batch``, byte for byte.

    Args:
        batch: the events; ``data_parallel_rank=None`` leaves the slot out (2-element
            payload array), as msgspec's ``omit_defaults`` does.
        topic: the topic frame (UTF-8).
        seq: the sequence number, written as 8 bytes big-endian, in ``[0, 2**64)``.
        layout: ``"map"`` (vLLM >= PR #42892, the default) or ``"array"`` (the legacy
            positional events; fields declared after ``kv_cache_spec_sliding_window``
            continue the positions).

    Returns:
        ``[topic_bytes, seq_bytes, msgpack_payload]``.

    Raises:
        ValueError: ``batch`` not an :class:`~kvlab.events.EventBatch`, ``topic`` not a
            string, ``seq`` out of range, an unknown ``layout``.

    Example:
        >>> from kvlab.events.types import AllBlocksCleared
        >>> [f.hex() for f in encode_frames(EventBatch(1.0, [AllBlocksCleared()], 0), seq=1)]
        ['', '0000000000000001', '93cb3ff00000000000009181a474797065b0416c6c426c6f636b73436c656172656400']
    """
    if not isinstance(batch, EventBatch):
        raise ValueError(f"batch must be an EventBatch, got {type(batch).__name__}")
    if not isinstance(topic, str):
        raise ValueError(f"topic must be a string, got {type(topic).__name__} {topic!r}")
    if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq < 1 << 64:
        raise ValueError(f"seq must be an integer in [0, 2**64), got {seq!r}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return [topic.encode("utf-8"), seq.to_bytes(8, "big"), _encode_payload(batch, layout)]


def _declared(cls: type) -> tuple[Field, ...]:
    return fields(cls)  # type: ignore[arg-type]


def _omitted(field: Field, value: object) -> bool:
    """msgspec ``omit_defaults``: a field with a default is dropped when equal to it."""
    return field.default is not MISSING and value == field.default


def _encode_payload(batch: EventBatch, layout: str) -> bytes:
    packer = msgpack.Packer()  # bin for bytes, str for str, float64 for float: as msgspec
    encode_event = _encode_map_event if layout == "map" else _encode_array_event
    rank = batch.data_parallel_rank
    parts = [packer.pack_array_header(2 if rank is None else 3), packer.pack(batch.ts),
             packer.pack_array_header(len(batch.events))]
    parts += [encode_event(packer, event) for event in batch.events]
    if rank is not None:
        parts.append(packer.pack(rank))
    return b"".join(parts)


def _encode_map_event(packer: msgpack.Packer, event: KVEvent) -> bytes:
    declared = _declared(type(event))
    entries = [(_TAG, type(event).__name__)]
    entries += [(f.name, getattr(event, f.name)) for f in declared if not _omitted(f, getattr(event, f.name))]
    # msgspec reserves the header for every declared field + the tag, then patches the count.
    if len(declared) + 1 < 16:
        header = bytes([0x80 | len(entries)])
    else:
        header = b"\xde" + len(entries).to_bytes(2, "big")
    return header + b"".join(packer.pack(key) + packer.pack(value) for key, value in entries)


def _encode_array_event(packer: msgpack.Packer, event: KVEvent) -> bytes:
    declared = _declared(type(event))
    values = [getattr(event, f.name) for f in declared]
    n = len(values)
    while n and _omitted(declared[n - 1], values[n - 1]):
        n -= 1
    return packer.pack([type(event).__name__, *values[:n]])


def is_end_of_replay(frames: object) -> bool:
    """Whether ``frames`` is the replay socket's end marker ``[topic, END_SEQ, b""]``.

    Models ``ZmqEventPublisher._service_replay`` (docs/specs/hashing.md §1.7): after the
    buffered batches it sends ``[b"", END_SEQ, b""]``; older releases omitted the topic
    frame (``[END_SEQ, b""]``), which is recognised too. Never raises.

    Example:
        >>> is_end_of_replay([b"", END_SEQ, b""]), is_end_of_replay([b"", bytes(8), b""])
        (True, False)
    """
    try:
        raw = [bytes(memoryview(frame)) for frame in frames]  # type: ignore[attr-defined]
    except TypeError:
        return False
    return raw[-2:] == [END_SEQ, b""] and len(raw) in (2, 3)


def decode_frames(frames: Sequence[bytes]) -> DecodedBatch:
    """Decode one ZMQ message ``[topic, seq, payload]`` as vLLM 0.33 (or SGLang) sends it.

    Events may use the map or the legacy array layout, even mixed in one batch; hashes
    come back as sent (ints or bytes). Unknown map keys and extra array positions are
    ignored and reported in :attr:`DecodedBatch.unknown_fields`.

    Args:
        frames: three bytes-like frames (``bytes``, ``bytearray``, ``memoryview``, or
            ``zmq.Frame``), as ``recv_multipart`` returns them.

    Returns:
        The :class:`DecodedBatch`.

    Raises:
        EventDecodeError: naming what is wrong and where (frame, event index, field):
            not 3 frames, a frame that is not bytes, a topic that is not UTF-8, a seq
            frame that is not 8 bytes, the replay end marker (test it with
            :func:`is_end_of_replay`), a payload that is not msgpack or not a
            ``[ts, events(, data_parallel_rank)]`` array, an event that is neither a map
            nor an array, a missing or unknown ``type`` tag, a missing required field,
            a field of the wrong type or value (e.g. ``block_size: "4"``).

    Example:
        >>> from kvlab.events.types import BlockRemoved
        >>> frames = encode_frames(EventBatch(2.0, [BlockRemoved([b"\\x01" * 16], "GPU")], 1))
        >>> decode_frames(frames).batch.events[0].block_hashes
        (b'\\x01\\x01\\x01\\x01\\x01\\x01\\x01\\x01\\x01\\x01\\x01\\x01\\x01\\x01\\x01\\x01',)
    """
    if isinstance(frames, (bytes, bytearray, memoryview, str)) or not isinstance(frames, Sequence):
        raise EventDecodeError(f"expected 3 frames [topic, seq, payload], got {type(frames).__name__}")
    if len(frames) != 3:
        raise EventDecodeError(f"expected 3 frames [topic, seq, payload], got {len(frames)}")
    topic_raw, seq_raw, payload = (_frame_bytes(i, frame) for i, frame in enumerate(frames))
    if is_end_of_replay([topic_raw, seq_raw, payload]):
        raise EventDecodeError("these frames are the replay end marker [topic, END_SEQ, b''], not a batch; "
                               "test them with is_end_of_replay")
    try:
        topic = topic_raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise EventDecodeError(f"frame 0 (topic) is not UTF-8: {err}") from None
    if len(seq_raw) != 8:
        raise EventDecodeError(f"frame 1 (seq) must be 8 bytes (big-endian), got {len(seq_raw)}: {seq_raw!r}")
    try:
        obj = msgpack.unpackb(payload, raw=False, use_list=False, strict_map_key=True)
    except (ValueError, msgpack.UnpackException) as err:
        raise EventDecodeError(f"frame 2 (payload) is not valid msgpack: {err}") from None
    batch, layout, unknown = _decode_batch(obj)
    return DecodedBatch(topic, int.from_bytes(seq_raw, "big"), batch, layout, unknown)


def decode_stream(messages: Iterable[Sequence[bytes]]) -> list[DecodedBatch | EventDecodeError]:
    """Decode many messages; a bad one becomes an error entry and the rest are kept.

    Nothing in a good batch is dropped because of a bad one: the result has one entry
    per message, in order — the :class:`DecodedBatch`, or the :class:`EventDecodeError`
    that :func:`decode_frames` raised, with :attr:`EventDecodeError.message` set to the
    message's 0-based index.

    Args:
        messages: ZMQ messages, each a list of frames.

    Returns:
        ``list[DecodedBatch | EventDecodeError]``, aligned with ``messages``.

    Example:
        >>> from kvlab.events.types import AllBlocksCleared
        >>> good = encode_frames(EventBatch(1.0, [AllBlocksCleared()], 0))
        >>> [type(r).__name__ for r in decode_stream([good, [b"", b"x", b""], good])]
        ['DecodedBatch', 'EventDecodeError', 'DecodedBatch']
    """
    results: list[DecodedBatch | EventDecodeError] = []
    for index, frames in enumerate(messages):
        try:
            results.append(decode_frames(frames))
        except EventDecodeError as err:
            results.append(err.at_message(index))
    return results


def _frame_bytes(index: int, frame: object) -> bytes:
    try:
        if isinstance(frame, str):
            raise TypeError
        return bytes(memoryview(frame))  # type: ignore[arg-type]
    except TypeError:
        raise EventDecodeError(f"frame {index} ({_FRAME_NAMES[index]}) must be bytes, "
                               f"got {type(frame).__name__}") from None


def _describe(value: object) -> str:
    if isinstance(value, dict):
        return f"a map of {len(value)} entries"
    if isinstance(value, tuple):
        return f"an array of {len(value)}"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def _decode_batch(obj: object) -> tuple[EventBatch, str, tuple[tuple[int, str], ...]]:
    if not isinstance(obj, tuple) or len(obj) not in (2, 3):
        raise EventDecodeError("payload must be an EventBatch array [ts, events, data_parallel_rank], "
                               f"got {_describe(obj)}")
    ts, raw_events = obj[0], obj[1]
    rank = obj[2] if len(obj) == 3 else None
    if not isinstance(raw_events, tuple):
        raise EventDecodeError(f"EventBatch.events must be an array, got {_describe(raw_events)}")
    events, layouts, unknown = [], set(), []
    for index, raw in enumerate(raw_events):
        event, layout, extra = _decode_event(index, raw)
        events.append(event)
        layouts.add(layout)
        unknown += [(index, name) for name in extra]
    try:
        batch = EventBatch(ts, tuple(events), rank)
    except ValueError as err:
        raise EventDecodeError(f"EventBatch: {err}") from None
    layout = "mixed" if len(layouts) > 1 else layouts.pop() if layouts else "map"
    return batch, layout, tuple(unknown)


def _event_class(index: int, tag: object) -> type:
    if not isinstance(tag, str):
        raise EventDecodeError(f"event type tag must be a string, got {_describe(tag)}", event=index)
    if tag not in _BY_TAG:
        raise EventDecodeError(f"unknown event type {tag!r} (known: {', '.join(_BY_TAG)})", event=index)
    return _BY_TAG[tag]


def _decode_event(index: int, raw: object) -> tuple[KVEvent, str, list[str]]:
    if isinstance(raw, dict):
        if _TAG not in raw:
            raise EventDecodeError(f"map event has no {_TAG!r} tag (keys: {sorted(map(str, raw))})", event=index)
        cls = _event_class(index, raw[_TAG])
        names = [f.name for f in _declared(cls)]
        values = {key: value for key, value in raw.items() if key in names}
        extra = [key if isinstance(key, str) else repr(key) for key in raw if key != _TAG and key not in names]
        layout = "map"
    elif isinstance(raw, tuple):
        if not raw:
            raise EventDecodeError("array event is empty (no type tag)", event=index)
        cls = _event_class(index, raw[0])
        names = [f.name for f in _declared(cls)]
        values = dict(zip(names, raw[1:], strict=False))
        extra = [f"[{position}]" for position in range(len(names) + 1, len(raw))]
        layout = "array"
    else:
        raise EventDecodeError(f"an event must be a map or an array, got {_describe(raw)}", event=index)
    missing = [f.name for f in _declared(cls) if f.default is MISSING and f.name not in values]
    if missing:
        plural = "s" if len(missing) > 1 else ""
        raise EventDecodeError(f"{cls.__name__} {layout} event is missing required field{plural} "
                               f"{', '.join(map(repr, missing))}", event=index)
    try:
        return cls(**values), layout, extra
    except ValueError as err:
        raise EventDecodeError(f"{cls.__name__}: {err}", event=index) from None
