"""One interface for every engine's block hashing, and the request inputs it hashes.

A :class:`BlockHasher` turns a prompt's token ids (and the request's extra inputs,
:class:`RequestExtras`) into chained block hashes in the engine's *native* form
(:meth:`BlockHasher.block_hashes`: bytes for vLLM, hex strings for SGLang, integers for
llm-d and Dynamo) and into kvlab's *block keys* (:meth:`BlockHasher.block_keys`: one
``uint64`` per hashed block, the engine's own 64-bit form — the id it publishes in KV
events, or its request key), which is what a :class:`~kvlab.traces.Trace` stores.

Chained: the hash of block ``i`` covers tokens ``[0, (i + 1) * block_size)`` and the
extra inputs that apply to them, so equal hashes mean equal whole prefixes::

    tokens   | t0 .. t15 | t16 .. t31 | t32 .. t39 (partial)
    hashes   |    h0     |  h1(h0, ·) |  h2(h1, ·) only if hashes_partial_tail
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from kvlab.core.validate import check_count, check_int, check_positive, check_str, check_u64

#: A block hash in an engine's native form.
BlockHash = bytes | int | str
U64_MASK = (1 << 64) - 1
_U32_MAX = (1 << 32) - 1


@dataclass(frozen=True)
class MMItem:
    """A multimodal item (image, audio clip …) whose placeholder tokens sit in the prompt.

    Attributes:
        identifier: the item's content hash as the engine receives it (vLLM's
            ``mm_hash``, a blake3 hex digest by default; any string).
        offset: position of the item's first placeholder token in the prompt.
        length: number of placeholder tokens (≥ 1); the item covers
            ``[offset, offset + length)``.

    Raises:
        ValueError: empty identifier, negative offset or length < 1.

    Example:
        >>> MMItem("img-0", offset=5, length=6).end
        11
    """

    identifier: str
    offset: int
    length: int

    def __post_init__(self) -> None:
        if not check_str("identifier", self.identifier).strip():
            raise ValueError(f"identifier must not be blank, got {self.identifier!r}")
        for name, low in (("offset", 0), ("length", 1)):  # as int: numpy ints would hash differently
            object.__setattr__(self, name, check_int(name, getattr(self, name), low=low))

    @property
    def end(self) -> int:
        """One past the item's last placeholder token."""
        return self.offset + self.length

    def overlaps(self, start: int, end: int) -> bool:
        """Whether the item's placeholder range overlaps tokens ``[start, end)``."""
        return self.offset < end and start < self.end


@dataclass(frozen=True)
class RequestExtras:
    """Everything besides token ids that an engine mixes into block hashes.

    Each profile uses the fields its engine uses (see its docstring); one
    ``RequestExtras`` therefore describes a request for every engine side by side.

    Attributes:
        lora_name: LoRA adapter name (vLLM tagged key; llm-d root salt; Dynamo seed
            salt; SGLang ``extra_key``).
        lora_path: LoRA adapter path (vLLM's tagged LoRA key includes it).
        lora_identity: a content digest of the adapter weights; when set, vLLM's LoRA
            keys become ``("lora", name)`` + ``("lora_identity", id)`` — the fix proposed
            for stale reuse after an in-place reload (vLLM issue #42125, PR #48352).
            vLLM 0.33 itself keys on name and path only.
        mm_items: multimodal items, any order (sorted by offset here); their
            placeholder ranges must not overlap. ``None`` means none.
        cache_salt: per-tenant salt (vLLM ``cache_salt``; Dynamo cache namespace;
            SGLang ``cache_salt``); ``""`` means none, as the engines treat it.
        prompt_embeds: vLLM prompt embeddings: a ``(num_tokens, hidden)`` array (hashed
            as the raw bytes of rows ``[start, end)`` of each block) or a mapping
            ``(start, end) -> 32-byte sha256 digest`` per block.

    Raises:
        ValueError: a field of the wrong type (names the field and value), an empty
            LoRA name/path/identity, a LoRA path or identity without a name, or
            overlapping MM items.

    Example:
        >>> extras = RequestExtras(lora_name="ad", mm_items=(MMItem("img", 2, 3),), cache_salt="s")
        >>> extras.is_empty
        False
    """

    lora_name: str | None = None
    lora_path: str | None = None
    lora_identity: str | None = None
    mm_items: tuple[MMItem, ...] = ()
    cache_salt: str | None = None
    prompt_embeds: np.ndarray | Mapping[tuple[int, int], bytes] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        for name in ("lora_name", "lora_path", "lora_identity"):
            check_str(name, getattr(self, name), nonempty=True, optional=True)
        check_str("cache_salt", self.cache_salt, optional=True)
        if self.lora_name is None and (self.lora_path is not None or self.lora_identity is not None):
            raise ValueError("lora_path / lora_identity need a lora_name (the adapter they describe)")
        if self.cache_salt == "":
            object.__setattr__(self, "cache_salt", None)  # engines treat an empty salt as none
        object.__setattr__(self, "mm_items", _sorted_items(self.mm_items))
        embeds = self.prompt_embeds
        if embeds is not None and not isinstance(embeds, (np.ndarray, Mapping)):
            raise ValueError(f"prompt_embeds must be an array or a mapping (start, end) -> digest, got "
                             f"{type(embeds).__name__}")

    @property
    def is_empty(self) -> bool:
        """True when nothing but tokens would be hashed."""
        return (self.lora_name is None and self.lora_path is None and self.lora_identity is None
                and not self.mm_items and not self.cache_salt and self.prompt_embeds is None)


def _sorted_items(mm_items: object) -> tuple[MMItem, ...]:
    """MM items sorted by offset; rejects non-MMItem values and overlapping placeholders."""
    if mm_items is None:
        return ()
    if isinstance(mm_items, (MMItem, str, bytes)) or not isinstance(mm_items, (Sequence, set, frozenset)):
        raise ValueError(f"mm_items must be a sequence of MMItem, got {mm_items!r}")
    if not all(isinstance(item, MMItem) for item in mm_items):
        raise ValueError(f"mm_items must be MMItem values, got {mm_items!r}")
    items = tuple(sorted(mm_items, key=lambda item: item.offset))
    for before, after in zip(items, items[1:]):
        if after.offset < before.end:
            raise ValueError(f"mm_items overlap: {before} and {after} (placeholder ranges of one prompt are "
                             "disjoint)")
    return items


def resolve_extras(extras: object, num_tokens: int, *, items_past_end: bool = False) -> RequestExtras:
    """``extras`` checked for a prompt of ``num_tokens`` tokens (``None`` → no extras).

    Args:
        extras: the request's extras, or ``None``.
        num_tokens: the number of tokens hashed.
        items_past_end: accept MM items that run past the last token or start after
            it, for an engine that hashes a prefix and cuts them there (LMCache).

    Raises:
        ValueError: not a :class:`RequestExtras`, or (unless ``items_past_end``) an MM
            item whose placeholders end after the prompt (names the item and the length).
    """
    if extras is None:
        return NO_EXTRAS
    if not isinstance(extras, RequestExtras):
        raise ValueError(f"extras must be a RequestExtras or None, got {type(extras).__name__}")
    if not items_past_end and extras.mm_items and extras.mm_items[-1].end > num_tokens:
        raise ValueError(f"mm item {extras.mm_items[-1]} ends after the prompt ({num_tokens} tokens)")
    return extras


NO_EXTRAS = RequestExtras()


def as_token_array(token_ids: Sequence[int] | np.ndarray) -> np.ndarray:
    """Token ids as ``int64[n]`` (``uint64`` arrays are kept), checked; no copy when
    already ``int64``.

    Raises:
        ValueError: not one-dimensional, not integers (bools and floats are rejected),
            negative, or 2**64 or more.
    """
    arr = np.asarray(token_ids)
    if arr.dtype.kind in "fO" and not isinstance(token_ids, np.ndarray):
        arr = _python_ints(token_ids)  # numpy promotes lists with ids >= 2**63 to float/object
    if arr.ndim != 1:
        raise ValueError(f"token_ids must be one-dimensional, got shape {arr.shape}")
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if not np.issubdtype(arr.dtype, np.integer) or arr.dtype == np.bool_:
        raise ValueError(f"token_ids must be integers, got dtype {arr.dtype}")
    if arr.dtype.kind == "i" and arr.min() < 0:
        raise ValueError(f"token_ids must be >= 0, got {int(arr.min())}")
    return arr if arr.dtype == np.uint64 else arr.astype(np.int64, copy=False)


def _python_ints(token_ids: Sequence[object]) -> np.ndarray:
    """A list of Python ints as ``uint64`` (values up to 2**64 - 1), or a clear error."""
    return np.array([check_u64(f"token_ids[{i}]", value) for i, value in enumerate(token_ids)], dtype=np.uint64)


class BlockHasher(ABC):
    """Chained block hashing of one engine (a *profile*).

    Attributes:
        name: the profile, e.g. ``"vllm.sha256"``.
        block_size: tokens per hashed block (the engine's block / page / chunk size).
        hashes_partial_tail: whether a trailing partial block gets a hash (SGLang:
            yes; vLLM, llm-d, Dynamo: no; LMCache: configurable). A trace built with
            this hasher then has ``ceil`` (yes) or ``floor`` (no) of
            ``input_tokens / block_size`` keys per request.
    """

    name: str
    block_size: int
    hashes_partial_tail: bool = False

    @abstractmethod
    def block_hashes(self, token_ids: Sequence[int] | np.ndarray,
                     extras: RequestExtras | None = None) -> list[BlockHash]:
        """Native chained hashes of the prompt's blocks, in order.

        Raises:
            ValueError: invalid token ids or extras.
        """

    @abstractmethod
    def to_u64(self, block_hash: BlockHash) -> int:
        """The engine's 64-bit form of one native hash (e.g. its KV-event id)."""

    def block_keys(self, token_ids: Sequence[int] | np.ndarray, extras: RequestExtras | None = None) -> np.ndarray:
        """``uint64[num_blocks]``: :meth:`to_u64` of every block hash — kvlab's block keys."""
        return np.array([self.to_u64(h) for h in self.block_hashes(token_ids, extras)], dtype=np.uint64)

    def num_hashed_blocks(self, num_tokens: int) -> int:
        """Number of blocks a prompt of ``num_tokens`` tokens gets hashes for.

        Raises:
            ValueError: ``num_tokens`` is not an integer >= 0.
        """
        num_tokens = check_count("num_tokens", num_tokens)
        full, rest = divmod(num_tokens, self.block_size)
        return full + (1 if rest and self.hashes_partial_tail else 0)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, block_size={self.block_size})"


#: Largest block size accepted (tokens); far beyond any engine's, small enough for int32 maths.
MAX_BLOCK_SIZE = 2**31 - 1


def check_block_size(block_size: object, name: str = "block_size") -> int:
    """Validate a block size (integer in ``[1, 2**31)``) and return it as ``int``.

    Raises:
        ValueError: naming the parameter and the value.
    """
    block_size = check_positive(name, block_size)
    if block_size > MAX_BLOCK_SIZE:
        raise ValueError(f"{name} must be below 2**31, got {block_size}")
    return block_size


def u64_from_bytes_last8(digest: bytes) -> int:
    """The last 8 bytes of ``digest``, big-endian, unsigned (left-padded when shorter).

    This is vLLM's event form of a hash (``maybe_convert_block_hash``) and llm-d's and
    Dynamo's normalisation of byte hashes.

    Example:
        >>> u64_from_bytes_last8(bytes.fromhex("0102"))
        258
    """
    return int.from_bytes(digest[-8:], "big")


def u64_from_signed(value: int) -> int:
    """Two's-complement reinterpretation of a signed 64-bit integer as unsigned.

    Example:
        >>> u64_from_signed(-1)
        18446744073709551615
    """
    return value & U64_MASK


def coarse_view(hashes: Sequence[BlockHash], scale: int) -> list[BlockHash]:
    """Hashes of blocks ``scale`` times larger: each coarse block takes the hash of the
    last fine block inside it; an incomplete trailing group is dropped.

    Models vLLM's ``BlockHashListWithBlockSize`` (a KV-cache group whose block size is a
    multiple of the hash block size; no re-hashing).

    Raises:
        ValueError: ``scale < 1``.

    Example:
        >>> coarse_view(["h0", "h1", "h2", "h3", "h4"], 2)
        ['h1', 'h3']
    """
    scale = check_block_size(scale, "scale")
    return [hashes[(i + 1) * scale - 1] for i in range(len(hashes) // scale)]


def normalize_engine_hash(value: bytes | int) -> int:
    """An engine's published block hash as ``u64``: bytes → last 8 bytes big-endian;
    a negative int (SGLang's int64) → two's complement; a u64 is kept.

    Models llm-d ``getHashAsUint64`` and Dynamo ``BlockHashValue::into_u64``.

    Raises:
        ValueError: not bytes or int, or an int outside ``[-2**63, 2**64)``.

    Example:
        >>> normalize_engine_hash(-1), normalize_engine_hash(b"\\x01\\x02"), normalize_engine_hash(12345)
        (18446744073709551615, 258, 12345)
    """
    if isinstance(value, (bytes, bytearray)):
        return u64_from_bytes_last8(bytes(value))
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"an engine block hash must be bytes or an integer, got {value!r}")
    if not -(1 << 63) <= value <= U64_MASK:
        raise ValueError(f"an engine block hash must fit 64 bits, got {value}")
    return u64_from_signed(int(value))


def as_u32_tokens(token_ids: Sequence[int] | np.ndarray) -> np.ndarray:
    """Token ids as ``uint32[n]`` (llm-d's ``[]uint32``, Dynamo's ``&[u32]``), checked.

    Raises:
        ValueError: not one-dimensional integers, negative, or above ``2**32 - 1``.
    """
    arr = as_token_array(token_ids)
    if arr.size and int(arr.max()) > _U32_MAX:
        raise ValueError(f"token_ids must fit 32 bits (<= {_U32_MAX}), got {int(arr.max())}")
    return arr.astype(np.uint32)


def block_mm_identifiers(mm_items: Sequence[MMItem], num_blocks: int, block_size: int) -> list[tuple[str, ...]]:
    """Per block, the identifiers of the MM items overlapping it, in offset order.

    Block ``i`` covers tokens ``[i * block_size, (i + 1) * block_size)``; an item covers
    ``[offset, offset + length)``; they overlap when ``end > block_start`` and
    ``offset < block_end``. Models llm-d ``ComputeBlockExtraFeatures`` (docs/specs/hashing.md
    §2.1); Dynamo's ``build_block_mm_infos`` uses the same rule (§3.1).

    Args:
        mm_items: the request's items, any order (sorted here by offset, stable).
        num_blocks: number of blocks to report (≥ 0).
        block_size: tokens per block (≥ 1).

    Returns:
        ``num_blocks`` tuples of identifiers (empty for text-only blocks).

    Raises:
        ValueError: bad ``block_size`` or ``num_blocks``, or an item that is not an :class:`MMItem`.

    Example:
        >>> block_mm_identifiers([MMItem("b", 5, 2), MMItem("a", 1, 6)], 3, 4)
        [('a',), ('a', 'b'), ()]
    """
    block_size = check_block_size(block_size)
    num_blocks = check_count("num_blocks", num_blocks)
    if not all(isinstance(item, MMItem) for item in mm_items):
        raise ValueError(f"mm_items must be MMItem values, got {mm_items!r}")
    per_block: list[list[str]] = [[] for _ in range(num_blocks)]
    for item in sorted(mm_items, key=lambda it: it.offset):
        for block in range(item.offset // block_size, min((item.end - 1) // block_size + 1, num_blocks)):
            per_block[block].append(item.identifier)
    return [tuple(ids) for ids in per_block]
