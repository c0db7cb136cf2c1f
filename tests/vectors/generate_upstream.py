"""Regenerate the upstream-executed vectors of issue 14 by running vLLM 0.33.0's and LMCache 0.5.6's
own code (not kvlab's): LMCache chunk hashes in every setup, its multimodal placeholder values, vLLM's
incremental block hasher, and vLLM's KV-event msgspec bytes with per-block lookahead tokens.

Needs a scratch venv with the released wheels, never the project venv::

    python3 -m venv /tmp/up
    /tmp/up/bin/pip install --no-deps vllm==0.33.0 lmcache==0.5.6 msgspec cbor2 blake3 xxhash numpy
    /tmp/up/bin/python tests/vectors/generate_upstream.py

The upstream modules are imported unchanged with their heavy imports stubbed (``upstream_loader``);
setups that differ by process (vLLM importable or not, ``PYTHONHASHSEED``) run in subprocesses.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent


def _wheel(name: str) -> str:
    """``"<name> <version> wheel"``; importable without the upstream venv (pytest collects this file)."""
    try:
        return f"{name} {version(name)} wheel"
    except PackageNotFoundError:
        return f"{name} (not installed)"


LMCACHE, VLLM, MSGSPEC = _wheel("lmcache"), _wheel("vllm"), _wheel("msgspec").removesuffix(" wheel")
TOKENS_13 = list(range(1, 14))
TOKENS_600 = list(range(1000, 1600))
IMG = "4f" * 31 + "1234"   # a blake3-like 64-hex identifier
# (name, token_ids, mm items as (identifier, offset, length)); the prompt's placeholder token is 151655
MM_REQUESTS = [
    ("one_image", [1, 2, 3, 4] + [151655] * 6 + [5, 6], [(IMG, 4, 6)]),
    ("two_images_request_scoped_ids", [7] * 3 + [151655] * 5 + [8] * 2 + [151655] * 3 + [9] * 3,
     [("chatcmpl-a2a48871c4aad192-image-0", 3, 5), ("chatcmpl-a2a48871c4aad192-image-1", 10, 3)]),
    # the hashed prefix ends inside the first item; the second starts after it (LMCache's save path)
    ("prefix_cuts_an_item", [1, 2, 3, 4, 5, 6] + [151655] * 4, [(IMG, 6, 8), ("img-later", 14, 2)]),
]


def _lmcache_case(scheme: str, name: str, params: dict, tokens: list[int], expected: dict, checked: str,
                  mm: list | None = None) -> dict:
    case = {"scheme": scheme, "name": name, "params": params, "token_ids": tokens}
    if mm is not None:
        case["mm_items"] = [{"identifier": i, "offset": o, "length": n} for i, o, n in mm]
    case |= {"expected": expected, "verification": "upstream_executed", "checked_with": checked}
    return case


def _apply_mm(tokens: list[int], mm: list) -> list[int]:
    from lmcache.integration.vllm.utils import apply_mm_hashes_to_token_ids

    class Ids(list):  # the slice of a torch tensor LMCache writes into
        dtype = None

        def size(self, dim: int) -> int:
            return len(self)

    out = Ids(tokens)
    apply_mm_hashes_to_token_ids(out, [i for i, _, _ in mm], [SimpleNamespace(offset=o, length=n) for _, o, n in mm])
    return list(out)


def lmcache_setup_cases() -> list[dict]:
    """This process's setup (vLLM importable or not, PYTHONHASHSEED): chunk hashes of both modes."""
    from lmcache.v1.multiprocess.token_hasher import TokenHasher
    from lmcache.v1.token_database import ChunkedTokenDatabase

    no_vllm = os.environ.get("UPSTREAM_NO_VLLM") == "1"
    seed = os.environ.get("PYTHONHASHSEED")
    suffix = ".no_vllm" if no_vllm else ""
    cases = []
    if no_vllm:
        chunked = ["builtin", "sha256_cbor", "xxhash"]
        mp = ["blake3", "sha256_cbor", "builtin"]
    elif seed is not None:
        chunked, mp = ["builtin", "sha256_cbor"], ["builtin"]
    else:
        chunked, mp = ["sha256_cbor", "sha256"], ["blake3", "sha256_cbor"]
    requests = [("empty", []), ("chunk4_13_tokens", TOKENS_13), ("default_chunk256_600_tokens", TOKENS_600)]
    for algo in chunked:
        for unfull in (False, True):
            for name, tokens in requests:
                size = 256 if name.startswith("default") else 4
                config = SimpleNamespace(pre_caching_hash_algorithm=algo, chunk_size=size, save_unfull_chunk=unfull,
                                         remote_url=None, enable_pd=False)
                db = ChunkedTokenDatabase(config)
                hashes = [h for _, _, h in db.process_tokens(tokens=tokens, make_key=False)]
                params = {"chunk_size": size, "pre_caching_hash_algorithm": algo, "save_unfull_chunk": unfull,
                          "vllm_importable": not no_vllm, "PYTHONHASHSEED": seed}
                cases.append(_lmcache_case(f"lmcache.chunked_token_db.{algo}{suffix}",
                                           f"{name}[save_unfull_chunk={unfull}]", params, tokens,
                                           {"chunk_hashes_int": hashes},
                                           f"{LMCACHE}: ChunkedTokenDatabase.process_tokens(make_key=False)"
                                           + ("" if no_vllm else f" with {VLLM} hashing/init_none_hash")))
    for algo in mp:
        for name, tokens in requests:
            size = 256 if name.startswith("default") else 4
            hashes = TokenHasher(size, algo).compute_chunk_hashes(tokens)
            params = {"chunk_size": size, "hash_algorithm": algo, "vllm_importable": not no_vllm,
                      "PYTHONHASHSEED": seed}
            if algo != "blake3" and (no_vllm or algo == "builtin"):
                params["python_none_hash"] = hash(None)  # CPython 3.11: None's address in this process
            scheme = f"lmcache.mp_token_hasher.{algo}{suffix if algo != 'blake3' else ''}"
            cases.append(_lmcache_case(scheme, name, params, tokens, {"chunk_hashes_hex": [h.hex() for h in hashes]},
                                       f"{LMCACHE}: TokenHasher.compute_chunk_hashes"
                                       + ("" if no_vllm or algo == "blake3" else f" with {VLLM}")))
    return cases


def lmcache_mm_cases() -> list[dict]:
    """Placeholder values, and chunk hashes of prompts whose MM spans LMCache overwrites first."""
    from lmcache.integration.vllm.utils import mm_hash_to_token_values
    from lmcache.v1.multiprocess.token_hasher import TokenHasher
    from lmcache.v1.token_database import ChunkedTokenDatabase

    cases = []
    for identifier, length in [("img", 10), (IMG, 17), ("chatcmpl-a2a48871c4aad192-image-0", 8), ("0x1234", 0),
                               ("bild-ü-画像", 9)]:
        cases.append({"scheme": "lmcache.mm_hash_to_token_values", "name": f"{identifier[:12]}x{length}",
                      "identifier": identifier, "length": length,
                      "expected": {"values": list(mm_hash_to_token_values(identifier, length))},
                      "verification": "upstream_executed",
                      "checked_with": f"{LMCACHE}: lmcache.integration.vllm.utils.mm_hash_to_token_values"})
    config = SimpleNamespace(pre_caching_hash_algorithm="sha256_cbor", chunk_size=4, save_unfull_chunk=False,
                             remote_url=None, enable_pd=False)
    for name, tokens, mm in MM_REQUESTS:
        replaced = _apply_mm(tokens, mm)
        db = ChunkedTokenDatabase(config)
        hashes = [h for _, _, h in db.process_tokens(tokens=replaced, make_key=False)]
        params = {"chunk_size": 4, "pre_caching_hash_algorithm": "sha256_cbor", "save_unfull_chunk": False,
                  "vllm_importable": True, "PYTHONHASHSEED": None}
        checked = f"{LMCACHE}: apply_mm_hashes_to_token_ids, then ChunkedTokenDatabase.process_tokens with {VLLM}"
        cases.append(_lmcache_case("lmcache.chunked_token_db.sha256_cbor", f"mm_{name}", params, tokens,
                                   {"tokens_after_placeholders": replaced, "chunk_hashes_int": hashes}, checked, mm))
        mp = TokenHasher(4, "blake3").compute_chunk_hashes(replaced)
        params = {"chunk_size": 4, "hash_algorithm": "blake3", "vllm_importable": True, "PYTHONHASHSEED": None}
        cases.append(_lmcache_case("lmcache.mp_token_hasher.blake3", f"mm_{name}", params, tokens,
                                   {"tokens_after_placeholders": replaced, "chunk_hashes_hex": [h.hex() for h in mp]},
                                   f"{LMCACHE}: apply_mm_hashes_to_token_ids, then TokenHasher.compute_chunk_hashes",
                                   mm))
    return cases


class _Request:
    """The attributes of vllm.v1.request.Request that get_request_block_hasher reads."""

    def __init__(self, mm: list, cache_salt: str | None, lora: tuple[str, str] | None) -> None:
        self.all_token_ids: list[int] = []
        self.block_hashes: list[bytes] = []
        # a fresh str object per item, as vLLM's hashing gives each item: pickle memoises by identity
        self.mm_features = [SimpleNamespace(identifier="".join(list(i)),
                                            mm_position=SimpleNamespace(offset=o, length=n)) for i, o, n in mm]
        self.cache_salt = cache_salt
        self.lora_request = None if lora is None else SimpleNamespace(lora_name=lora[0], lora_path=lora[1])
        self.prompt_embeds = None

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)


def vllm_incremental_cases() -> list[dict]:
    """vLLM's request_block_hasher as Request.append_output_token_ids drives it, append by append."""
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils

    rng = random.Random(14)
    layouts = [  # bug-report case 2: a block [t0, A, A, t1, B, t2] completed by two generated tokens
        ("two_images_block_completed_by_generation", 8, [11, 900, 900, 12, 901, 13, 14, 15],
         [("image-A", 1, 2), ("image-B", 4, 1)], [6, 1, 1], None, None),
        ("two_images_second_block_completed_by_generation", 8,
         list(range(100, 108)) + [11, 900, 900, 12, 901, 13, 14, 15],
         [("image-A", 9, 2), ("image-B", 12, 1)], [14, 1, 1], None, None),
    ]
    for k in range(24):
        tokens = [rng.randrange(200_000) for _ in range(rng.randrange(4, 48))]
        items, position = [], 0
        for _ in range(rng.randrange(0, 5)):
            offset, length = position + rng.randrange(0, 6), rng.randrange(1, 9)
            if offset + length <= len(tokens):
                items.append((rng.choice(["img-a", "img-b", "a" * 64]), offset, length))
            position = offset + length
        cuts, left = [], len(tokens)
        while left:
            cuts.append(step := min(left, rng.randrange(1, 9)))
            left -= step
        layouts.append((f"random_{k}", rng.randrange(1, 9), tokens, items, cuts, rng.choice([None, "salt"]),
                        rng.choice([None, ("ad", "/adapters/ad")])))
    cases = []
    for algo in ("sha256", "sha256_cbor"):
        hash_fn = get_hash_fn_by_name(algo)
        kv_cache_utils.init_none_hash(hash_fn)
        for name, block_size, tokens, items, cuts, salt, lora in layouts:
            hasher = kv_cache_utils.get_request_block_hasher(block_size, hash_fn)
            request, per_append, start = _Request(items, salt, lora), [], 0
            for step in cuts:
                request.all_token_ids += tokens[start:start + step]
                start += step
                new = hasher(request)
                request.block_hashes += new
                per_append.append([h.hex() for h in new])
            request_json = {"token_ids": tokens, "appends": cuts,
                            "mm": [{"identifier": i, "offset": o, "length": n} for i, o, n in items],
                            "cache_salt": salt, "lora": None if lora is None else {"name": lora[0], "path": lora[1]}}
            cases.append({"scheme": f"vllm.{algo}", "name": name,
                          "params": {"hash_algo": algo, "block_size": block_size, "PYTHONHASHSEED": None},
                          "request": request_json, "expected": {"new_block_hashes_per_append": per_append},
                          "verification": "upstream_executed",
                          "checked_with": f"{VLLM}: kv_cache_utils.get_request_block_hasher called after each append"})
    return cases


def _to_json(value: object) -> object:
    if isinstance(value, bytes):
        return {"bytes_hex": value.hex()}
    if isinstance(value, (list, tuple)):
        return [_to_json(v) for v in value]
    return value


def vllm_wire_cases() -> list[dict]:
    """msgspec bytes of vLLM's own KVEventBatch / BlockStored structs, decoded back by vLLM's decoder."""
    import msgspec
    from vllm.distributed.kv_events import BlockStored, KVEventBatch

    stored = [
        ("stored_lookahead_per_block", 1700000003.25, 0, BlockStored(
            block_hashes=[9561501211280363793, 15292913576410714033], parent_block_hash=None,
            token_ids=[1, 2, 3, 4, 5, 6, 7, 8], block_size=4, lora_id=None, medium="GPU", lora_name=None,
            extra_keys=[None, None], group_idx=0, lookahead_token_ids=[[5, 6], [9, 10]])),
        ("stored_lookahead_one_token_bytes_hashes", 1700000004.0, 2, BlockStored(
            block_hashes=[bytes.fromhex("e1bc29393a2da9fd798f35ff04d215f846aee6df4b803ce3d43b57df56b58fb1")],
            parent_block_hash=bytes.fromhex("58d0879dff3800f65f8c5fd449d73048c0f7699dd238a03b84b146b151d55111"),
            token_ids=[5, 6, 7, 8], block_size=4, lora_id=None, medium="GPU", lora_name=None,
            extra_keys=[(("img-0", -1),)], group_idx=0, kv_cache_spec_kind="full_attention",
            session_id="sess-1", lookahead_token_ids=[[2**40]])),
    ]
    encoder, decoder = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(KVEventBatch)
    cases = []
    for name, ts, rank, event in stored:
        batch = KVEventBatch(ts=ts, events=[event], data_parallel_rank=rank)
        payload = encoder.encode(batch)
        back = decoder.decode(payload)  # Any-typed nested tuples come back as lists: compare the bytes
        assert encoder.encode(back) == payload and back.events[0].lookahead_token_ids == event.lookahead_token_ids
        fields = {f: getattr(event, f) for f in event.__struct_fields__
                  if f in event.__struct_fields__[:7] or getattr(event, f) is not None}
        decoded = [ts, [{"type": "BlockStored", **{k: _to_json(v) for k, v in fields.items()}}], rank]
        cases.append({"scheme": "vllm.kv_events.msgpack", "name": name, "params": {"topic": "", "seq": 0},
                      "zmq_frames_hex": ["", "0000000000000000", payload.hex()], "decoded": decoded,
                      "verification": "upstream_executed",
                      "checked_with": f"{VLLM}: msgspec structs from vllm/distributed/kv_events.py, "
                                      f"{MSGSPEC} msgspec.msgpack.Encoder() as in ZmqEventPublisher; "
                                      "decoded back with msgspec.msgpack.Decoder(KVEventBatch)"})
    return cases


def _run_part(part: str, env: dict[str, str]) -> list[dict]:
    environment = {k: v for k, v in os.environ.items() if k not in ("PYTHONHASHSEED", "UPSTREAM_NO_VLLM")} | env
    out = subprocess.run([sys.executable, __file__, part], env=environment, check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out)


def _write(name: str, header: dict, cases: list[dict]) -> None:
    (HERE / name).write_text(json.dumps({**header, "cases": cases}, indent=1) + "\n")


def main() -> None:
    levels = json.loads((HERE / "lmcache_chunk_hashes.json").read_text())["verification_levels"]
    lmcache = (_run_part("lmcache_setup", {}) + _run_part("lmcache_setup", {"PYTHONHASHSEED": "0"})
               + _run_part("lmcache_setup", {"PYTHONHASHSEED": "42"})
               + _run_part("lmcache_setup", {"UPSTREAM_NO_VLLM": "1"}) + _run_part("lmcache_mm", {}))
    _write("lmcache_chunk_hashes.json",
           {"generator": "tests/vectors/generate_upstream.py (runs the upstream code)", "verification_levels": levels,
            "scheme_family": f"LMCache (lmcache {version('lmcache')}; vLLM {version('vllm')} where importable)",
            "python": f"CPython {sys.version.split()[0]} 64-bit"}, lmcache)
    _write("vllm_incremental_hashes.json",
           {"generator": "tests/vectors/generate_upstream.py (runs the upstream code)", "verification_levels": levels,
            "scheme_family": f"vLLM v1 incremental request block hashes (vllm {version('vllm')})"},
           _run_part("vllm_incremental", {}))
    wire_path = HERE / "vllm_kv_events_wire.json"
    wire = json.loads(wire_path.read_text())
    new = _run_part("vllm_wire", {})
    names = {c["name"] for c in new}
    wire["cases"] = [c for c in wire["cases"] if c["name"] not in names] + new
    wire_path.write_text(json.dumps(wire, indent=1) + "\n")


PARTS = {"lmcache_setup": lmcache_setup_cases, "lmcache_mm": lmcache_mm_cases,
         "vllm_incremental": vllm_incremental_cases, "vllm_wire": vllm_wire_cases}

if __name__ == "__main__":
    if len(sys.argv) == 2:
        sys.path.insert(0, str(HERE))
        import upstream_loader

        upstream_loader.install()
        print(json.dumps(PARTS[sys.argv[1]]()))
    else:
        main()
