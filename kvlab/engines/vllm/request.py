"""The part of a vLLM v1 request the KV cache manager reads: length, block hashes, progress.

Models ``vllm/v1/request.py :: Request`` (its cache-related fields; docs/specs/engines.md
§1, rules V8, V14). A request's full blocks are keyed by chained u64 block hashes, computed
as tokens arrive (:meth:`Request.from_tokens`, any :mod:`kvlab.hashing` profile) or given
directly (:meth:`Request.from_block_keys`, trace replay).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from kvlab.core.validate import check_count, check_int, check_positive, check_str
from kvlab.engines.vllm.block_pool import check_block_key
from kvlab.hashing.base import BlockHasher, RequestExtras, as_token_array
from kvlab.hashing.vllm_extra_keys import BlockExtraKeys, event_extra_keys_of


def _full_block_keys(hasher: BlockHasher, token_ids: list[int], extras: RequestExtras | None) -> list[int]:
    """The hasher's u64 keys of the full blocks (vLLM hashes no partial tail)."""
    keys = hasher.block_keys(token_ids, extras)
    return [int(k) for k in keys[: len(token_ids) // hasher.block_size]]


@dataclass(eq=False)
class Request:
    """What the KV cache manager needs to know about one request.

    Models the cache-related part of vLLM v1 ``Request``: its length, the chained
    block hashes of its full blocks (precomputed as tokens arrive, V8), how many tokens
    are computed, how often it was preempted, and what its ``BlockStored`` events carry
    (LoRA adapter, session, per-block extra keys). Build it with :meth:`from_tokens` (a
    :mod:`kvlab.hashing` profile hashes the tokens) or :meth:`from_block_keys` (trace
    replay: keys given directly).

    Raises:
        ValueError: a bad field (names it): an empty id, ``num_tokens < 1``, a bad key,
            key or token counts that disagree, ``lora_id`` without a LoRA name in
            ``extras`` or a LoRA name without ``lora_id`` (vLLM's ``LoRARequest`` always
            has both), a non-string ``session_id``.

    Example:
        >>> from kvlab.hashing import sim
        >>> req = Request.from_tokens("r0", range(10), sim(block_size=4))
        >>> req.num_tokens, len(req.block_hashes), req.block_size
        (10, 2, 4)
        >>> Request.from_block_keys("r1", 9, [7, 8])
        Request(request_id='r1', num_tokens=9, block_hashes=[7, 8], block_size=None, token_ids=None,
                num_computed_tokens=0, num_preemptions=0)
    """

    request_id: str
    """Unique id; the manager keys block tables by it (one live object per id)."""
    num_tokens: int
    """Tokens so far (prompt plus appended output), >= 1."""
    block_hashes: list[int]
    """u64 keys of the full blocks, chained (equal key ⇒ equal whole prefix)."""
    block_size: int | None = None
    """Block size the keys were computed for (the hasher's); ``None`` when given directly."""
    token_ids: list[int] | None = None
    """The tokens, when known (they go into ``BlockStored`` events)."""
    num_computed_tokens: int = 0
    """Tokens whose KV is in the request's blocks (hits included)."""
    num_preemptions: int = 0
    """Times the request was preempted (rule V14)."""
    hasher: BlockHasher | None = field(default=None, repr=False)
    """The profile that hashes appended tokens (:meth:`from_tokens` requests)."""
    extras: RequestExtras | None = field(default=None, repr=False)
    """LoRA / multimodal / salt inputs passed to ``hasher``."""
    lora_id: int | None = field(default=None, repr=False)
    """vLLM's LoRA adapter id (``LoRARequest.lora_int_id``, >= 1; ``BlockStored.lora_id``),
    set exactly when ``extras.lora_name`` is."""
    session_id: str | None = field(default=None, repr=False)
    """vLLM's ``Request.session_id`` (``BlockStored.session_id``), or ``None``."""

    def __post_init__(self) -> None:
        if not isinstance(self.request_id, str) or not self.request_id:
            raise ValueError(f"request_id must be a non-empty string, got {self.request_id!r}")
        check_positive("num_tokens", self.num_tokens)
        self.block_hashes = [check_block_key(f"block_hashes[{i}]", h) for i, h in enumerate(self.block_hashes)]
        if self.block_size is not None and len(self.block_hashes) != self.num_tokens // self.block_size:
            raise ValueError(f"block_hashes has {len(self.block_hashes)} keys but {self.num_tokens} tokens make "
                             f"{self.num_tokens // self.block_size} full blocks of {self.block_size}")
        if self.token_ids is not None and len(self.token_ids) != self.num_tokens:
            raise ValueError(f"token_ids has {len(self.token_ids)} tokens but num_tokens is {self.num_tokens}")
        if check_count("num_computed_tokens", self.num_computed_tokens) > self.num_tokens:
            raise ValueError(f"num_computed_tokens must be <= num_tokens ({self.num_tokens}), "
                             f"got {self.num_computed_tokens}")
        check_count("num_preemptions", self.num_preemptions)
        lora_name = self.extras.lora_name if isinstance(self.extras, RequestExtras) else None
        if check_int("lora_id", self.lora_id, low=1, optional=True) is not None and lora_name is None:
            raise ValueError(f"lora_id={self.lora_id} needs extras with a lora_name (the adapter it identifies)")
        if lora_name is not None and self.lora_id is None:
            raise ValueError(f"extras name LoRA adapter {lora_name!r} but lora_id is None; give its int id "
                             f"(vLLM's LoRARequest.lora_int_id, >= 1)")
        check_str("session_id", self.session_id, optional=True)

    @property
    def lora_name(self) -> str | None:
        """The LoRA adapter name (``extras.lora_name``), or ``None``."""
        return None if self.extras is None else self.extras.lora_name

    def event_extra_keys(self, first_block: int, num_blocks: int) -> list[tuple | None] | None:
        """``BlockStored.extra_keys`` of blocks ``first_block .. first_block + num_blocks - 1``:
        one untagged entry per block, ``None`` for a block without extra keys (vLLM 0.33
        ``generate_block_hash_extra_keys`` + ``to_event_extra_keys``); ``None`` for a
        request without extras (every entry would be ``None``).

        Raises:
            ValueError: negative counts, or extras vLLM cannot hash (prompt embeddings
                missing a block's digest).
        """
        first_block, num_blocks = check_count("first_block", first_block), check_count("num_blocks", num_blocks)
        if self.extras is None or self.extras.is_empty:
            return None
        keys = BlockExtraKeys(self.extras, self.block_size)
        keys.next_block = first_block
        return [event_extra_keys_of(k) for k in keys.next_blocks(num_blocks)]

    @classmethod
    def from_tokens(cls, request_id: str, token_ids: Sequence[int] | np.ndarray, hasher: BlockHasher,
                    extras: RequestExtras | None = None, *, lora_id: int | None = None,
                    session_id: str | None = None) -> Request:
        """A request whose full blocks are keyed by ``hasher.block_keys(token_ids, extras)``.

        The manager using it must have ``block_size == hasher.block_size``. A LoRA request
        (``extras.lora_name``) needs its adapter id ``lora_id``, as vLLM's does.

        Raises:
            ValueError: ``hasher`` is not a :class:`~kvlab.hashing.BlockHasher`; no
                tokens; invalid tokens or extras (from the hasher); ``lora_id`` or
                ``session_id`` invalid or inconsistent with ``extras`` (class docstring).
        """
        if not isinstance(hasher, BlockHasher):
            raise ValueError(f"hasher must be a kvlab.hashing BlockHasher, got {type(hasher).__name__}")
        tokens = [int(t) for t in as_token_array(token_ids)]
        return cls(request_id, len(tokens), _full_block_keys(hasher, tokens, extras), hasher.block_size, tokens,
                   hasher=hasher, extras=extras, lora_id=lora_id, session_id=session_id)

    @classmethod
    def from_block_keys(cls, request_id: str, num_tokens: int, block_keys: Iterable[int]) -> Request:
        """A request given its length and the u64 keys of its full blocks (trace replay).

        Pass one key per full block (``num_tokens // block_size`` keys; drop a trace's
        partial-tail key); the manager checks the count against its block size at use.
        No tokens are known, so the ``BlockStored`` events its blocks cause carry
        ``token_ids=()`` (the keys, parent key and block size only).

        Raises:
            ValueError: a bad id, length or key.
        """
        return cls(request_id, num_tokens, list(block_keys))

    def append_tokens(self, token_ids: Sequence[int] | np.ndarray) -> None:
        """Append output tokens (a :meth:`from_tokens` request); newly full blocks get keys.

        Raises:
            ValueError: the request was built from block keys, or no / invalid tokens.
        """
        if self.hasher is None or self.token_ids is None:
            raise ValueError(f"request {self.request_id!r} has no hasher (built from block keys); "
                             f"use append_block_keys")
        new = [int(t) for t in as_token_array(token_ids)]
        if not new:
            raise ValueError("token_ids must not be empty")
        tokens = self.token_ids + new
        if len(tokens) // self.hasher.block_size > len(self.block_hashes):
            self.block_hashes = _full_block_keys(self.hasher, tokens, self.extras)
        self.token_ids, self.num_tokens = tokens, len(tokens)

    def append_block_keys(self, num_new_tokens: int, block_keys: Iterable[int] = ()) -> None:
        """Append ``num_new_tokens`` tokens and the keys of the blocks they complete
        (a :meth:`from_block_keys` request).

        Raises:
            ValueError: the request has tokens (use :meth:`append_tokens`),
                ``num_new_tokens`` not an integer >= 1, or a bad key.
        """
        if self.token_ids is not None:
            raise ValueError(f"request {self.request_id!r} has token ids; use append_tokens")
        check_positive("num_new_tokens", num_new_tokens)
        keys = [check_block_key(f"block_keys[{i}]", k) for i, k in enumerate(block_keys)]
        self.num_tokens += num_new_tokens
        self.block_hashes.extend(keys)
