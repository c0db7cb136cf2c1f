"""KV events on the wire: vLLM's ZMQ frames and msgpack payload, as msgspec writes them.

Models ``ZmqEventPublisher`` and the msgspec structs of vLLM 0.33
(``vllm/distributed/kv_events.py``; docs/specs/hashing.md §1.7); SGLang sends the same
format (§5). One message is three ZMQ frames::

    [topic (UTF-8), seq (8 bytes, big-endian, from 0), payload (msgpack)]
    payload = [ts: float64, events: [event, ...], data_parallel_rank]   # EventBatch, array_like

Each event is a tagged map (vLLM >= PR #42892), ``{"type": "BlockStored", ...}``, or
in the legacy positional layout, ``["BlockStored", block_hashes, ...]``.

*Maps* follow msgspec's ``omit_defaults``: a field with a default is left out when it
equals the default; fields without one are always written, null included. A map's
header is sized by vLLM 0.33's *declared* field count (:data:`~kvlab.events.types.VLLM_FIELDS`)
plus the tag, as msgspec does (BlockStored's 16 give a ``map16`` header even with 9
entries; BlockRemoved and AllBlocksCleared get a ``fixmap``).

*Arrays* ignore ``omit_defaults``: msgspec writes every declared field of an
``array_like`` struct, in order, defaults included (msgspec issue #720). So the payload
always has 3 elements (``data_parallel_rank=None`` is written as nil: ``93 … c0``), and
an array event holds the tag and every field of vLLM 0.33's schema: 16 slots for
BlockStored (header ``dc 00 10``), 6 for BlockRemoved, 1 for AllBlocksCleared. The
releases that really sent array events (before PR #42892) declared fewer fields (see
the field history in §1.7), so the array layout is byte-exact against a msgspec
``array_like`` struct with the 0.33 field list, not against any particular old release.

*kvlab extension fields* (declared on the dataclass but not in vLLM 0.33's schema; today
only ``AllBlocksCleared.medium``, a reset scoped to one tier) are written only when not
``None``: as one more map key after vLLM's (``{"type": "AllBlocksCleared", "medium":
"CPU"}``, header ``82``), or as array slots after every vLLM slot, up to the last one set
(``["AllBlocksCleared", "CPU"]``). With every extension field ``None`` the bytes are
vLLM's. msgspec ignores unknown map keys and, without ``forbid_unknown_fields``, extra
trailing array elements, so vLLM-side decoders read such an event as a whole-cache clear.

Decoding accepts what those producers send: array events of any length from the
required fields up (older releases had fewer fields), and a 2-element payload without
the rank (some producers send it). It is strict about what vLLM's own decoder rejects
(missing required fields, wrong types, unknown event types, non-string map keys) and
lenient, but not silent, about additions: map keys and array positions that neither the
0.33 schema nor a kvlab extension declares are ignored, as msgspec ignores them, and
listed in :attr:`DecodedBatch.unknown_fields`. An array position right after an event's
vLLM slots is read as its extension field (a string or nil for ``AllBlocksCleared``): the
array layout predates PR #42892, so no later vLLM field will land there.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import MISSING, Field, dataclass, fields
from itertools import islice

import msgpack

from kvlab.core.validate import check_choice, check_str, check_u64
from kvlab.events.errors import EventDecodeError
from kvlab.events.types import EVENT_TYPES, VLLM_FIELDS, EventBatch, KVEvent

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
            an array, that neither vLLM 0.33's schema nor a kvlab extension field
            declares; they were ignored.

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
        batch: the events; the payload array always has 3 elements, as msgspec writes
            an ``array_like`` struct: ``data_parallel_rank=None`` is written as nil.
        topic: the topic frame (UTF-8).
        seq: the sequence number, written as 8 bytes big-endian, in ``[0, 2**64)``.
        layout: ``"map"`` (vLLM >= PR #42892, the default) or ``"array"`` (the legacy
            positional events, every field of the 0.33 schema written, defaults
            included, as a msgspec ``array_like`` struct with 0.33's fields writes them;
            the old releases that sent arrays declared fewer fields, so these bytes
            match none of them exactly).

    Returns:
        ``[topic_bytes, seq_bytes, msgpack_payload]``.

    Raises:
        ValueError: ``batch`` not an :class:`~kvlab.events.EventBatch`, ``topic`` not a
            string or not encodable as UTF-8 (lone surrogates), ``seq`` out of range, an
            unknown ``layout``.

    Example:
        >>> from kvlab.events.types import AllBlocksCleared
        >>> [f.hex() for f in encode_frames(EventBatch(1.0, [AllBlocksCleared()], 0), seq=1)]
        ['', '0000000000000001', '93cb3ff00000000000009181a474797065b0416c6c426c6f636b73436c656172656400']
    """
    if not isinstance(batch, EventBatch):
        raise ValueError(f"batch must be an EventBatch, got {type(batch).__name__}")
    check_str("topic", topic)
    seq = check_u64("seq", seq)
    check_choice("layout", layout, LAYOUTS)
    try:
        topic_bytes = topic.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(f"topic {_short_repr(topic)} cannot be encoded as UTF-8: {err}") from None
    return [topic_bytes, seq.to_bytes(8, "big"), _encode_payload(batch, layout)]


def _split_fields(cls: type) -> tuple[tuple[Field, ...], tuple[Field, ...]]:
    """``cls``'s declared fields in vLLM 0.33's schema, then its kvlab extension fields."""
    declared = fields(cls)  # type: ignore[arg-type]
    vllm = tuple(f for f in declared if f.name in VLLM_FIELDS[cls])
    return vllm, tuple(f for f in declared if f.name not in VLLM_FIELDS[cls])


#: Per event class: (vLLM 0.33's fields, kvlab extension fields), each in declaration order.
_WIRE_FIELDS = {cls: _split_fields(cls) for cls in EVENT_TYPES}


def _omitted(field: Field, value: object) -> bool:
    """msgspec ``omit_defaults``: a field with a default is dropped when equal to it."""
    return field.default is not MISSING and value == field.default


def _encode_payload(batch: EventBatch, layout: str) -> bytes:
    packer = msgpack.Packer()  # bin for bytes, str for str, float64 for float: as msgspec
    encode_event = _encode_map_event if layout == "map" else _encode_array_event
    # EventBatch is array_like: all 3 fields, a None rank as nil (msgspec ignores omit_defaults).
    parts = [packer.pack_array_header(3), packer.pack(batch.ts), packer.pack_array_header(len(batch.events))]
    parts += [encode_event(packer, event) for event in batch.events]
    parts.append(packer.pack(batch.data_parallel_rank))
    return b"".join(parts)


def _encode_map_event(packer: msgpack.Packer, event: KVEvent) -> bytes:
    vllm, extensions = _WIRE_FIELDS[type(event)]
    entries = [(_TAG, type(event).__name__)]
    # Extension fields default to None, so omit_defaults writes them only when set.
    entries += [(f.name, getattr(event, f.name)) for f in vllm + extensions if not _omitted(f, getattr(event, f.name))]
    # msgspec reserves the header for every vLLM-declared field + the tag, then patches the count.
    if max(len(vllm) + 1, len(entries)) < 16:
        header = bytes([0x80 | len(entries)])
    else:
        header = b"\xde" + len(entries).to_bytes(2, "big")
    return header + b"".join(packer.pack(key) + packer.pack(value) for key, value in entries)


def _encode_array_event(packer: msgpack.Packer, event: KVEvent) -> bytes:
    # msgspec array_like: the tag, then every vLLM field in order, defaults included (#720);
    # then the extension slots up to the last one that is set.
    vllm, extensions = _WIRE_FIELDS[type(event)]
    tail = [getattr(event, f.name) for f in extensions]
    while tail and tail[-1] is None:
        tail.pop()
    return packer.pack([type(event).__name__, *(getattr(event, f.name) for f in vllm), *tail])


def is_end_of_replay(frames: object) -> bool:
    """Whether ``frames`` is the replay socket's end marker ``[topic, END_SEQ, b""]``.

    Models ``ZmqEventPublisher._service_replay`` (docs/specs/hashing.md §1.7): after the
    buffered batches it sends ``[b"", END_SEQ, b""]``; older releases omitted the topic
    frame (``[END_SEQ, b""]``), which is recognised too. Frames are bytes-like as for
    :func:`decode_frames`; anything else gives ``False``. Never raises.

    Example:
        >>> is_end_of_replay([b"", END_SEQ, b""]), is_end_of_replay([b"", bytes(8), b""])
        (True, False)
    """
    if isinstance(frames, (bytes, bytearray, memoryview, str)):
        return False
    try:
        raw = [_as_bytes(frame) for frame in islice(frames, 4)]  # type: ignore[call-overload]
    except TypeError:
        return False
    return None not in raw and raw[-2:] == [END_SEQ, b""] and len(raw) in (2, 3)


def decode_frames(frames: Sequence[bytes]) -> DecodedBatch:
    """Decode one ZMQ message ``[topic, seq, payload]`` as vLLM 0.33 (or SGLang) sends it.

    Events may use the map or the legacy array layout, even mixed in one batch; hashes
    come back as sent (ints or bytes). Unknown map keys and extra array positions are
    ignored and reported in :attr:`DecodedBatch.unknown_fields`.

    Args:
        frames: three frames, each ``bytes``, ``bytearray``, ``memoryview`` or an
            object with a ``.bytes`` attribute holding bytes (``zmq.Frame``), as
            ``recv_multipart`` returns them; other buffers (a numpy array) are refused.

    Returns:
        The :class:`DecodedBatch`.

    Raises:
        EventDecodeError: naming what is wrong and where (frame, event index, field):
            not 3 frames, a frame of another type, a topic that is not UTF-8, a seq
            frame that is not 8 bytes, the replay end marker (test it with
            :func:`is_end_of_replay`), a payload that is truncated, not msgpack (the
            reason gives msgpack's exception type and message), nested too deeply, or
            not a ``[ts, events(, data_parallel_rank)]`` array, an event that is neither
            a map nor an array, a map event with a non-string key, a missing or unknown
            ``type`` tag, a missing required field, a field of the wrong type or value
            (e.g. ``block_size: "4"``, a negative ``ts``, mixed int and bytes hashes).

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
    obj = _unpack(payload)
    try:
        batch, layout, unknown = _decode_batch(obj)
    except RecursionError:  # a value nested ~1000 deep, e.g. in an error message's repr
        raise EventDecodeError("frame 2 (payload) nests arrays or maps too deeply to check (RecursionError)") from None
    return DecodedBatch(topic, int.from_bytes(seq_raw, "big"), batch, layout, unknown)


def _unpack(payload: bytes) -> object:
    """The payload's msgpack value; map keys of any hashable type (events check theirs)."""
    try:
        return msgpack.unpackb(payload, raw=False, use_list=False, strict_map_key=False)
    except (ValueError, TypeError, msgpack.UnpackException) as err:
        raise EventDecodeError(f"frame 2 (payload) {_unpack_problem(err)} ({_exception_text(err)})") from None


def _unpack_problem(err: BaseException) -> str:
    if isinstance(err, msgpack.ExtraData):
        return f"has {len(err.extra)} trailing byte(s) after its msgpack value"
    if isinstance(err, msgpack.StackError):
        return "nests arrays or maps too deeply for msgpack's unpacker"
    if isinstance(err, msgpack.FormatError):
        return "is not valid msgpack: a reserved or unknown type byte"
    if isinstance(err, UnicodeDecodeError):
        return "holds a msgpack string that is not UTF-8"
    if isinstance(err, TypeError):  # a map used as a map key is unhashable
        return "has a map key that is itself a map"
    return "is truncated or not msgpack"  # incomplete input, or a length past the end


def _exception_text(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__


def decode_stream(messages: Iterable[Sequence[bytes]]) -> list[DecodedBatch | EventDecodeError]:
    """Decode many messages; a bad one becomes an error entry and the rest are kept.

    Nothing in a good batch is dropped because of a bad one: the result has one entry
    per message, in order — the :class:`DecodedBatch`, or the :class:`EventDecodeError`
    that :func:`decode_frames` raised, with :attr:`EventDecodeError.message` set to the
    message's 0-based index.

    Args:
        messages: an iterable of ZMQ messages, each a list of frames.

    Returns:
        ``list[DecodedBatch | EventDecodeError]``, aligned with ``messages``.

    Raises:
        ValueError: ``messages`` is not an iterable of messages (e.g. an int, or one
            ``bytes`` payload); a bad *message* never raises.

    Example:
        >>> from kvlab.events.types import AllBlocksCleared
        >>> good = encode_frames(EventBatch(1.0, [AllBlocksCleared()], 0))
        >>> [type(r).__name__ for r in decode_stream([good, [b"", b"x", b""], good])]
        ['DecodedBatch', 'EventDecodeError', 'DecodedBatch']
    """
    try:
        if isinstance(messages, (bytes, bytearray, memoryview, str)):
            raise TypeError(messages)
        iterator = iter(messages)
    except TypeError:
        raise ValueError(f"messages must be an iterable of messages (lists of frames), "
                         f"got {_describe(messages)}") from None
    results: list[DecodedBatch | EventDecodeError] = []
    for index, frames in enumerate(iterator):
        try:
            results.append(decode_frames(frames))
        except EventDecodeError as err:
            results.append(err.at_message(index))
    return results


def _as_bytes(frame: object) -> bytes | None:
    """A frame's bytes: bytes, bytearray, memoryview, or ``.bytes`` (zmq.Frame); else None."""
    if isinstance(frame, bytes):
        return frame
    if isinstance(frame, (bytearray, memoryview)):
        return bytes(frame)
    raw = getattr(frame, "bytes", None)
    return raw if isinstance(raw, bytes) else None


def _frame_bytes(index: int, frame: object) -> bytes:
    raw = _as_bytes(frame)
    if raw is None:
        raise EventDecodeError(f"frame {index} ({_FRAME_NAMES[index]}) must be bytes, bytearray, memoryview or "
                               f"a zmq.Frame (with .bytes), got {type(frame).__name__}")
    return raw


def _short_repr(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _describe(value: object) -> str:
    if isinstance(value, dict):
        return f"a map of {len(value)} entries"
    if isinstance(value, tuple):
        return f"an array of {len(value)}"
    return f"{type(value).__name__} {_short_repr(value)}"


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


def _all_fields(cls: type) -> tuple[Field, ...]:
    """vLLM's fields then the extension fields: the map keys and array positions decoded."""
    vllm, extensions = _WIRE_FIELDS[cls]
    return vllm + extensions


def _event_class(index: int, tag: object) -> type:
    if not isinstance(tag, str):
        raise EventDecodeError(f"event type tag must be a string, got {_describe(tag)}", event=index)
    if tag not in _BY_TAG:
        raise EventDecodeError(f"unknown event type {tag!r} (known: {', '.join(_BY_TAG)})", event=index)
    return _BY_TAG[tag]


def _decode_event(index: int, raw: object) -> tuple[KVEvent, str, list[str]]:
    if isinstance(raw, dict):
        for key in raw:
            if not isinstance(key, str):
                raise EventDecodeError(f"event map has a non-string key {_short_repr(key)}", event=index)
        if _TAG not in raw:
            raise EventDecodeError(f"map event has no {_TAG!r} tag (keys: {sorted(raw)})", event=index)
        cls = _event_class(index, raw[_TAG])
        names = [f.name for f in _all_fields(cls)]
        values = {key: value for key, value in raw.items() if key in names}
        extra = [key for key in raw if key != _TAG and key not in names]
        layout = "map"
    elif isinstance(raw, tuple):
        if not raw:
            raise EventDecodeError("array event is empty (no type tag)", event=index)
        cls = _event_class(index, raw[0])
        names = [f.name for f in _all_fields(cls)]
        values = dict(zip(names, raw[1:], strict=False))
        extra = [f"[{position}]" for position in range(len(names) + 1, len(raw))]
        layout = "array"
    else:
        raise EventDecodeError(f"an event must be a map or an array, got {_describe(raw)}", event=index)
    missing = [f.name for f in _all_fields(cls) if f.default is MISSING and f.name not in values]
    if missing:
        plural = "s" if len(missing) > 1 else ""
        raise EventDecodeError(f"{cls.__name__} {layout} event is missing required field{plural} "
                               f"{', '.join(map(repr, missing))}", event=index)
    try:
        return cls(**values), layout, extra
    except ValueError as err:
        raise EventDecodeError(f"{cls.__name__}: {err}", event=index) from None
