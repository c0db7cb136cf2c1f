"""LMCache's multimodal placeholders: token values that carry an item's identity into chunk keys.

LMCache keys chunks by token ids only, and vLLM gives every image the same placeholder
token, so its vLLM connectors first overwrite each item's placeholder span with values
derived from the item's identifier (``apply_mm_hashes_to_token_ids``,
``lmcache/integration/vllm/utils.py``; docs/specs/hashing.md §4.3)::

    seed      = sha256(utf8(identifier))                          32 bytes
    block_k   = sha256(seed ‖ k as 8 bytes big-endian)            k = 0, 1, ...
    value_i   = big-endian u32 word i of block_0 ‖ block_1 ‖ ...  & (2**31 - 1)

LMCache 0.5.6 (``mm_hash_to_token_values``, PR #4783) gives every position its own
31-bit value; older releases wrote one 16-bit value over the whole span
(``hex_hash_to_int16``), so two images whose digests end in the same 4 hex digits
collided (LMCache issues #3301, #4086). The per-position values are checked against the
0.5.6 wheel (tests/vectors/lmcache_chunk_hashes.json); the 16-bit form has no executed
vector (0.5.6 no longer ships it).
"""

from __future__ import annotations

import hashlib
import string
from collections.abc import Sequence

import numpy as np

from kvlab.core.validate import check_choice, check_count, check_str
from kvlab.hashing.base import MMItem, as_token_array

MM_PLACEHOLDER_MODES = ("per_position", "int16_legacy")
_INT31_MASK = (1 << 31) - 1


def hex_hash_to_int16(identifier: str) -> int:
    """An MM identifier reduced to 16 bits — LMCache's pre-fix placeholder value.

    Models ``lmcache.integration.mm_utils.hex_hash_to_int16`` (before LMCache PR #4783):
    the stripped identifier, ``0x`` prefix allowed, is read as hex and masked to its
    last 4 hex digits; a non-hex identifier gives the first 2 bytes of its SHA-256
    (big-endian). Two images whose digests share their last 4 hex digits get the same
    value (LMCache issues #3301, #4086).

    Raises:
        ValueError: ``identifier`` is not a string.

    Example:
        >>> hex_hash_to_int16("0x123456"), hex_hash_to_int16(" FfFf ")
        (13398, 65535)
    """
    stripped = check_str("identifier", identifier).strip()
    hex_part = stripped[2:] if stripped.lower().startswith("0x") else stripped
    if hex_part and all(c in string.hexdigits for c in hex_part):
        return int(hex_part, 16) & 0xFFFF
    return int.from_bytes(hashlib.sha256(stripped.encode("utf-8")).digest()[:2], "big")


def mm_placeholder_values(identifier: str, length: int) -> list[int]:
    """``length`` placeholder values in ``[0, 2**31)``, one per position, from the identifier.

    LMCache 0.5.6 ``mm_hash_to_token_values``: the identifier's UTF-8 bytes are hashed
    with SHA-256 once (the *seed*); block ``k`` of the value stream is
    ``sha256(seed ‖ k as 8 bytes BE)``, cut into eight big-endian 32-bit words; position
    ``i`` takes word ``i`` with its top bit cleared. Prefix-stable:
    ``values(x, m) == values(x, n)[:m]`` for ``m <= n``.

    Raises:
        ValueError: ``identifier`` not a string, or ``length`` not an integer >= 0.

    Example:
        >>> mm_placeholder_values("img", 3)  # LMCache 0.5.6 gives the same
        [864481872, 850983454, 663315369]
    """
    seed = hashlib.sha256(check_str("identifier", identifier).encode("utf-8")).digest()
    length = check_count("length", length)
    stream = b"".join(hashlib.sha256(seed + k.to_bytes(8, "big")).digest() for k in range(-(-length // 8)))
    return (np.frombuffer(stream, dtype=">u4")[:length] & _INT31_MASK).tolist()


def apply_mm_placeholders(token_ids: Sequence[int] | np.ndarray, mm_items: Sequence[MMItem],
                          mm_placeholder: str = "per_position") -> np.ndarray:
    """Token ids with every MM item's placeholder span overwritten, as LMCache's vLLM
    connector does before chunk hashing (``apply_mm_hashes_to_token_ids``).

    ``token_ids`` may be a prefix of the prompt (LMCache hashes the prefix it saves):
    a span running past its end is cut there, and an item starting at or after it is
    skipped. Items are applied in the order given (LMCache zips the request's
    identifiers with their positions), so where spans overlap the later item wins.

    Args:
        token_ids: ``int[n]`` token ids.
        mm_items: the request's items.
        mm_placeholder: ``"per_position"`` (:func:`mm_placeholder_values`, LMCache 0.5.6)
            or ``"int16_legacy"`` (one :func:`hex_hash_to_int16` value over the span).

    Returns:
        A new ``int64[n]`` (``uint64[n]`` for uint64 input) array.

    Raises:
        ValueError: bad token ids, an item that is not an :class:`MMItem`, or an
            unknown ``mm_placeholder``.

    Example:
        >>> apply_mm_placeholders([7, 7, 7, 7], [MMItem("0xabcd", 1, 2)], "int16_legacy").tolist()
        [7, 43981, 43981, 7]
        >>> apply_mm_placeholders([7, 7, 7], [MMItem("img", 1, 5)]).tolist()  # cut at the end
        [7, 864481872, 850983454]
    """
    check_choice("mm_placeholder", mm_placeholder, MM_PLACEHOLDER_MODES)
    if not all(isinstance(item, MMItem) for item in mm_items):
        raise ValueError(f"mm_items must be MMItem values, got {mm_items!r}")
    tokens = as_token_array(token_ids).copy()
    n = tokens.shape[0]
    for item in mm_items:
        if item.offset >= n:
            continue
        end = min(item.end, n)
        if mm_placeholder == "per_position":
            tokens[item.offset:end] = mm_placeholder_values(item.identifier, end - item.offset)
        else:
            tokens[item.offset:end] = hex_hash_to_int16(item.identifier)
    return tokens
