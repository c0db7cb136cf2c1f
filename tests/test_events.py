"""KV events: golden wire vectors byte for byte, msgspec's array_like bytes pinned, round trips in
both layouts, malformed messages named precisely, and a bad message never costing the good ones
around it."""

from __future__ import annotations

import json
import math
from dataclasses import MISSING, fields, replace
from pathlib import Path

import msgpack
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlab.events import (
    END_SEQ,
    VLLM_FIELDS,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    DecodedBatch,
    EventBatch,
    EventDecodeError,
    decode_frames,
    decode_stream,
    encode_frames,
    is_end_of_replay,
)

VECTORS = json.loads((Path(__file__).parent / "vectors" / "vllm_kv_events_wire.json").read_text())["cases"]

# docs/specs/hashing.md §1.7, declaration order; the first 7 / 2 have no default.
STORED_FIELDS = ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name",
                 "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window", "locality",
                 "ownership", "session_id", "lookahead_token_ids"]
REMOVED_FIELDS = ["block_hashes", "medium", "group_idx", "locality", "ownership"]
REQUIRED = {"BlockStored": STORED_FIELDS[:7], "BlockRemoved": REMOVED_FIELDS[:2], "AllBlocksCleared": []}
DECLARED = {"BlockStored": STORED_FIELDS, "BlockRemoved": REMOVED_FIELDS, "AllBlocksCleared": []}
CLASSES = {"BlockStored": BlockStored, "BlockRemoved": BlockRemoved, "AllBlocksCleared": AllBlocksCleared}


def from_json(value: object) -> object:
    """Vector JSON → Python: {"bytes_hex": …} → bytes, lists → tuples."""
    if isinstance(value, dict) and set(value) == {"bytes_hex"}:
        return bytes.fromhex(value["bytes_hex"])
    if isinstance(value, list):
        return tuple(from_json(v) for v in value)
    return value


def expected_event(raw: dict | list) -> object:
    """An event built from the vector's decoded form by field name (map) or spec position (array)."""
    if isinstance(raw, dict):
        raw = dict(raw)
        cls = CLASSES[raw.pop("type")]
        return cls(**{k: from_json(v) for k, v in raw.items()})
    tag, *values = raw
    return CLASSES[tag](**dict(zip(DECLARED[tag], (from_json(v) for v in values), strict=False)))


def vector_frames(case: dict) -> list[bytes]:
    return [bytes.fromhex(h) for h in case["zmq_frames_hex"]]


def case_layout(case: dict) -> str:
    return "array" if case["scheme"].endswith("legacy_array") else "map"


# Byte-exact encoding is asserted only for the vectors produced by vLLM 0.33 itself (map layout,
# verification "upstream_executed"). The legacy array vector is "derived" with 10 positional slots
# (an older, shorter field list); encode writes every 0.33 field, as msgspec does for an
# array_like struct (msgspec issue #720), so it cannot reproduce those bytes. That vector is still
# checked to decode to its "decoded" form and to round-trip.
EXECUTED = [c for c in VECTORS if c["verification"] == "upstream_executed"]


def good_frames(*events: object, ts: float = 1.0, rank: int | None = 0, seq: int = 0) -> list[bytes]:
    return encode_frames(EventBatch(ts, events or (AllBlocksCleared(),), rank), seq=seq)


def frames_with_payload(obj: object) -> list[bytes]:
    """A message whose payload is plain msgpack of ``obj`` (msgpack's minimal headers, not msgspec's)."""
    return [b"", bytes(8), msgpack.packb(obj)]


STORED = BlockStored([1, 2], None, list(range(8)), 4, None, "GPU", None)
STORED_MAP = {"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None, "token_ids": [1, 2, 3, 4],
              "block_size": 4, "lora_id": None, "medium": "GPU", "lora_name": None}


# ---- golden vectors -------------------------------------------------------------------------

@pytest.mark.parametrize("case", VECTORS, ids=[c["name"] for c in VECTORS])
def test_vector_decodes_to_its_decoded_form(case: dict) -> None:
    ts, events, rank = case["decoded"]
    decoded = decode_frames(vector_frames(case))
    assert decoded.topic == case["params"]["topic"]
    assert decoded.seq == case["params"]["seq"]
    assert decoded.layout == case_layout(case)
    assert decoded.unknown_fields == ()
    assert decoded.batch == EventBatch(ts, tuple(expected_event(e) for e in events), rank)


@pytest.mark.parametrize("case", EXECUTED, ids=[c["name"] for c in EXECUTED])
def test_vector_encodes_byte_for_byte(case: dict) -> None:
    ts, events, rank = case["decoded"]
    batch = EventBatch(ts, tuple(expected_event(e) for e in events), rank)
    frames = encode_frames(batch, topic=case["params"]["topic"], seq=case["params"]["seq"],
                           layout=case_layout(case))
    assert [f.hex() for f in frames] == case["zmq_frames_hex"]


def test_executed_vectors_are_the_map_layout_ones() -> None:
    assert [case_layout(c) for c in EXECUTED] == ["map"] * 5
    assert [(c["name"], c["verification"]) for c in VECTORS if c not in EXECUTED] == [
        ("stored_int_hashes_array_layout", "derived")]


def test_legacy_array_vector_decodes_and_round_trips() -> None:
    """The derived 10-slot vector decodes; re-encoding writes all 16 slots, which decode to the same batch."""
    case = next(c for c in VECTORS if case_layout(c) == "array")
    frames = vector_frames(case)
    assert frames[2][11] == 0x9A  # fixarray of 10: tag + 9 fields, up to group_idx
    batch = decode_frames(frames).batch
    encoded = encode_frames(batch, layout="array")
    assert encoded[2][11:14] == bytes([0xDC, 0x00, 0x10])  # array16 of 16: tag + all 15 fields
    assert encoded[2] != frames[2]
    assert decode_frames(encoded) == DecodedBatch("", 0, batch, "array")


def test_vector_payloads_are_the_decoded_json() -> None:
    """The vectors agree with themselves: plain msgpack of the payload is the "decoded" JSON."""
    for case in VECTORS:
        assert _listify(msgpack.unpackb(vector_frames(case)[2])) == case["decoded"]


def _listify(value: object) -> object:
    if isinstance(value, dict):
        return {k: _listify(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_listify(v) for v in value]
    if isinstance(value, bytes):
        return {"bytes_hex": value.hex()}
    return value


def test_int_hashes_are_the_last_8_bytes_of_the_byte_hashes() -> None:
    """§1.7: the int form is the digest's last 8 bytes, big-endian — the vectors share digests."""
    by_name = {c["name"]: decode_frames(vector_frames(c)).batch.events[0] for c in VECTORS}
    ints, digests = by_name["stored_int_hashes"], by_name["stored_bytes_hashes_with_parent_and_extra_keys"]
    assert digests.block_keys_u64() == (ints.block_hashes[1],)
    assert digests.parent_key_u64() == ints.block_hashes[0]
    assert ints.block_keys_u64() == ints.block_hashes
    assert ints.parent_key_u64() is None


def test_lookahead_is_one_token_list_per_block() -> None:
    """Item 4: vLLM 0.33 BlockStored.lookahead_token_ids is list[list[int]], one list per block
    (the vectors stored_lookahead_* were encoded by vLLM's own structs and decoded back by them)."""
    case = next(c for c in VECTORS if c["name"] == "stored_lookahead_per_block")
    event = decode_frames(vector_frames(case)).batch.events[0]
    assert event.lookahead_token_ids == ((5, 6), (9, 10)) and event.extra_keys == (None, None)
    payload = msgpack.unpackb(vector_frames(case)[2])
    assert payload[1][0]["lookahead_token_ids"] == [[5, 6], [9, 10]]


def test_msgspec_map_header_is_sized_by_declared_fields() -> None:
    """BlockStored (15 fields + tag) always gets map16; BlockRemoved, AllBlocksCleared a fixmap."""
    stored = good_frames(STORED)[2]
    assert stored[11:14] == bytes([0xDE, 0x00, 0x08])  # 8 entries, map16 header
    full = replace(STORED, extra_keys=(None, None), group_idx=0, kv_cache_spec_kind="full_attention",
                   kv_cache_spec_sliding_window=128, locality="LOCAL", ownership="o", session_id="s",
                   lookahead_token_ids=((9,), (10,)))
    assert good_frames(full)[2][11:14] == bytes([0xDE, 0x00, 0x10])
    assert good_frames(BlockRemoved([1], "GPU"))[2][11] == 0x83
    assert good_frames(AllBlocksCleared())[2][11] == 0x81
    assert msgpack.packb({"type": "BlockStored"})[0] == 0x81  # what a plain msgpack encoder would write


def test_array_layout_writes_every_declared_field() -> None:
    """msgspec ignores omit_defaults for array_like structs (issue #720): defaults are written too."""
    event = replace(STORED, group_idx=None, locality="LOCAL")
    payload = msgpack.unpackb(encode_frames(EventBatch(1.0, [event], 0), layout="array")[2])
    assert payload[1][0] == ["BlockStored", [1, 2], None, list(range(8)), 4, None, "GPU", None,
                             None, None, None, None, "LOCAL", None, None, None]
    payload = msgpack.unpackb(encode_frames(EventBatch(1.0, [STORED], 0), layout="array")[2])
    assert payload[1][0] == ["BlockStored", [1, 2], None, list(range(8)), 4, None, "GPU", None, *[None] * 8]
    payload = msgpack.unpackb(encode_frames(EventBatch(1.0, [BlockRemoved([3], None), AllBlocksCleared()], 0),
                                            layout="array")[2])
    assert payload[1] == [["BlockRemoved", [3], None, None, None, None], ["AllBlocksCleared"]]


# msgspec array_like bytes derived by hand from the msgpack spec: header with the full field count,
# then the tag and each field packed in declaration order (checked against msgspec 0.23 structs with
# vLLM 0.33's field list; no released vLLM sent exactly this: old releases had fewer fields).
TS_1 = "cb3ff0000000000000"  # float64 1.0 (msgspec always writes floats as float64)
MSGSPEC_ARRAY_BYTES = [
    (BlockRemoved([5], "GPU"), 0,
     "93" + TS_1 + "91"                        # EventBatch [ts, events (1), rank]
     + "96" + "ac" + b"BlockRemoved".hex()     # fixarray 6 = tag + 5 fields; fixstr 12
     + "9105" + "a3" + b"GPU".hex()            # block_hashes [5]; medium "GPU"
     + "c0c0c0"                                # group_idx, locality, ownership: nil, not trimmed
     + "00"),                                  # data_parallel_rank 0
    (STORED, 0,
     "93" + TS_1 + "91"
     + "dc0010" + "ab" + b"BlockStored".hex()  # array16 of 16 = tag + 15 fields
     + "920102" + "c0"                         # block_hashes [1, 2]; parent nil
     + "98" + "0001020304050607" + "04"        # token_ids 0..7; block_size 4
     + "c0" + "a3" + b"GPU".hex() + "c0"       # lora_id nil; medium "GPU"; lora_name nil
     + "c0" * 8                                # extra_keys .. lookahead_token_ids: all nil
     + "00"),
    (AllBlocksCleared(), None,
     "93" + TS_1 + "91" + "91" + "b0" + b"AllBlocksCleared".hex()
     + "c0"),                                  # data_parallel_rank None is written as nil
]


@pytest.mark.parametrize(("event", "rank", "payload_hex"), MSGSPEC_ARRAY_BYTES, ids=["removed", "stored", "cleared"])
def test_array_layout_is_msgspec_array_like_bytes(event: object, rank: int | None, payload_hex: str) -> None:
    frames = encode_frames(EventBatch(1.0, [event], rank), layout="array")
    assert frames[2].hex() == payload_hex
    assert decode_frames(frames) == DecodedBatch("", 0, EventBatch(1.0, [event], rank), "array")


def test_missing_rank_is_written_as_nil_and_a_2_element_payload_still_decodes() -> None:
    frames = encode_frames(EventBatch(1.0, [AllBlocksCleared()]))
    assert frames[2].hex() == "93" + TS_1 + "91" + "81a4" + b"type".hex() + "b0" + b"AllBlocksCleared".hex() + "c0"
    assert decode_frames(frames).batch.data_parallel_rank is None
    two = frames_with_payload([1.0, [{"type": "AllBlocksCleared"}]])
    assert two[2][0] == 0x92
    assert decode_frames(two).batch == EventBatch(1.0, [AllBlocksCleared()], None)


def test_fields_and_defaults_follow_the_spec() -> None:
    for cls, names in ((BlockStored, STORED_FIELDS), (BlockRemoved, REMOVED_FIELDS), (AllBlocksCleared, [])):
        assert VLLM_FIELDS[cls] == tuple(names)
        declared = [f for f in fields(cls) if f.name in VLLM_FIELDS[cls]]
        assert [f.name for f in declared] == names
        assert [f.name for f in declared if f.default is MISSING] == REQUIRED[cls.__name__]
        assert all(f.default is None for f in declared if f.default is not MISSING)


# ---- round trips ----------------------------------------------------------------------------

INT_HASHES = st.integers(0, 2**64 - 1) | st.integers(-(2**63), -1)
BYTES_HASHES = st.binary(min_size=32, max_size=32) | st.binary(min_size=16, max_size=16)
HASHES = INT_HASHES | BYTES_HASHES
OPT_STR = st.none() | st.text(max_size=10)
LEAF = (st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=8)
        | st.binary(max_size=8) | st.floats(allow_nan=False))
KEY_ITEM = st.recursive(LEAF, lambda inner: st.lists(inner, max_size=3).map(tuple), max_leaves=6)
TOKENS = st.integers(0, 2**32 - 1)


@st.composite
def stored_events(draw: st.DrawFn) -> BlockStored:
    n = draw(st.integers(0, 4))
    block_size = draw(st.integers(1, 8))
    kind = draw(st.sampled_from([INT_HASHES, BYTES_HASHES]))  # one event's hashes and parent: one kind
    hashes = draw(st.lists(kind, min_size=n, max_size=n))
    tokens = draw(st.just([]) | st.lists(TOKENS, min_size=n * block_size, max_size=n * block_size))
    extra = draw(st.none() | st.lists(st.none() | st.lists(KEY_ITEM, max_size=3).map(tuple), min_size=n, max_size=n))
    return BlockStored(
        hashes, draw(st.none() | kind), tokens, block_size, draw(st.none() | st.integers(-(2**63), 2**64 - 1)),
        draw(OPT_STR), draw(OPT_STR), extra, draw(st.none() | st.integers(0, 2**64 - 1)), draw(OPT_STR),
        draw(st.none() | st.integers(1, 2**20)), draw(OPT_STR), draw(OPT_STR), draw(OPT_STR),
        draw(st.none() | st.lists(st.lists(TOKENS, max_size=3), min_size=n, max_size=n)))


REMOVED = st.builds(BlockRemoved, st.lists(INT_HASHES, max_size=4) | st.lists(BYTES_HASHES, max_size=4), OPT_STR,
                    st.none() | st.integers(0, 2**64 - 1), OPT_STR, OPT_STR)
EVENTS = st.one_of(stored_events(), REMOVED, st.just(AllBlocksCleared()))
BATCHES = st.builds(EventBatch, st.floats(0, 4e9), st.lists(EVENTS, max_size=5),
                    st.none() | st.integers(0, 2**64 - 1))


@given(batch=BATCHES, layout=st.sampled_from(["map", "array"]), topic=st.text(max_size=20),
       seq=st.integers(0, 2**64 - 1))
def test_round_trip(batch: EventBatch, layout: str, topic: str, seq: int) -> None:
    frames = encode_frames(batch, topic=topic, seq=seq, layout=layout)
    assert frames[:2] == [topic.encode(), seq.to_bytes(8, "big")]
    decoded = decode_frames(frames)
    assert decoded == DecodedBatch(topic, seq, batch, layout if batch.events else "map")
    assert encode_frames(decoded.batch, topic=topic, seq=seq, layout=layout) == frames


@given(batch=BATCHES)
def test_map_layout_omits_exactly_the_fields_at_their_default(batch: EventBatch) -> None:
    ts, events, rank = msgpack.unpackb(encode_frames(batch)[2])  # always 3 elements
    assert ts == batch.ts and rank == batch.data_parallel_rank
    for raw, event in zip(events, batch.events, strict=True):
        tag = type(event).__name__
        expected = [name for name in DECLARED[tag] if name in REQUIRED[tag] or getattr(event, name) is not None]
        assert list(raw) == ["type", *expected] and raw["type"] == tag


@given(batch=BATCHES)
def test_array_layout_is_positional_with_every_field(batch: EventBatch) -> None:
    ts, events, rank = msgpack.unpackb(encode_frames(batch, layout="array")[2])
    assert (ts, rank) == (batch.ts, batch.data_parallel_rank)
    for raw, event in zip(events, batch.events, strict=True):
        tag = type(event).__name__
        values = [getattr(event, name) for name in DECLARED[tag]]
        assert raw[0] == tag and len(raw) == 1 + len(DECLARED[tag])
        assert msgpack.packb(raw[1:]) == msgpack.packb(values)


@given(event=stored_events() | REMOVED)
def test_block_keys_u64(event: BlockStored | BlockRemoved) -> None:
    def u64(h: bytes | int) -> int:
        return int.from_bytes(h[-8:], "big") if isinstance(h, bytes) else h % 2**64
    assert event.block_keys_u64() == tuple(u64(h) for h in event.block_hashes)
    if isinstance(event, BlockStored):
        parent = event.parent_block_hash
        assert event.parent_key_u64() == (None if parent is None else u64(parent))


def test_sglang_int64_hashes() -> None:
    event = BlockStored([-1, -(2**63)], 5, [7, 8], 1, None, "CPU_PINNED", None)
    assert event.block_keys_u64() == (2**64 - 1, 2**63)
    assert decode_frames(good_frames(event)).batch.events == (event,)


def test_mixed_layouts_and_plain_msgpack_headers_decode() -> None:
    """Another producer may mix layouts and write minimal map headers; both are accepted."""
    array_event = ["BlockRemoved", [3], "GPU"]
    decoded = decode_frames(frames_with_payload([2.5, [STORED_MAP, array_event], 0]))
    assert decoded.layout == "mixed"
    assert decoded.batch.events == (BlockStored([1], None, [1, 2, 3, 4], 4, None, "GPU", None),
                                    BlockRemoved([3], "GPU"))


def test_unknown_map_keys_and_array_positions_are_ignored_and_reported() -> None:
    sglang = {**STORED_MAP, "cache_salt": "s", "future": [1]}
    array = ["BlockRemoved", [3], "GPU", None, None, None, "extra"]
    decoded = decode_frames(frames_with_payload([1.0, [sglang, array], 0]))
    assert decoded.unknown_fields == ((0, "cache_salt"), (0, "future"), (1, "[6]"))
    assert decoded.batch.events == (BlockStored([1], None, [1, 2, 3, 4], 4, None, "GPU", None),
                                    BlockRemoved([3], "GPU"))


# ---- construction ---------------------------------------------------------------------------

def test_construction_normalises_containers() -> None:
    event = BlockStored([np.uint64(2**64 - 1), 7], np.int64(-3), np.arange(2), 1, None, None, None,
                        extra_keys=[["a", ["b", 1]], None])
    assert event.block_hashes == (2**64 - 1, 7) and type(event.block_hashes[0]) is int
    assert event.token_ids == (0, 1) and event.parent_block_hash == -3 and type(event.parent_block_hash) is int
    assert event.extra_keys == (("a", ("b", 1)), None)
    assert event == BlockStored((2**64 - 1, 7), -3, (0, 1), 1, None, None, None, (("a", ("b", 1)), None))
    hash(event)
    removed = BlockRemoved([bytearray(b"ab"), b"cd"], None)
    assert removed.block_hashes == (b"ab", b"cd") and type(removed.block_hashes[0]) is bytes


BAD_EVENTS = [
    ("block_size 0", lambda: replace(STORED, block_size=0), "block_size must be an integer >= 1, got 0"),
    ("block_size str", lambda: replace(STORED, block_size="4"), "block_size must be an integer >= 1, got '4'"),
    ("tokens range", lambda: replace(STORED, token_ids=range(8)),
     "token_ids must be a list or tuple, got range"),
    ("token count mismatch", lambda: replace(STORED, token_ids=list(range(7))),
     "token_ids has 7 tokens but 2 block_hashes x block_size 4 = 8"),
    ("negative token", lambda: replace(STORED, token_ids=[0] * 7 + [-1]),
     "token_ids[7] must be an integer in [0, 2**64), got -1"),
    ("hash too big", lambda: replace(STORED, block_hashes=[1, 2**64]),
     "block_hashes[1]: an engine block hash must fit 64 bits, got 18446744073709551616"),
    ("hash too small", lambda: replace(STORED, block_hashes=[-(2**63) - 1, 1]), "block_hashes[0]: "),
    ("hash bool", lambda: replace(STORED, block_hashes=[True, 1]), "got True"),
    ("hash str", lambda: BlockRemoved(["ab"], None), "block_hashes[0]: an engine block hash must be bytes or"),
    ("hashes str", lambda: BlockRemoved("ab", None), "block_hashes must be a list or tuple, got str 'ab'"),
    ("parent float", lambda: replace(STORED, parent_block_hash=1.5), "parent_block_hash: "),
    ("empty bytes hash", lambda: BlockRemoved([b""], "GPU"),
     "block_hashes[0]: an engine block hash must not be empty bytes, got b''"),
    ("empty bytearray hash", lambda: BlockRemoved([b"\x01", bytearray()], "GPU"),
     "block_hashes[1]: an engine block hash must not be empty bytes, got b''"),
    ("empty parent", lambda: BlockStored([b"\x01"], b"", [], 1, None, None, None),
     "parent_block_hash: an engine block hash must not be empty bytes, got b''"),
    ("mixed hashes", lambda: replace(STORED, block_hashes=[1, b"\x02"]),
     ("block_hashes mixes integer and bytes hashes: block_hashes[1] is bytes b'\\x02' but block_hashes[0] is "
      "an integer 1")),
    ("mixed removed", lambda: BlockRemoved([b"\x01", b"\x02", -3], "GPU"),
     ("block_hashes mixes integer and bytes hashes: block_hashes[2] is an integer -3 but block_hashes[0] is "
      "bytes b'\\x01'")),
    ("parent bytes, hashes int", lambda: replace(STORED, parent_block_hash=b"\x05"),
     ("parent_block_hash is bytes b'\\x05' but block_hashes[0] is an integer 1; vLLM sends the parent in the "
      "same form as the hashes")),
    ("parent int, hashes bytes", lambda: BlockStored([b"\x01"], 9, [], 1, None, None, None),
     "parent_block_hash is an integer 9 but block_hashes[0] is bytes b'\\x01'"),
    ("extra_keys too deep", lambda: replace(STORED, extra_keys=[(_nested(40),), None]),
     "extra_keys[0]" + "[0]" * 32 + " nests arrays more than 32 levels deep"),
    ("extra_keys length", lambda: replace(STORED, extra_keys=[None]),
     "extra_keys has 1 entries but block_hashes has 2"),
    ("extra_keys entry", lambda: replace(STORED, extra_keys=["salt", None]),
     "extra_keys[0] must be None or a tuple, got str 'salt'"),
    ("extra_keys map", lambda: replace(STORED, extra_keys=[({"a": 1},), None]),
     "extra_keys[0][0] must be None, bool, int, float, str, bytes or a tuple of them, got dict"),
    ("medium int", lambda: replace(STORED, medium=5), "medium must be a str or None, got 5"),
    ("session bytes", lambda: replace(STORED, session_id=b"s"), "session_id must be a str or None, got b's'"),
    ("group_idx -1", lambda: BlockRemoved([1], None, group_idx=-1),
     "group_idx must be an integer in [0, 2**64) or None, got -1"),
    ("lora_id str", lambda: replace(STORED, lora_id="3"),
     "lora_id must be an integer in [-2**63, 2**64) or None, got '3'"),
    ("window 0", lambda: replace(STORED, kv_cache_spec_sliding_window=0), "kv_cache_spec_sliding_window must be"),
    ("lookahead", lambda: replace(STORED, lookahead_token_ids=[[1.0], []]),
     "lookahead_token_ids[0][0] must be an integer"),
    ("lookahead flat", lambda: replace(STORED, lookahead_token_ids=[9, 10]),
     "lookahead_token_ids[0] must be a list or tuple, got int 9"),
    ("lookahead per block", lambda: replace(STORED, lookahead_token_ids=[[9]]),
     "lookahead_token_ids has 1 lists but block_hashes has 2; vLLM 0.33 sends one list of lookahead tokens per block"),
    ("ts nan", lambda: EventBatch(math.nan, []), "ts must be a finite number in [0.0, 2**64), got nan"),
    ("ts inf", lambda: EventBatch(math.inf, []), "ts must be a finite number in [0.0, 2**64), got inf"),
    ("ts -inf", lambda: EventBatch(-math.inf, []), "ts must be a finite number in [0.0, 2**64), got -inf"),
    ("ts negative", lambda: EventBatch(-1.5, []), "ts must be a finite number in [0.0, 2**64), got -1.5"),
    ("ts negative int", lambda: EventBatch(-1, []), "ts must be a finite number in [0.0, 2**64), got -1"),
    ("ts huge int", lambda: EventBatch(10**400, []), "ts must be a finite number in [0.0, 2**64), got 1000"),
    ("ts 1e20", lambda: EventBatch(1e20, []), "ts must be a finite number in [0.0, 2**64), got 1e+20"),
    ("ts 1e300", lambda: EventBatch(1e300, []), "ts must be a finite number in [0.0, 2**64), got 1e+300"),
    ("ts 2**64", lambda: EventBatch(2**64, []), "ts must be a finite number in [0.0, 2**64), got 18446744073709551616"),
    ("ts 2**64-1", lambda: EventBatch(2**64 - 1, []), "2**64), got 18446744073709551615"),
    ("ts bool", lambda: EventBatch(True, []), "ts must be a finite number in [0.0, 2**64), got True"),
    ("event dict", lambda: EventBatch(1.0, [{"type": "AllBlocksCleared"}]),
     "events[0] must be a BlockStored, BlockRemoved or AllBlocksCleared, got dict"),
    ("rank negative", lambda: EventBatch(1.0, [], -1),
     "data_parallel_rank must be an integer in [0, 2**64) or None, got -1"),
]


def test_an_empty_medium_is_kept_as_vllm_decodes_it() -> None:
    """vLLM's msgspec decoder takes ``medium: ""``, so the classes and the codec do too (the JSON
    description refuses it, and the index's tier_of_medium refuses the event)."""
    for event in (BlockRemoved([1], ""), replace(STORED, medium=""), AllBlocksCleared("")):
        batch = EventBatch(1.0, [event], 0)
        assert decode_frames(encode_frames(batch)).batch == batch and event.medium == ""


def test_ts_below_2_64_as_a_float_round_trips_through_the_wire() -> None:
    largest = math.nextafter(2.0**64, 0.0)
    for ts in (largest, 1e19, np.float32(3.5), 2**53):
        batch = EventBatch(ts, [])
        assert decode_frames(encode_frames(batch)).batch == batch and isinstance(batch.ts, float)


def _nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


def test_parent_may_be_any_kind_when_no_hashes_and_kinds_stay_separate() -> None:
    assert BlockStored([], b"\x01", [], 1, None, None, None).parent_block_hash == b"\x01"
    assert BlockStored([], 5, [], 1, None, None, None).parent_block_hash == 5
    assert replace(STORED, extra_keys=[(_nested(31),), None]).extra_keys[0] == ((_tuples(31),))
    assert EventBatch(0, []).ts == 0.0


def _tuples(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = (value,)
    return value


@pytest.mark.parametrize(("case", "make", "message"), BAD_EVENTS, ids=[c[0] for c in BAD_EVENTS])
def test_bad_construction_names_field_and_value(case: str, make: object, message: str) -> None:
    with pytest.raises(ValueError) as info:
        make()  # type: ignore[operator]
    assert message in str(info.value)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"layout": "json"}, "layout must be one of ('map', 'array'), got 'json'"),
    ({"seq": -1}, "seq must be an integer in [0, 2**64), got -1"),
    ({"seq": 2**64}, "seq must be an integer in [0, 2**64)"),
    ({"topic": b"t"}, "topic must be a str, got b't'"),
    ({"topic": "kv@\udc80@m"}, "topic 'kv@\\udc80@m' cannot be encoded as UTF-8: 'utf-8' codec can't encode"),
])
def test_bad_encode_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError) as info:
        encode_frames(EventBatch(1.0, []), **kwargs)
    assert message in str(info.value)
    with pytest.raises(ValueError, match="batch must be an EventBatch, got list"):
        encode_frames([AllBlocksCleared()])  # type: ignore[arg-type]


# ---- malformed messages ---------------------------------------------------------------------

GOOD = good_frames(STORED)


class FakeFrame:
    """Like zmq.Frame: the frame's content in ``.bytes``, and no buffer protocol."""

    def __init__(self, content: object) -> None:
        self.bytes = content


def payload_with(*events: object) -> list[bytes]:
    return frames_with_payload([1.0, list(events), 0])


BAD_MESSAGES = [
    ("two frames", GOOD[:2], "expected 3 frames [topic, seq, payload], got 2", None),
    ("four frames", [*GOOD, b""], "expected 3 frames [topic, seq, payload], got 4", None),
    ("not a sequence", GOOD[2], "expected 3 frames [topic, seq, payload], got bytes", None),
    ("str frame", ["", *GOOD[1:]],
     "frame 0 (topic) must be bytes, bytearray, memoryview or a zmq.Frame (with .bytes), got str", None),
    ("int frame", [b"", 0, GOOD[2]],
     "frame 1 (seq) must be bytes, bytearray, memoryview or a zmq.Frame (with .bytes), got int", None),
    ("topic not UTF-8", [b"\xff", *GOOD[1:]], "frame 0 (topic) is not UTF-8", None),
    ("seq 7 bytes", [b"", bytes(7), GOOD[2]], "frame 1 (seq) must be 8 bytes (big-endian), got 7", None),
    ("seq 4 bytes", [b"", bytes(4), GOOD[2]], "frame 1 (seq) must be 8 bytes (big-endian), got 4", None),
    ("end marker", [b"", END_SEQ, b""], "replay end marker", None),
    ("numpy frame", [np.frombuffer(b"ab", dtype=np.uint8), *GOOD[1:]],
     "frame 0 (topic) must be bytes, bytearray, memoryview or a zmq.Frame (with .bytes), got ndarray", None),
    ("numpy int64 seq", [b"", np.zeros(1, dtype=np.int64), GOOD[2]],
     "frame 1 (seq) must be bytes, bytearray, memoryview or a zmq.Frame (with .bytes), got ndarray", None),
    ("non-bytes .bytes", [b"", bytes(8), FakeFrame("x")], "frame 2 (payload) must be bytes", None),
    ("empty payload", [b"", bytes(8), b""],
     "frame 2 (payload) is truncated or not msgpack (ValueError: Unpack failed: incomplete input)", None),
    ("1-byte truncated", [b"", bytes(8), b"\x93"],
     "frame 2 (payload) is truncated or not msgpack (ValueError: 3 exceeds max_array_len(1))", None),
    ("reserved byte", [b"", bytes(8), b"\xc1"],
     "frame 2 (payload) is not valid msgpack: a reserved or unknown type byte (FormatError)", None),
    ("garbage", [b"", bytes(8), b"\x93\xcb\x00\xc1"],
     "frame 2 (payload) is truncated or not msgpack (ValueError: Unpack failed: incomplete input)", None),
    ("deeply nested", [b"", bytes(8), b"\x91" * 5000],
     "frame 2 (payload) nests arrays or maps too deeply for msgpack's unpacker (StackError)", None),
    ("truncated", [b"", bytes(8), GOOD[2][:-3]], "frame 2 (payload) is truncated or not msgpack (ValueError: ", None),
    ("trailing bytes", [b"", bytes(8), GOOD[2] + b"\x00"],
     "frame 2 (payload) has 1 trailing byte(s) after its msgpack value (ExtraData: unpack(b) received extra data.)",
     None),
    ("string not UTF-8", [b"", bytes(8), b"\x93\x00\x90\xa1\xff"],
     "frame 2 (payload) holds a msgpack string that is not UTF-8 (UnicodeDecodeError: 'utf-8' codec", None),
    ("map as map key", [b"", bytes(8), b"\x93\x00\x91\x81\x81\x01\x02\x03\x00"],
     "frame 2 (payload) has a map key that is itself a map (TypeError: unhashable type: 'dict')", None),
    ("ts negative", frames_with_payload([-1.0, [], 0]),
     "EventBatch: ts must be a finite number in [0.0, 2**64), got -1.0", None),
    ("ts inf", frames_with_payload([math.inf, [], 0]),
     "EventBatch: ts must be a finite number in [0.0, 2**64), got inf", None),
    ("payload map", frames_with_payload({"ts": 1.0}),
     "payload must be an EventBatch array [ts, events, data_parallel_rank], got a map of 1 entries", None),
    ("payload 4-array", frames_with_payload([1.0, [], 0, 0]), "got an array of 4", None),
    ("payload 1-array", frames_with_payload([1.0]), "got an array of 1", None),
    ("payload int", frames_with_payload(7), "got int 7", None),
    ("events not array", frames_with_payload([1.0, 5, 0]), "EventBatch.events must be an array, got int 5", None),
    ("ts str", frames_with_payload(["1.0", [], 0]),
     "EventBatch: ts must be a finite number in [0.0, 2**64), got '1.0'", None),
    ("rank negative", frames_with_payload([1.0, [], -1]),
     "EventBatch: data_parallel_rank must be an integer in [0, 2**64) or None, got -1", None),
    ("event int", payload_with(7), "event 0: an event must be a map or an array, got int 7", 0),
    ("unknown type", payload_with({"type": "BlockMoved"}),
     "event 0: unknown event type 'BlockMoved' (known: BlockStored, BlockRemoved, AllBlocksCleared)", 0),
    ("unknown array type", payload_with(["Flush"]), "event 0: unknown event type 'Flush'", 0),
    ("no tag", payload_with({"block_hashes": [1], "medium": None}), "event 0: map event has no 'type' tag", 0),
    ("int map key", payload_with({"type": "AllBlocksCleared", 5: 1}), "event 0: event map has a non-string key 5", 0),
    ("bytes map key", payload_with(STORED_MAP, {b"type": "BlockRemoved"}),
     "event 1: event map has a non-string key b'type'", 1),
    ("array map key", payload_with({(1, 2): 0}), "event 0: event map has a non-string key (1, 2)", 0),
    ("empty hash", payload_with({**STORED_MAP, "block_hashes": [b""]}),
     "event 0: BlockStored: block_hashes[0]: an engine block hash must not be empty bytes, got b''", 0),
    ("mixed hashes", payload_with({"type": "BlockRemoved", "block_hashes": [7, b"\x07"], "medium": "GPU"}),
     ("event 0: BlockRemoved: block_hashes mixes integer and bytes hashes: block_hashes[1] is bytes b'\\x07' "
      "but block_hashes[0] is an integer 7"), 0),
    ("parent kind", payload_with({**STORED_MAP, "parent_block_hash": b"\x01"}),
     "event 0: BlockStored: parent_block_hash is bytes b'\\x01' but block_hashes[0] is an integer 1", 0),
    ("int tag", payload_with([5, [1], None]), "event 0: event type tag must be a string, got int 5", 0),
    ("empty array event", payload_with([]), "event 0: array event is empty (no type tag)", 0),
    ("missing medium", payload_with({k: v for k, v in STORED_MAP.items() if k != "medium"}),
     "event 0: BlockStored map event is missing required field 'medium'", 0),
    ("missing array fields", payload_with(["BlockStored", [1], None, [], 4, None]),
     "event 0: BlockStored array event is missing required fields 'medium', 'lora_name'", 0),
    ("removed missing medium", payload_with(["BlockRemoved", [1]]),
     "event 0: BlockRemoved array event is missing required field 'medium'", 0),
    ("block_size str", payload_with({**STORED_MAP, "block_size": "4"}),
     "event 0: BlockStored: block_size must be an integer >= 1, got '4'", 0),
    ("block_size nil", payload_with({**STORED_MAP, "block_size": None}),
     "event 0: BlockStored: block_size must be an integer >= 1, got None", 0),
    ("hash str", payload_with({**STORED_MAP, "block_hashes": ["ab"]}),
     "event 0: BlockStored: block_hashes[0]: an engine block hash must be bytes or an integer, got 'ab'", 0),
    ("token float", payload_with({**STORED_MAP, "token_ids": [1, 2, 3, 4.0]}),
     "event 0: BlockStored: token_ids[3] must be an integer in [0, 2**64), got 4.0", 0),
    ("token count", payload_with({**STORED_MAP, "token_ids": [1, 2, 3]}),
     "event 0: BlockStored: token_ids has 3 tokens but 1 block_hashes x block_size 4 = 4", 0),
    ("ext type", payload_with({**STORED_MAP, "token_ids": [1, 2, 3, msgpack.ExtType(5, b"x")]}),
     "event 0: BlockStored: token_ids[3] must be an integer", 0),
    ("medium int", payload_with({**STORED_MAP, "medium": 1}),
     "event 0: BlockStored: medium must be a str or None, got 1", 0),
    ("bad second event", payload_with(STORED_MAP, {"type": "BlockRemoved", "block_hashes": 3, "medium": "GPU"}),
     "event 1: BlockRemoved: block_hashes must be a list or tuple, got int 3", 1),
]


@pytest.mark.parametrize(("case", "frames", "message", "event"), BAD_MESSAGES, ids=[c[0] for c in BAD_MESSAGES])
def test_malformed_message_is_named(case: str, frames: object, message: str, event: int | None) -> None:
    with pytest.raises(EventDecodeError) as info:
        decode_frames(frames)  # type: ignore[arg-type]
    assert message in str(info.value)
    assert info.value.event == event
    assert info.value.message is None


@pytest.mark.parametrize("field", ["token_ids", "medium", "extra_keys"])
def test_values_nested_near_msgpacks_limit_raise_event_decode_error(field: str) -> None:
    """msgpack unpacks ~1000 levels; checking such a value must not escape as RecursionError."""
    deep = {"token_ids": [_nested(1000), 2, 3, 4], "medium": _nested(1000), "extra_keys": [(_nested(1000),)]}
    with pytest.raises(EventDecodeError) as info:
        decode_frames(payload_with({**STORED_MAP, field: deep[field]}))
    # Which message depends on the Python version's repr recursion limit; both name the problem.
    assert str(info.value).startswith(("frame 2 (payload) nests arrays or maps too deeply to check (RecursionError)",
                                       f"event 0: BlockStored: {field}"))


def test_recursion_while_checking_becomes_event_decode_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def too_deep(obj: object) -> object:
        raise RecursionError("maximum recursion depth exceeded")
    monkeypatch.setattr("kvlab.events.wire._decode_batch", too_deep)
    with pytest.raises(EventDecodeError) as info:
        decode_frames(GOOD)
    assert str(info.value) == "frame 2 (payload) nests arrays or maps too deeply to check (RecursionError)"


@given(payload=st.binary(max_size=64))
def test_arbitrary_payload_bytes_decode_or_raise_event_decode_error(payload: bytes) -> None:
    try:
        assert isinstance(decode_frames([b"", bytes(8), payload]), DecodedBatch)
    except EventDecodeError:
        pass


MSGPACK_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=12)
    | st.binary(max_size=12) | st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared", "type"]),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(
        st.sampled_from(["type", *STORED_FIELDS, "x"]), inner, max_size=6),
    max_leaves=30)


@given(obj=MSGPACK_VALUES)
def test_arbitrary_msgpack_structures_decode_or_raise_event_decode_error(obj: object) -> None:
    for payload in (obj, [1.0, [obj], 0], [1.0, obj, 0]):
        try:
            assert isinstance(decode_frames(frames_with_payload(payload)), DecodedBatch)
        except EventDecodeError:
            pass


# ---- streams and replay ---------------------------------------------------------------------

def test_bad_message_between_good_ones_leaves_both_intact() -> None:
    first = good_frames(STORED, BlockRemoved([1], "GPU"), seq=0)
    last = good_frames(AllBlocksCleared(), seq=2)
    bad_event = payload_with(STORED_MAP, {**STORED_MAP, "block_size": "4"})
    results = decode_stream([first, [b"", bytes(8), b"\xc1"], last, bad_event, first])
    assert len(results) == 5
    assert results[0] == results[4] == decode_frames(first)
    assert results[0].batch.events == (STORED, BlockRemoved([1], "GPU"))  # type: ignore[union-attr]
    assert results[2] == decode_frames(last)
    assert isinstance(results[1], EventDecodeError) and results[1].message == 1
    assert str(results[1]) == ("message 1: frame 2 (payload) is not valid msgpack: a reserved or unknown type byte "
                               "(FormatError)")
    assert isinstance(results[3], EventDecodeError) and (results[3].message, results[3].event) == (3, 1)
    assert str(results[3]) == "message 3: event 1: BlockStored: block_size must be an integer >= 1, got '4'"


def test_decode_stream_accepts_any_iterable_and_empty() -> None:
    assert decode_stream(iter([])) == []
    assert decode_stream(m for m in [GOOD]) == [decode_frames(GOOD)]


@pytest.mark.parametrize(("messages", "message"), [
    (5, "messages must be an iterable of messages (lists of frames), got int 5"),
    (None, "messages must be an iterable of messages (lists of frames), got NoneType None"),
    (b"\x93", "messages must be an iterable of messages (lists of frames), got bytes b'\\x93'"),
    ("abc", "messages must be an iterable of messages (lists of frames), got str 'abc'"),
])
def test_decode_stream_of_a_non_iterable_is_a_value_error(messages: object, message: str) -> None:
    with pytest.raises(ValueError) as info:
        decode_stream(messages)  # type: ignore[arg-type]
    assert str(info.value) == message
    assert not isinstance(info.value, EventDecodeError)


def test_end_of_replay() -> None:
    assert END_SEQ == b"\xff" * 8
    assert is_end_of_replay([b"", END_SEQ, b""])
    assert is_end_of_replay([b"kv@pod@m", END_SEQ, b""])
    assert is_end_of_replay([END_SEQ, b""])  # older releases sent no topic frame
    assert is_end_of_replay([memoryview(b""), bytearray(END_SEQ), b""])
    for frames in (GOOD, [b"", END_SEQ, b"\x90"], [b"", bytes(8), b""], [b"", END_SEQ], ["", "x", ""], None, b"",
                   [END_SEQ, b"", b""]):
        assert not is_end_of_replay(frames)


def test_frames_may_be_any_bytes_like() -> None:
    frames = [bytearray(GOOD[0]), memoryview(GOOD[1]), bytearray(GOOD[2])]
    assert decode_frames(tuple(frames)) == decode_frames(GOOD)
    assert decode_frames([FakeFrame(f) for f in GOOD]) == decode_frames(GOOD)
    assert is_end_of_replay([FakeFrame(b""), FakeFrame(END_SEQ), FakeFrame(b"")])
    assert not is_end_of_replay([np.frombuffer(f, dtype=np.uint8) for f in (b"", END_SEQ, b"")])


def test_zmq_frames_decode() -> None:
    zmq = pytest.importorskip("zmq")
    assert decode_frames([zmq.Frame(f) for f in GOOD]) == decode_frames(GOOD)


# ---- kvlab extension: AllBlocksCleared.medium (a reset scoped to one tier) -------------------

CLEARED_TAG = "a4" + b"type".hex() + "b0" + b"AllBlocksCleared".hex()
CLEARED_CPU_BYTES = [
    ("map", "93" + TS_1 + "91" + "82" + CLEARED_TAG      # fixmap 2: vLLM's 1 (the tag) + the extension key
     + "a6" + b"medium".hex() + "a3" + b"CPU".hex() + "00"),
    ("array", "93" + TS_1 + "91" + "92" + "b0" + b"AllBlocksCleared".hex()  # tag, then one extension slot
     + "a3" + b"CPU".hex() + "00"),
]


@pytest.mark.parametrize(("layout", "payload_hex"), CLEARED_CPU_BYTES, ids=["map", "array"])
def test_scoped_clear_adds_only_the_medium(layout: str, payload_hex: str) -> None:
    frames = encode_frames(EventBatch(1.0, [AllBlocksCleared("CPU")], 0), layout=layout)
    assert frames[2].hex() == payload_hex
    assert decode_frames(frames) == DecodedBatch("", 0, EventBatch(1.0, [AllBlocksCleared(medium="CPU")], 0),
                                                 layout)
    # A decoder that knows only vLLM's fields sees vLLM's AllBlocksCleared plus one extra key / trailing slot.
    expected = {"type": "AllBlocksCleared", "medium": "CPU"} if layout == "map" else ["AllBlocksCleared", "CPU"]
    assert msgpack.unpackb(frames[2])[1][0] == expected


def test_unscoped_clear_keeps_vllm_bytes_and_repr() -> None:
    for layout, body in (("map", "81" + CLEARED_TAG), ("array", "91" + "b0" + b"AllBlocksCleared".hex())):
        frames = encode_frames(EventBatch(1.0, [AllBlocksCleared(None)], 0), layout=layout)
        assert frames[2].hex() == "93" + TS_1 + "91" + body + "00"
    assert repr(AllBlocksCleared()) == "AllBlocksCleared()"
    assert repr(AllBlocksCleared("GPU")) == "AllBlocksCleared(medium='GPU')"
    assert [f.name for f in fields(AllBlocksCleared)] == ["medium"] and VLLM_FIELDS[AllBlocksCleared] == ()


def test_scoped_clear_decodes_without_unknown_fields() -> None:
    decoded = decode_frames(frames_with_payload([1.0, [{"type": "AllBlocksCleared", "medium": "DISK"},
                                                       ["AllBlocksCleared", None], ["AllBlocksCleared", "GPU", 7]], 0]))
    assert decoded.batch.events == (AllBlocksCleared("DISK"), AllBlocksCleared(), AllBlocksCleared("GPU"))
    assert decoded.unknown_fields == ((2, "[2]"),)  # only the slot after the extension is unknown
    assert decoded.layout == "mixed"


@pytest.mark.parametrize("raw", [{"type": "AllBlocksCleared", "medium": 5}, ["AllBlocksCleared", 5]],
                         ids=["map", "array"])
def test_scoped_clear_with_a_non_string_medium_is_named(raw: object) -> None:
    with pytest.raises(EventDecodeError) as info:
        decode_frames(frames_with_payload([1.0, [raw], 0]))
    assert str(info.value) == "event 0: AllBlocksCleared: medium must be a str or None, got 5"
    with pytest.raises(ValueError, match="medium must be a str or None, got b'GPU'"):
        AllBlocksCleared(b"GPU")  # type: ignore[arg-type]


SCOPED_BATCHES = st.builds(EventBatch, st.floats(0, 4e9),
                           st.lists(EVENTS | st.builds(AllBlocksCleared, OPT_STR), max_size=5), st.just(0))


@given(batch=SCOPED_BATCHES, layout=st.sampled_from(["map", "array"]))
def test_scoped_clears_round_trip_and_unscoped_bytes_match_vllm(batch: EventBatch, layout: str) -> None:
    frames = encode_frames(batch, layout=layout)
    assert decode_frames(frames).batch == batch
    # Dropping every medium of the clears gives exactly the bytes of vLLM's field-less events.
    plain = EventBatch(batch.ts, [AllBlocksCleared() if isinstance(e, AllBlocksCleared) else e for e in batch.events],
                       0)
    vllm_view = msgpack.unpackb(frames[2])
    for raw, event in zip(vllm_view[1], batch.events, strict=True):
        if isinstance(event, AllBlocksCleared) and event.medium is not None:
            if isinstance(raw, dict):
                del raw["medium"]
            else:
                raw.pop()
    assert msgpack.packb(vllm_view) == msgpack.packb(msgpack.unpackb(encode_frames(plain, layout=layout)[2]))
