"""NVIDIA Dynamo KV router: local block hashes, rolling sequence hashes, MM ids and media.

Models ``ai-dynamo-runtime`` 1.6.1 (docs/specs/hashing.md §3)::

    seed  = 1337 (+ xxh3_64(lora_name, seed=0)) (+ xxh3_64(cache_namespace, seed=1))   wrapping u64
    local_i = xxh3_64(tokens of window i as u32 LE ‖ sorted mm hashes of block i as u64 LE, seed)
    seq_0 = local_0;  seq_i = xxh3_64(LE64(seq_{i-1}) ‖ LE64(local_i), seed=1337)

Window ``i`` starts at ``i * block_size`` and holds ``block_size`` tokens (``block_size + 1``
for Eagle); only full windows are hashed. The router matches requests on the local hashes
(position-independent), so its ``kv_block_size`` must equal the engine's (§3.3).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import xxhash

from kvlab.core.validate import check_choice, check_flag, check_str, check_u64
from kvlab.hashing.base import (
    U64_MASK,
    BlockHasher,
    RequestExtras,
    as_u32_tokens,
    block_mm_identifiers,
    check_block_size,
    resolve_extras,
)

#: ``XXH3_SEED`` of ``lib/kv-router/src/protocols.rs``: block hashes and the sequence chain.
DYNAMO_SEED = 1337

#: ``StorageTier::from_kv_medium`` (docs/specs/hashing.md §3.4), case-sensitive as upstream.
MEDIUM_TIERS = {
    "GPU": "Device", "DEVICE": "Device",
    "CPU": "HostPinned", "CPU_PINNED": "HostPinned", "CPU_TIER1": "HostPinned",
    "CPU_TIER2": "Disk", "DISK": "Disk", "NVME": "Disk",
    "EXTERNAL": "External", "NETWORK": "External", "REMOTE": "External", "SHARED": "External",
}


def salted_seed(lora_name: str | None = None, cache_namespace: str | None = None) -> int:
    """The XXH3 seed of a request's local block hashes.

    ``1337``, plus ``xxh3_64(utf8(lora_name), seed=0)``, plus
    ``xxh3_64(utf8(cache_namespace), seed=1)``, wrapping at 2**64; empty strings count as
    absent. Models ``dynamo_kv_hashing::compute_salt_hash`` (docs/specs/hashing.md §3.1).

    Raises:
        ValueError: a name that is not a string or None.

    Example:
        >>> salted_seed(), salted_seed(lora_name="my-lora")
        (1337, 12827409268353072861)
    """
    seed = DYNAMO_SEED
    for name, value, salt_seed in (("lora_name", lora_name, 0), ("cache_namespace", cache_namespace, 1)):
        if check_str(name, value, optional=True):
            seed = (seed + xxhash.xxh3_64_intdigest(value.encode(), seed=salt_seed)) & U64_MASK
    return seed


def _is_vllm_digest(identifier: str) -> bool:
    return len(identifier) == 64 and identifier.isascii() and all(c in "0123456789abcdefABCDEF" for c in identifier)


def mm_hash_from_identifier(identifier: str, offset_tagged: bool = True, lora_name: str | None = None) -> int | None:
    """Dynamo's ``u64`` routing hash of a multimodal identifier, or ``None`` if it is not one.

    A 64-hex-char identifier (vLLM's blake3 ``mm_hash``) becomes the ``u64`` of its first 16
    hex chars. Otherwise it depends on the form the identifier came in
    (docs/specs/hashing.md §3.4):

    * offset-tagged (``[id, offset]`` in vLLM ``extra_keys``, and kvlab's :class:`MMItem`):
      any non-empty id → ``xxh3_64(utf8(id), seed=0)`` (``hash_mm_identifier``);
    * bare string: only a 64-hex id counts, and not when it equals the request's
      ``lora_name`` (``parse_mm_hash_from_extra_key``); anything else → ``None``.

    An empty identifier → ``None``. ``lora_name`` is consulted for bare strings only.

    Raises:
        ValueError: ``identifier`` or ``lora_name`` not a string, or ``offset_tagged`` not a bool.

    Example:
        >>> mm_hash_from_identifier("f9a38a66df902915" + "0" * 48)
        17988373511089957141
        >>> mm_hash_from_identifier("img-0"), mm_hash_from_identifier("img-0", offset_tagged=False)
        (16320814743281577664, None)
    """
    check_str("identifier", identifier)
    offset_tagged = check_flag("offset_tagged", offset_tagged)
    check_str("lora_name", lora_name, optional=True)
    if not identifier or (not offset_tagged and identifier == lora_name):
        return None
    if _is_vllm_digest(identifier):
        return int(identifier[:16], 16)
    return xxhash.xxh3_64_intdigest(identifier.encode(), seed=0) if offset_tagged else None


def storage_tier_from_medium(medium: str | None) -> str:
    """Dynamo's storage tier for a KV-event ``medium``: ``"Device"``, ``"HostPinned"``,
    ``"Disk"`` or ``"External"``; an absent medium (``None``) is ``"Device"``.

    Models ``StorageTier::from_kv_medium`` / ``from_kv_medium_or_default``
    (docs/specs/hashing.md §3.4). Matching is exact (``"GPU"``, not ``"gpu"``), as upstream.

    Raises:
        ValueError: an unknown medium (the message lists the known ones).

    Example:
        >>> storage_tier_from_medium("CPU_TIER2"), storage_tier_from_medium(None)
        ('Disk', 'Device')
    """
    if medium is None:
        return "Device"
    return MEDIUM_TIERS[check_choice("medium", medium, sorted(MEDIUM_TIERS))]


class DynamoHasher(BlockHasher):
    """Dynamo KV router hashing: position-independent local block hashes, chained into
    sequence hashes (kvlab's block keys).

    Models ``compute_block_hash_for_seq`` and ``compute_seq_hash_for_block``
    (``lib/kv-router/src/protocols.rs``; docs/specs/hashing.md §3.1–3.2). From
    :class:`RequestExtras` it uses ``lora_name`` and ``cache_salt`` (the cache namespace)
    as seed salts and ``mm_items`` (offset-tagged ids, :func:`mm_hash_from_identifier`,
    assigned to the blocks they overlap); the other fields do not enter Dynamo's hashes.

    Args:
        block_size: the router's ``kv_block_size`` (must equal the engine's).
        is_eagle: Eagle windows of ``block_size + 1`` tokens (stride still ``block_size``).

    Raises:
        ValueError: a bad block size, or ``is_eagle`` not a bool.

    Example:
        >>> hasher = DynamoHasher(block_size=4)
        >>> hasher.local_block_hashes(range(1, 13))  # lib/tokens test values
        [14643705804678351452, 16777012769546811212, 483935686894639516]
        >>> hasher.block_hashes(range(1, 9))
        [14643705804678351452, 4945711292740353085]
    """

    name = "dynamo"
    hashes_partial_tail = False

    def __init__(self, *, block_size: int, is_eagle: bool = False) -> None:
        self.block_size = check_block_size(block_size)
        self.is_eagle = check_flag("is_eagle", is_eagle)

    def num_hashed_blocks(self, num_tokens: int) -> int:
        """Full windows in ``num_tokens`` tokens: ``n // B``, or ``(n - 1) // B`` with Eagle."""
        return max(num_tokens - self.is_eagle, 0) // self.block_size

    def local_block_hashes(self, token_ids: Sequence[int] | np.ndarray, extras: RequestExtras | None = None, *,
                           block_mm_hashes: Sequence[Sequence[int] | None] | None = None) -> list[int]:
        """``LocalBlockHash`` (``u64``) of every full window, in order.

        Args:
            token_ids: ``int[num_tokens]``, each in ``[0, 2**32)``.
            extras: ``lora_name``, ``cache_salt`` and ``mm_items`` are used.
            block_mm_hashes: precomputed ``u64`` MM hashes per block (Dynamo's
                ``block_mm_infos``), ``None`` or a list per block, instead of
                ``extras.mm_items``: one entry per hashed block, or per block of the prompt
                (``ceil(num_tokens / block_size)``, as ``build_block_mm_infos`` makes);
                entries past the hashed blocks are ignored.

        Returns:
            :meth:`num_hashed_blocks` hashes.

        Raises:
            ValueError: invalid tokens or extras; ``block_mm_hashes`` given together with
                ``extras.mm_items``, of the wrong length, or holding non-u64 values.
        """
        tokens = as_u32_tokens(token_ids).astype("<u4")
        extras = resolve_extras(extras, len(tokens))
        num_blocks = self.num_hashed_blocks(len(tokens))
        mm = self._block_mm(extras, block_mm_hashes, num_blocks, len(tokens))
        seed = salted_seed(extras.lora_name, extras.cache_salt)
        window = self.block_size + self.is_eagle
        hashes = []
        for i in range(num_blocks):
            start = i * self.block_size
            data = tokens[start:start + window].tobytes() + np.array(sorted(mm[i]), dtype="<u8").tobytes()
            hashes.append(xxhash.xxh3_64_intdigest(data, seed=seed))
        return hashes

    def _block_mm(self, extras: RequestExtras, block_mm_hashes: Sequence[Sequence[int] | None] | None,
                  num_blocks: int, num_tokens: int) -> list[list[int]]:
        """Per hashed block, its MM ``u64`` hashes (from ``extras`` or ``block_mm_hashes``)."""
        if block_mm_hashes is None:
            ids = block_mm_identifiers(extras.mm_items, num_blocks, self.block_size)
            return [[mm_hash_from_identifier(identifier) for identifier in block] for block in ids]
        if extras.mm_items:
            raise ValueError("give multimodal items either as extras.mm_items or as block_mm_hashes, not both")
        if not isinstance(block_mm_hashes, (Sequence, np.ndarray)) or isinstance(block_mm_hashes, str):
            raise ValueError(f"block_mm_hashes must be a list (one entry per block) or None, got {block_mm_hashes!r}")
        num_prompt_blocks = -(-num_tokens // self.block_size)
        if not num_blocks <= len(block_mm_hashes) <= num_prompt_blocks:
            raise ValueError(f"block_mm_hashes must have one entry per block ({num_blocks} hashed blocks, "
                             f"{num_prompt_blocks} prompt blocks), got {len(block_mm_hashes)}")
        out = []
        for i in range(num_blocks):
            entry = block_mm_hashes[i]
            if entry is not None and (isinstance(entry, (str, bytes)) or not isinstance(entry, (Sequence, np.ndarray))):
                raise ValueError(f"block_mm_hashes[{i}] must be a list of u64 or None, got {entry!r}")
            hashes = () if entry is None else entry
            out.append([check_u64(f"block_mm_hashes[{i}][{j}]", h) for j, h in enumerate(hashes)])
        return out

    @staticmethod
    def sequence_hashes(local_hashes: Sequence[int]) -> list[int]:
        """Rolling ``SequenceHash`` of local hashes: ``seq_0 = local_0``,
        ``seq_i = xxh3_64(LE64(seq_{i-1}) ‖ LE64(local_i), seed=1337)`` (the seed is never salted).

        Models ``compute_seq_hash_for_block`` (docs/specs/hashing.md §3.2).

        Raises:
            ValueError: a value that is not a u64.
        """
        chain: list[int] = []
        for i, local in enumerate(local_hashes):
            local = check_u64(f"local_hashes[{i}]", local)
            if chain:
                local = xxhash.xxh3_64_intdigest(np.array([chain[-1], local], dtype="<u8").tobytes(), seed=DYNAMO_SEED)
            chain.append(local)
        return chain

    def block_hashes(self, token_ids: Sequence[int] | np.ndarray, extras: RequestExtras | None = None, *,
                     block_mm_hashes: Sequence[Sequence[int] | None] | None = None) -> list[int]:
        """Sequence hashes of the prompt's full windows — chained, so used as kvlab block keys.

        Same arguments and errors as :meth:`local_block_hashes`.
        """
        return self.sequence_hashes(self.local_block_hashes(token_ids, extras, block_mm_hashes=block_mm_hashes))

    def to_u64(self, block_hash: int) -> int:
        """Identity: sequence hashes already are ``u64``.

        Raises:
            ValueError: not an integer in ``[0, 2**64)``.
        """
        return check_u64("block_hash", block_hash)
