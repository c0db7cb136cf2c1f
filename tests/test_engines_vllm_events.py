"""vLLM KV events from the block pool and the manager, against vLLM 0.33.0 itself.

``tests/vectors/vllm_engine_events.json`` holds the events (and their msgpack payload)
that the released vLLM 0.33.0 ``KVCacheManager`` published on the same operations: every
field, byte for byte (issue 14 item 6: ``extra_keys``, ``group_idx``,
``kv_cache_spec_kind``, LoRA, session and medium fields).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from kvlab.engines.vllm.block_pool import BlockPool
from kvlab.engines.vllm.kv_cache_manager import KVCacheManager
from kvlab.engines.vllm.request import Request
from kvlab.events.types import BlockRemoved, BlockStored, EventBatch
from kvlab.events.wire import encode_frames
from kvlab.hashing import RequestExtras, vllm

VECTORS = json.loads((Path(__file__).parent / "vectors" / "vllm_engine_events.json").read_text())


def plain(value: object) -> object:
    """Tuples as lists, recursively (JSON's view of an event)."""
    if isinstance(value, (tuple, list)):
        return [plain(v) for v in value]
    return value


def as_dict(event: object) -> dict:
    return {"type": type(event).__name__, **{k: plain(v) for k, v in dataclasses.asdict(event).items()}}


def build_request(step: dict, block_size: int) -> Request:
    lora = step.get("lora")
    extras = RequestExtras(lora_name=lora[0] if lora else None, lora_path=lora[2] if lora else None,
                           cache_salt=step.get("cache_salt"))
    return Request.from_tokens(step["id"], step["tokens"], vllm(block_size=block_size), extras,
                               lora_id=lora[1] if lora else None, session_id=step.get("session_id"))


@pytest.mark.parametrize("case", VECTORS["cases"], ids=lambda c: c["name"])
def test_events_match_vllm_0_33(case: dict) -> None:
    params = case["params"]
    block_size = params["block_size"]
    manager = KVCacheManager(BlockPool(params["num_blocks"], block_size=block_size, enable_kv_cache_events=True),
                             block_size=block_size)
    requests: dict[str, Request] = {}
    for expected in case["steps"]:
        step = expected["step"]
        if step["op"] == "admit":
            request = requests[step["id"]] = build_request(step, block_size)
            hits, hit_tokens = manager.get_computed_blocks(request)
            assert manager.allocate_slots(request, request.num_tokens - hit_tokens, hit_tokens, hits) is not None
        else:
            manager.free(requests[step["id"]])
        events = manager.take_events()
        assert [as_dict(e) for e in events] == expected["events"], step
        payload = encode_frames(EventBatch(0.0, events))[2]
        assert payload.hex() == expected["payload_hex"], step


def test_issue_example_fields() -> None:
    """The issue's case, spelled out: 6 blocks of 4, tokens 0..9, allocate_slots(req, 10)."""
    manager = KVCacheManager(BlockPool(6, block_size=4, enable_kv_cache_events=True), block_size=4)
    request = Request.from_tokens("r", range(10), vllm(block_size=4))
    manager.allocate_slots(request, 10)
    (stored,) = manager.take_events()
    assert (stored.extra_keys, stored.group_idx, stored.kv_cache_spec_kind) == ((None, None), 0, "full_attention")
    manager.free(request)
    manager.allocate_slots(Request.from_tokens("s", range(100, 120), vllm(block_size=4)), 20)
    removed = [e for e in manager.take_events() if isinstance(e, BlockRemoved)]
    assert [e.group_idx for e in removed] == [0, 0]


def test_pool_alone_leaves_the_spec_kind_to_the_manager() -> None:
    """vLLM's BlockPool publishes no spec kind; KVCacheManager.take_events adds it."""
    pool = BlockPool(4, block_size=4, enable_kv_cache_events=True, medium="CPU")
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(blocks, [11, 12], 0, 2, extra_keys=[("s",), None], lora_id=3, lora_name="a",
                           session_id="x")
    (stored,) = pool.take_events()
    assert stored == BlockStored([11, 12], None, [], 4, 3, "CPU", "a", extra_keys=[("s",), None], group_idx=0,
                                 session_id="x")
    assert stored.kv_cache_spec_kind is None


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"extra_keys": [None]}, "extra_keys has 1 entries but 2 blocks are stored"),
    ({"lora_id": "x"}, "lora_id"),
    ({"session_id": 5}, "session_id"),
])
def test_bad_event_fields_change_nothing(kwargs: dict, message: str) -> None:
    pool = BlockPool(4, block_size=4, enable_kv_cache_events=True)
    blocks = pool.get_new_blocks(2)
    with pytest.raises(ValueError, match=message):
        pool.cache_full_blocks(blocks, [11, 12], 0, 2, **kwargs)
    assert [b.block_hash for b in blocks] == [None, None] and pool.take_events() == []


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"extras": RequestExtras(lora_name="ad")}, "lora_id is None"),
    ({"lora_id": 3}, "lora_id=3 needs extras with a lora_name"),
    ({"extras": RequestExtras(lora_name="ad"), "lora_id": 0}, "lora_id"),
    ({"session_id": b"s"}, "session_id"),
])
def test_request_event_fields_checked(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Request.from_tokens("r", range(8), vllm(block_size=4), **kwargs)


def test_medium_is_checked() -> None:
    with pytest.raises(ValueError, match="medium"):
        BlockPool(4, medium="")
