"""llm-d kv-cache request keys, and the engine-key → request-key mapping of its index.

Models ``llm-d/llm-d-kv-cache`` @ ``7be76e1``, ``pkg/kvcache/kvblock`` (docs/specs/hashing.md
§2). llm-d does not reproduce an engine's hashes: it computes its own *request keys* from
token ids and maps the *engine keys* published in KV events onto them::

    H(parent, tokens, extra) = FNV-1a-64( canonical_cbor([parent, tokens, extra]) )
    init   = FNV-1a-64(utf8(hash_seed))
    root   = H(init, None, model_name)          # model_name: the LoRA name when set
    key_0  = H(parent_key or root, block_0, extra_0);  key_i = H(key_{i-1}, block_i, extra_i)
    extra_i = None for text blocks, [{"Hash": id}, ...] for blocks overlapping MM items

Canonical CBOR is ``cbor2.dumps(obj, canonical=True)``: for these values (unsigned ints,
arrays, text, null, one-entry maps) it gives the same bytes as fxamacker/cbor's
``CanonicalEncOptions`` — minimal-length integers, definite lengths; the golden vectors
(text and multimodal) pin this. Text blocks (``extra = None``: an array of three items, a
uint, an array of uints, null) are encoded and hashed by a numba kernel writing those
bytes itself, a whole prompt per call; blocks with multimodal extras and roots go through
``cbor2``.
"""

from __future__ import annotations

from collections.abc import Sequence

import cbor2
import numpy as np

from kvlab.core.jit import kernel_jit
from kvlab.core.validate import check_str, check_u64
from kvlab.hashing.base import (
    U64_MASK,
    BlockHasher,
    RequestExtras,
    as_u32_tokens,
    block_mm_identifiers,
    check_block_size,
    normalize_engine_hash,
    resolve_extras,
)

#: llm-d ``getHashAsUint64``: an engine's published block hash as ``u64`` (docs/specs/hashing.md §2.2).
engine_hash_to_u64 = normalize_engine_hash

#: FNV-1a 64-bit offset basis and prime (Go `hash/fnv`).
FNV64_OFFSET_BASIS = 0xCBF29CE484222325
FNV64_PRIME = 0x100000001B3


_FNV_OFFSET = np.uint64(FNV64_OFFSET_BASIS)
_FNV_PRIME = np.uint64(FNV64_PRIME)
_BYTE = np.uint64(0xFF)
_CBOR_UINT, _CBOR_ARRAY = np.uint64(0x00), np.uint64(0x80)  # major types 0 and 4, shifted
_CBOR_ARRAY_OF_3, _CBOR_NULL = np.uint64(0x83), np.uint64(0xF6)
#: Roots cached per hasher at most (one per model or LoRA name seen).
_ROOT_CACHE_SIZE = 1024


@kernel_jit(nogil=True)
def _fnv_bytes(h, data):  # noqa: ANN001, ANN202 - numba kernel: FNV-1a-64 of uint8[n], from h
    for i in range(data.shape[0]):
        h = (h ^ np.uint64(data[i])) * _FNV_PRIME
    return h


@kernel_jit(nogil=True)
def _fnv_cbor_head(h, major, value):  # noqa: ANN001, ANN202 - numba helper
    """FNV-1a-64 from ``h`` over the canonical CBOR head of ``value`` (uint64) in ``major``."""
    if value < np.uint64(24):
        return (h ^ (major | value)) * _FNV_PRIME
    if value < np.uint64(0x100):
        num_bytes, info = 1, np.uint64(24)
    elif value < np.uint64(0x10000):
        num_bytes, info = 2, np.uint64(25)
    elif value < np.uint64(0x100000000):
        num_bytes, info = 4, np.uint64(26)
    else:
        num_bytes, info = 8, np.uint64(27)
    h = (h ^ (major | info)) * _FNV_PRIME
    for i in range(num_bytes - 1, -1, -1):  # big-endian
        h = (h ^ ((value >> np.uint64(8 * i)) & _BYTE)) * _FNV_PRIME
    return h


@kernel_jit(nogil=True)
def _text_chain(tokens, block_size, num_blocks, parent):  # noqa: ANN001, ANN202 - numba kernel
    """Chained keys ``H(parent, block, None)`` of ``num_blocks`` full blocks of ``uint32`` tokens:
    FNV-1a-64 over ``0x83, uint(parent), array(block_size), uint(token)..., 0xF6``."""
    out = np.empty(num_blocks, dtype=np.uint64)
    size = np.uint64(block_size)
    for b in range(num_blocks):
        h = (_FNV_OFFSET ^ _CBOR_ARRAY_OF_3) * _FNV_PRIME
        h = _fnv_cbor_head(h, _CBOR_UINT, parent)
        h = _fnv_cbor_head(h, _CBOR_ARRAY, size)
        for i in range(b * block_size, (b + 1) * block_size):
            h = _fnv_cbor_head(h, _CBOR_UINT, np.uint64(tokens[i]))
        parent = (h ^ _CBOR_NULL) * _FNV_PRIME
        out[b] = parent
    return out


def fnv1a_64(data: bytes) -> int:
    """FNV-1a, 64-bit (Go's ``hash/fnv.New64a``), as ``u64``.

    Written here (a numba loop) because no well-kept Python FNV package is a kvlab
    dependency: start from the offset basis; per byte, xor it in, then multiply by the
    FNV prime modulo 2**64.

    Args:
        data: ``bytes`` (or any buffer of bytes).

    Example:
        >>> fnv1a_64(b""), hex(fnv1a_64(b"a"))
        (14695981039346656037, '0xaf63dc4c8601ec8c')
    """
    return int(_fnv_bytes(_FNV_OFFSET, np.frombuffer(data, dtype=np.uint8)))


class LlmdHasher(BlockHasher):
    """llm-d request keys: FNV-1a-64 over canonical CBOR, chained from a model-salted root.

    Models llm-d ``ChunkedTokenDatabase`` (``token_processor.go``: ``getInitHash``, ``hash``,
    ``prefixHashes``, ``TokensToKVBlockKeys``; docs/specs/hashing.md §2.1). Only full blocks
    get keys. From :class:`RequestExtras` it uses ``lora_name`` (replaces ``model_name`` in
    the root, as llm-d's ``effectiveModelName`` does for events carrying a LoRA name, §2.1)
    and ``mm_items`` (per-block ``[{"Hash": identifier}, ...]``); the other fields do not
    enter llm-d's keys.

    Args:
        block_size: llm-d's canonical ``BlockSizeTokens`` (default 16).
        hash_seed: ``HashSeed`` (default ``""``; §2.4).
        model_name: the model name salted into the root.

    Attributes:
        init_hash: ``FNV-1a-64(utf8(hash_seed))``, the parent of the root.

    Raises:
        ValueError: a bad block size, or a seed or model name that is not a string.

    Example:
        >>> hasher = LlmdHasher(block_size=4, model_name="ibm-granite/granite-3.1-8b-instruct")
        >>> hasher.block_hashes([8197, 438, 322, 18926, 432, 45600, 49])  # llm-d e2e golden
        [1334984470577408192]
        >>> hasher.root_key() == hasher.root_key("ibm-granite/granite-3.1-8b-instruct")
        True
    """

    name = "llmd"
    hashes_partial_tail = False

    def __init__(self, *, block_size: int = 16, hash_seed: str = "", model_name: str = "") -> None:
        self.block_size = check_block_size(block_size)
        self.hash_seed = check_str("hash_seed", hash_seed)
        self.model_name = check_str("model_name", model_name)
        self.init_hash = fnv1a_64(hash_seed.encode())
        self._roots: dict[tuple[int, str], int] = {}  # (init hash, model) -> root key

    @staticmethod
    def hash_block(parent: int, tokens: Sequence[int] | None, extra: object = None) -> int:
        """llm-d ``hash``: ``FNV-1a-64(canonical_cbor([parent, tokens, extra]))``.

        Args:
            parent: the parent key (u64).
            tokens: the block's token ids (CBOR array of uints) or ``None`` (CBOR null,
                as for the root).
            extra: ``None``, a model name, or a list of ``{"Hash": id}`` maps.
        """
        return fnv1a_64(cbor2.dumps([parent, tokens, extra], canonical=True))

    def root_key(self, model_name: str | None = None) -> int:
        """The chain root ``H(init_hash, None, model_name)`` (``model_name`` defaults to the hasher's).

        Raises:
            ValueError: ``model_name`` is not a string or None.
        """
        model = self.model_name if model_name is None else check_str("model_name", model_name)
        cache_key = (self.init_hash, model)
        root = self._roots.get(cache_key)
        if root is None:
            if len(self._roots) >= _ROOT_CACHE_SIZE:
                self._roots.clear()
            root = self._roots[cache_key] = self.hash_block(self.init_hash, None, model)
        return root

    def block_hashes(self, token_ids: Sequence[int] | np.ndarray, extras: RequestExtras | None = None,
                     parent_key: int = 0) -> list[int]:
        """Request keys (``u64``) of the prompt's full blocks, in order.

        Args:
            token_ids: ``int[num_tokens]``, each in ``[0, 2**32)``.
            extras: ``lora_name`` and ``mm_items`` are used (see the class docstring).
            parent_key: continue a chain from this request key; 0 (llm-d's
                ``EmptyBlockHash``) starts at the root.

        Returns:
            ``num_tokens // block_size`` keys; the partial tail is dropped.

        Raises:
            ValueError: invalid token ids, extras or parent key.

        Example (text blocks: the chained :meth:`hash_block`, computed by the numba kernel):
            >>> hasher = LlmdHasher(block_size=2)
            >>> tokens = [0, 23, 24, 255, 256, 65535, 65536, 2**32 - 1]  # every CBOR uint width
            >>> for parent in (0, 23, 255, 65535, 2**32 - 1, 2**64 - 1):
            ...     keys, key = [], parent or hasher.root_key()
            ...     for i in range(0, len(tokens), 2):
            ...         key = hasher.hash_block(key, tokens[i:i + 2])
            ...         keys.append(key)
            ...     assert hasher.block_hashes(tokens, parent_key=parent) == keys, parent
        """
        tokens = as_u32_tokens(token_ids)
        extras = resolve_extras(extras, len(tokens))
        parent = check_u64("parent_key", parent_key)
        if parent == 0:
            parent = self.root_key(extras.lora_name or None)
        num_blocks = len(tokens) // self.block_size
        if not extras.mm_items:
            return _text_chain(tokens, self.block_size, num_blocks, np.uint64(parent)).tolist()
        mm_ids = block_mm_identifiers(extras.mm_items, num_blocks, self.block_size)
        keys = []
        for i in range(num_blocks):
            block = tokens[i * self.block_size:(i + 1) * self.block_size].tolist()
            extra = [{"Hash": identifier} for identifier in mm_ids[i]] or None
            parent = self.hash_block(parent, block, extra)
            keys.append(parent)
        return keys

    def to_u64(self, block_hash: int) -> int:
        """Identity: llm-d request keys already are ``u64``.

        Raises:
            ValueError: not an integer in ``[0, 2**64)``.
        """
        return check_u64("block_hash", block_hash)


def map_engine_to_request_keys(engine_keys: Sequence[int], request_keys: Sequence[int]) -> list[list[int]]:
    """The request keys each engine key stands for, by llm-d's count-ratio rule.

    Models llm-d ``Index.Add`` (docs/specs/hashing.md §2.2): with ``E`` engine keys and ``R``
    request keys over the same tokens,

    * ``E == R`` (same block size): ``E[i] → [R[i]]``;
    * ``E == r * R`` (many:1, engine blocks smaller): ``E[i] → [R[i // r]]``;
    * ``R == r * E`` (1:many, engine blocks larger): ``E[i] → R[i*r:(i+1)*r]``.

    Newer llm-d distributes a non-integral ratio proportionally; kvlab refuses it, since
    it means the two key lists do not cover the same tokens at two block sizes.

    Args:
        engine_keys: ``u64`` engine keys of one event, in block order.
        request_keys: ``u64`` request keys of the same tokens, in block order.

    Returns:
        One list of request keys per engine key (``[]`` when both inputs are empty).

    Raises:
        ValueError: a key that is not a u64, or counts that are not an integral ratio
            (the message gives both counts).

    Example:
        >>> map_engine_to_request_keys([7, 8], [1, 2, 3, 4])
        [[1, 2], [3, 4]]
        >>> map_engine_to_request_keys([5, 6, 7, 8], [1, 2])
        [[1], [1], [2], [2]]
    """
    for name, keys in (("engine_keys", engine_keys), ("request_keys", request_keys)):
        if isinstance(keys, (str, bytes)) or not isinstance(keys, (Sequence, np.ndarray)):
            raise ValueError(f"{name} must be a sequence of u64 keys, got {keys!r}")
    engine, request = _u64_list("engine_keys", engine_keys), _u64_list("request_keys", request_keys)
    n_e, n_r = len(engine), len(request)
    if n_e == 0 and n_r == 0:
        return []
    check_key_counts(n_e, n_r)
    if n_e >= n_r:
        ratio = n_e // n_r
        return [[request[i // ratio]] for i in range(n_e)]
    ratio = n_r // n_e
    return [request[i * ratio:(i + 1) * ratio] for i in range(n_e)]


def check_key_counts(num_engine: int, num_request: int) -> None:
    """Check that engine and request key counts are an integral ratio, both > 0 (llm-d ``Index.Add``).

    Raises:
        ValueError: giving both counts, when neither is a multiple of the other or one is 0.

    Example:
        >>> check_key_counts(4, 2)
        >>> check_key_counts(3, 2)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: 3 engine keys and 2 request keys are not an integral ratio (...)
    """
    if num_engine == 0 or num_request == 0 or max(num_engine, num_request) % min(num_engine, num_request):
        raise ValueError(f"{num_engine} engine keys and {num_request} request keys are not an integral ratio "
                         f"(one count must be a multiple of the other)")


def _u64_list(name: str, keys: Sequence[int] | np.ndarray) -> list[int]:
    """``keys`` as a list of ints, each checked by ``check_u64`` (one type set and a min/max
    when all are Python ints in range; the per-item loop names the first bad one)."""
    out = keys.tolist() if isinstance(keys, np.ndarray) and keys.ndim == 1 and keys.dtype.kind in "iu" else list(keys)
    if out and set(map(type, out)) == {int} and min(out) >= 0 and max(out) <= U64_MASK:
        return out
    return [check_u64(f"{name}[{i}]", key) for i, key in enumerate(keys)]


class EngineKeyMap:
    """Engine key → request keys, as llm-d's index keeps it (``engineToRequestKeys``).

    Models llm-d ``Index.Add`` / ``GetRequestKey`` / ``Evict`` by engine key
    (docs/specs/hashing.md §2.2). Adding an engine key again replaces its mapping.

    Example:
        >>> keys = EngineKeyMap()
        >>> keys.add([7, 8], [1, 2, 3, 4])  # engine blocks twice the request blocks
        >>> keys.get_request_key(7), keys.get_request_key(8), keys.get_request_key(9)
        (2, 4, None)
        >>> keys.remove(7), keys.remove(7), len(keys)
        (True, False, 1)
    """

    def __init__(self) -> None:
        self._request_keys: dict[int, tuple[int, ...]] = {}

    def add(self, engine_keys: Sequence[int], request_keys: Sequence[int]) -> None:
        """Record the mapping of one event's engine keys onto its request keys.

        Raises:
            ValueError: as :func:`map_engine_to_request_keys`; nothing is recorded then.
        """
        mapped = map_engine_to_request_keys(engine_keys, request_keys)
        for engine_key, keys in zip(engine_keys, mapped):
            self._request_keys[int(engine_key)] = tuple(keys)

    def get_request_key(self, engine_key: int) -> int | None:
        """The last request key mapped for ``engine_key`` (the last of its group for 1:many),
        or ``None`` when unknown — llm-d ``GetRequestKey``, the parent lookup of ``BlockStored``.

        Raises:
            ValueError: ``engine_key`` is not a u64.
        """
        keys = self._request_keys.get(check_u64("engine_key", engine_key))
        return None if keys is None else keys[-1]

    def remove(self, engine_key: int) -> bool:
        """Forget ``engine_key`` (``BlockRemoved``); return whether it was known.

        Raises:
            ValueError: ``engine_key`` is not a u64.
        """
        return self._request_keys.pop(check_u64("engine_key", engine_key), None) is not None

    def __len__(self) -> int:
        return len(self._request_keys)
