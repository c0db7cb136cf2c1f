"""KV events: what engines publish when their prefix caches change, and the wire codec.

Models vLLM 0.33's ``vllm/distributed/kv_events.py`` (docs/specs/hashing.md §1.7);
SGLang publishes the same format (§5). Hashes stay as published (ints or digest bytes);
``block_keys_u64()`` gives kvlab's u64 block keys.

Encoding is byte-exact against vLLM 0.33 for the map layout it sends. The legacy array
layout writes every 0.33 field, as msgspec writes an ``array_like`` struct (it never
omits defaults, msgspec issue #720); the old releases that sent arrays had fewer fields,
so those bytes match a 0.33-schema msgspec struct, not a particular old release. Decoding
accepts both layouts, shorter arrays included.

==============================  ==========================================================
name                            what
==============================  ==========================================================
:class:`BlockStored`            blocks cached in a tier (hashes, parent, tokens, medium …)
:class:`BlockRemoved`           blocks evicted from a tier
:class:`AllBlocksCleared`       the whole prefix cache was reset (one tier: kvlab's ``medium``)
:class:`EventBatch`             one message's events: ``ts``, ``events``, DP rank
:func:`encode_frames`           batch → ``[topic, seq, msgpack]`` ZMQ frames, as msgspec writes them
:func:`decode_frames`           ZMQ frames → :class:`DecodedBatch` (map or legacy array events)
:func:`decode_stream`           many messages; a bad one becomes an error entry, others kept
:func:`is_end_of_replay`        the replay socket's ``[b"", END_SEQ, b""]`` marker
:class:`EventDecodeError`       malformed message, naming frame / event / field
:func:`write_event_file`        messages in arrival order → an event file (``KVLABEV1``, :mod:`kvlab.events.files`)
:func:`read_event_file`         an event file → its messages' frames, in order
:func:`decode_event_file`       an event file → :class:`DecodedBatch` / :class:`EventDecodeError` per message
:func:`load_event_description`  a JSON description of a stream → ``(topic, seq, EventBatch)`` messages
==============================  ==========================================================
"""

from kvlab.events.errors import EventDecodeError
from kvlab.events.files import (
    decode_event_file,
    load_event_description,
    parse_event_description,
    read_event_file,
    write_event_file,
)
from kvlab.events.types import (
    EVENT_TYPES,
    VLLM_FIELDS,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    ExternalBlockHash,
    KVEvent,
)
from kvlab.events.wire import (
    END_SEQ,
    LAYOUTS,
    DecodedBatch,
    decode_frames,
    decode_stream,
    encode_frames,
    is_end_of_replay,
)

__all__ = [
    "END_SEQ",
    "EVENT_TYPES",
    "LAYOUTS",
    "VLLM_FIELDS",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "DecodedBatch",
    "EventBatch",
    "EventDecodeError",
    "ExternalBlockHash",
    "KVEvent",
    "decode_event_file",
    "decode_frames",
    "decode_stream",
    "encode_frames",
    "is_end_of_replay",
    "load_event_description",
    "parse_event_description",
    "read_event_file",
    "write_event_file",
]
