"""SGLang 0.5.23 page hashes: the SHA-256 page chain, its HiCache storage namespace, and
the int64 ids SGLang publishes in KV events (docs/specs/hashing.md §5).

SGLang's radix cache matches raw token sequences; page hashes key HiCache storage (L3)
and KV events. Per page (the last one may be partial)::

    h_j = SHA-256( h_{j-1} (32 raw bytes; none for the first page) ‖ tokens as u32 LE )
          a page holding a token > 2**32 - 1 is hashed as  0xff ‖ tokens as u64 LE
    storage chain (HiCache L3):  h_{-1} = storage_namespace_seed(extra_key, cache_salt)
    event chain:                 h_{-1} = event_chain_seed(cache_salt)  (extra_key not mixed in)
    event id = first 8 bytes of h_j, signed big-endian (hash_str_to_int64)
    namespaced id = namespaced_block_hash(event id, kv_event_namespace_seed(...))

Hashes are 64-char lowercase hex strings, as SGLang keeps them. kvlab's ``lora_name`` is
SGLang's ``extra_key``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from kvlab.core.validate import check_choice, check_int, check_str
from kvlab.hashing.base import BlockHasher, RequestExtras, as_token_array, check_block_size, u64_from_signed

EVENT_FORMATS = ("default", "dynamo")
STORAGE_NAMESPACE_TAG = b"sglang-cache-namespace-v1"
KV_EVENT_NAMESPACE_TAG = b"sglang-kv-event-namespace-v1"
CACHE_SALT_TAG = b"sglang-cache-salt-v1\0"
_U32_MAX = (1 << 32) - 1
_HEX = frozenset("0123456789abcdefABCDEF")


def _check_hex_digest(name: str, value: object) -> bytes:
    if not isinstance(value, str) or len(value) != 64 or not set(value) <= _HEX:
        raise ValueError(f"{name} must be a 64-character hex SHA-256 digest, got {value!r}")
    return bytes.fromhex(value)


def sha256_page_chain(token_ids: Sequence[int] | np.ndarray, page_size: int, prior: str | None = None) -> list[str]:
    """SGLang's page SHA-256 chain, one hex digest per page (the last may be partial).

    Models ``mem_cache/utils.py: get_hash_str`` over the native
    ``cpp_utils/hash_binding.cpp: hash_page`` (docs/specs/hashing.md §5): each page
    hashes the previous page's 32 raw digest bytes (or ``prior``'s, or nothing) then the
    tokens as u32 little-endian; a page with a token above ``2**32 - 1`` is hashed as
    ``0xff`` followed by its tokens as u64 little-endian. (EAGLE bigram keys are not
    modelled.)

    Args:
        token_ids: ``int[n]`` token ids (``0 <= t < 2**64``).
        page_size: tokens per page (``--page-size``).
        prior: hex digest the chain continues from (a parent radix node's last page
            hash, or a namespace seed); ``None`` starts a root chain.

    Returns:
        ``ceil(n / page_size)`` lowercase 64-char hex strings.

    Raises:
        ValueError: bad token ids, page size, or a ``prior`` that is not a hex digest.

    Example:
        >>> sha256_page_chain([1, 2, 3, 4, 5], page_size=4)[0][:16]
        'cf97adeedb59e05b'
    """
    tokens = as_token_array(token_ids)
    page_size = check_block_size(page_size, "page_size")
    digest = b"" if prior is None else _check_hex_digest("prior", prior)
    hashes = []
    for start in range(0, tokens.shape[0], page_size):
        page = tokens[start:start + page_size]
        if int(page.max()) > _U32_MAX:
            payload = b"\xff" + page.astype("<u8").tobytes()
        else:
            payload = page.astype("<u4").tobytes()
        digest = hashlib.sha256(digest + payload).digest()
        hashes.append(digest.hex())
    return hashes


def _namespace_parts(extra_key: str | None, cache_salt: str | None) -> bytes:
    parts = b""
    for name, part in (("extra_key", extra_key), ("cache_salt", cache_salt)):
        if check_str(name, part, optional=True) is None:
            parts += b"\x00"
        else:
            encoded = part.encode("utf-8")
            parts += b"\x01" + len(encoded).to_bytes(8, "little") + encoded
    return parts


def storage_namespace_seed(extra_key: str | None, cache_salt: str | None) -> str | None:
    """The hex seed of a HiCache storage root chain, ``None`` when un-namespaced.

    Models ``mem_cache/utils.py: storage_namespace_seed``:
    ``sha256("sglang-cache-namespace-v1" ‖ part(extra_key) ‖ part(cache_salt))``, where
    ``part(None) = 0x00`` and ``part(s) = 0x01 ‖ len(utf8 s) as u64 LE ‖ utf8 s``.

    Raises:
        ValueError: a part that is neither a string nor None.

    Example:
        >>> storage_namespace_seed("lora-a", None)[:16], storage_namespace_seed(None, None)
        ('407c773a7c02b33b', None)
    """
    if extra_key is None and cache_salt is None:
        return None
    return hashlib.sha256(STORAGE_NAMESPACE_TAG + _namespace_parts(extra_key, cache_salt)).hexdigest()


def event_chain_seed(cache_salt: str | None) -> str | None:
    """The hex seed of a salted event chain: ``sha256("sglang-cache-salt-v1\\0" ‖ utf8 salt)``,
    ``None`` without a salt (``compute_node_event_hash_values``).

    Raises:
        ValueError: ``cache_salt`` neither a string nor None.

    Example:
        >>> event_chain_seed("tenant")[:16]
        '009616397db85793'
    """
    if check_str("cache_salt", cache_salt, optional=True) is None:
        return None
    return hashlib.sha256(CACHE_SALT_TAG + cache_salt.encode("utf-8")).hexdigest()


def kv_event_namespace_seed(extra_key: str | None, cache_salt: str | None) -> bytes | None:
    """The 32-byte seed of namespaced event ids, ``None`` when un-namespaced.

    Models ``disaggregation/kv_events.py: kv_event_namespace_seed``:
    ``sha256("sglang-kv-event-namespace-v1" ‖ part(extra_key) ‖ part(cache_salt)).digest()``
    with ``part`` as in :func:`storage_namespace_seed`.

    Raises:
        ValueError: a part that is neither a string nor None.

    Example:
        >>> kv_event_namespace_seed("lora-a", None).hex()[:16]
        'eb01e3fe0bf099fd'
    """
    if extra_key is None and cache_salt is None:
        return None
    return hashlib.sha256(KV_EVENT_NAMESPACE_TAG + _namespace_parts(extra_key, cache_salt)).digest()


def hash_str_to_int64(hash_hex: str) -> int:
    """SGLang's event id of a page hash: its first 8 bytes, big-endian, signed
    (``mem_cache/utils.py: hash_str_to_int64``).

    Raises:
        ValueError: not a 64-char hex digest.

    Example:
        >>> hash_str_to_int64("ff" * 32)
        -1
    """
    return int.from_bytes(_check_hex_digest("hash_hex", hash_hex)[:8], "big", signed=True)


def namespaced_block_hash(block_hash: int, namespace_seed: bytes) -> int:
    """An event id moved into a namespace: the first 8 bytes, signed big-endian, of
    ``sha256(namespace_seed ‖ block_hash as 8 signed BE bytes)``
    (``disaggregation/kv_events.py: namespaced_block_hash``).

    Raises:
        ValueError: ``block_hash`` not an int64, or ``namespace_seed`` not 32 bytes.

    Example:
        >>> namespaced_block_hash(123, kv_event_namespace_seed("lora-a", None))  # SGLang's pinned test value
        9220659119954863560
    """
    block_hash = check_int("block_hash", block_hash, low=-(1 << 63), high=(1 << 63) - 1)
    if not isinstance(namespace_seed, bytes) or len(namespace_seed) != 32:
        raise ValueError(f"namespace_seed must be 32 bytes, got {namespace_seed!r}")
    digest = hashlib.sha256(namespace_seed + block_hash.to_bytes(8, "big", signed=True)).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class SGLangHasher(BlockHasher):
    """SGLang 0.5.23 page hashes (docs/specs/hashing.md §5) as a :class:`BlockHasher` profile.

    Native hashes (:meth:`block_hashes`) are the *storage* chain's hex digests
    (:meth:`page_hashes_hex`, ``compute_node_hash_values``): namespaced by both
    ``extra_key`` (kvlab ``lora_name``) and ``cache_salt``, so requests of different
    namespaces never share keys, as in SGLang's radix tree. The partial last page gets a
    hash. :meth:`to_u64` is the two's complement of a page's event id (its first 8
    bytes): for un-namespaced requests exactly the u64 form of what SGLang publishes.

    KV events (:meth:`event_block_hashes`) use the *event* chain (seeded by the salt
    only) and, for namespaced requests, :func:`namespaced_block_hash`:

    * ``event_format="dynamo"``: seed :func:`kv_event_namespace_seed` of
      ``(extra_key, cache_salt)`` whenever either is set (golden vectors).
    * ``event_format="default"``: the seed covers ``extra_key`` only, and only when it
      names a known LoRA adapter; kvlab treats a set ``lora_name`` as a loaded adapter,
      so the seed is ``kv_event_namespace_seed(lora_name, None)``. This follows the
      spec's description; no golden vector covers it.

    ``lora_path`` and ``lora_identity`` are not part of SGLang's keys and are not used.
    ``mm_items`` and ``prompt_embeds`` raise: SGLang carries multimodal identity in the
    token ids themselves (pad values), so pass the padded ids instead. An empty
    ``cache_salt`` counts as none, as SGLang normalises it.

    Args:
        page_size: tokens per page (SGLang ``--page-size``).
        event_format: ``"default"`` or ``"dynamo"``.

    Raises:
        ValueError: bad ``page_size`` or unknown ``event_format``.

    Example:
        >>> sg = SGLangHasher(page_size=4)
        >>> [h[:8] for h in sg.block_hashes(range(1, 11))]  # 2 pages + a partial one
        ['cf97adee', '4ebfa8a1', '6dc571ac']
        >>> sg.event_block_hashes([1, 2, 3, 4]), sg.block_keys([1, 2, 3, 4]).tolist()
        ([-3488128144981237669], [14958615928728313947])
    """

    name = "sglang"
    hashes_partial_tail = True

    def __init__(self, *, page_size: int, event_format: str = "default") -> None:
        self.block_size = check_block_size(page_size, "page_size")
        self.event_format = check_choice("event_format", event_format, EVENT_FORMATS)

    @staticmethod
    def _namespace(extras: RequestExtras | None) -> tuple[str | None, str | None]:
        if extras is None:
            return None, None
        if not isinstance(extras, RequestExtras):
            raise ValueError(f"extras must be a RequestExtras or None, got {type(extras).__name__}")
        if extras.mm_items or extras.prompt_embeds is not None:
            raise ValueError("SGLang keys carry multimodal identity in the token ids (pad values); pass the "
                             "padded token ids instead of extras.mm_items / extras.prompt_embeds")
        return extras.lora_name, extras.cache_salt or None

    def page_hashes_hex(self, token_ids: Sequence[int] | np.ndarray, extras: RequestExtras | None = None,
                        prior: str | None = None) -> list[str]:
        """The storage chain (HiCache L3 keys): ``compute_node_hash_values`` /
        ``get_storage_hash_str``. A root chain (``prior=None``) of a namespaced request
        starts from :func:`storage_namespace_seed`; ``prior`` (the parent radix node's
        last page hash) continues a chain.

        Returns:
            ``ceil(n / page_size)`` hex digests.

        Raises:
            ValueError: bad token ids, extras or ``prior``.
        """
        extra_key, cache_salt = self._namespace(extras)
        if prior is None:
            prior = storage_namespace_seed(extra_key, cache_salt)
        return sha256_page_chain(token_ids, self.block_size, prior)

    def block_hashes(self, token_ids: Sequence[int] | np.ndarray,
                     extras: RequestExtras | None = None) -> list[str]:
        """Native hashes: :meth:`page_hashes_hex` of a root chain (hex strings)."""
        return self.page_hashes_hex(token_ids, extras)

    def event_page_hashes_hex(self, token_ids: Sequence[int] | np.ndarray, extras: RequestExtras | None = None,
                              prior: str | None = None) -> list[str]:
        """The event chain (``compute_node_event_hash_values``): a root chain starts from
        :func:`event_chain_seed` of the salt (unseeded without one; ``extra_key`` is not
        mixed in); ``prior`` is the parent node's last *event* page hash.

        Raises:
            ValueError: bad token ids, extras or ``prior``.
        """
        _, cache_salt = self._namespace(extras)
        if prior is None:
            prior = event_chain_seed(cache_salt)
        return sha256_page_chain(token_ids, self.block_size, prior)

    def event_namespace_seed(self, extras: RequestExtras | None = None) -> bytes | None:
        """The seed this hasher's ``event_format`` namespaces event ids with, or ``None``
        (published ids are then the plain event ids).

        Raises:
            ValueError: bad extras.
        """
        extra_key, cache_salt = self._namespace(extras)
        if self.event_format == "dynamo":
            return kv_event_namespace_seed(extra_key, cache_salt)
        return kv_event_namespace_seed(extra_key, None) if extra_key else None

    def _publish(self, event_hex: str, seed: bytes | None) -> int:
        block_hash = hash_str_to_int64(event_hex)
        return block_hash if seed is None else namespaced_block_hash(block_hash, seed)

    def event_block_hashes(self, token_ids: Sequence[int] | np.ndarray, extras: RequestExtras | None = None,
                           prior: str | None = None) -> list[int]:
        """The int64 ``block_hashes`` SGLang publishes for these pages (one
        ``BlockStored`` per page before coalescing), in this hasher's ``event_format``.

        Args:
            token_ids: ``int[n]`` token ids of a radix node (the whole prompt for a root).
            extras: ``lora_name`` (extra_key) and ``cache_salt``.
            prior: the parent node's last event page hash (hex), ``None`` at the root.

        Returns:
            ``ceil(n / page_size)`` signed 64-bit ints.

        Raises:
            ValueError: bad token ids, extras or ``prior``.
        """
        seed = self.event_namespace_seed(extras)
        return [self._publish(h, seed) for h in self.event_page_hashes_hex(token_ids, extras, prior)]

    def event_parent_block_hash(self, extras: RequestExtras | None = None, prior: str | None = None) -> int | None:
        """``parent_block_hash`` of the first page's ``BlockStored``: ``None`` at the
        root, else the published form of ``prior`` (the parent's last event page hash).

        Raises:
            ValueError: bad extras or ``prior``.
        """
        return None if prior is None else self._publish(prior, self.event_namespace_seed(extras))

    def to_u64(self, block_hash: str) -> int:
        """Two's complement of the page's event id (:func:`hash_str_to_int64`).

        Raises:
            ValueError: not a 64-char hex digest.
        """
        return u64_from_signed(hash_str_to_int64(block_hash))
