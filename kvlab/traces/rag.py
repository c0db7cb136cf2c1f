"""Opal's RAG workload: a system prompt plus several reused documents per request (index_blend.md O28-O31)."""

from __future__ import annotations

import contextlib

import numpy as np
import polars as pl

from kvlab.core.validate import check_choice, check_count, check_positive, check_real, rng_from_seed
from kvlab.hashing import sim
from kvlab.hashing.base import BlockHasher
from kvlab.traces.flat import list_series
from kvlab.traces.trace import Trace

#: Named document orders and their shuffle probabilities.
ORDERS = {"sorted": 0.0, "shuffled": 1.0}
#: Document popularity laws.
POPULARITIES = ("uniform", "zipf")


def rag(num_requests: int, *, num_documents: int = 10, document_tokens: int = 16384, system_prompt_tokens: int = 1024,
        docs_per_request: int = 4, order: str | float = "sorted", popularity: str = "uniform",
        zipf_alpha: float = 1.0, output_tokens: int = 128, request_rate_per_s: float = 1.0,
        block_size: int | None = None, hasher: BlockHasher | None = None,
        seed: int | np.random.Generator = 0) -> Trace:
    """Opal's RAG workload as a :class:`Trace` with token ids (index_blend.md B.7, O28-O31).

    Token ids come from a monotonic allocator starting at 0: the system prompt gets ids
    ``0 .. system_prompt_tokens - 1`` once (O28); a document gets ``document_tokens`` fresh ids
    the first time a request uses it and the same ids thereafter. Each request picks
    ``docs_per_request`` DISTINCT documents (O29) — uniformly, or with Zipf popularity
    (probability of document ``d`` ∝ ``1 / (d + 1) ** zipf_alpha``, so document 0 is the most
    popular; picks are successive draws without replacement, made with the Gumbel-top-k trick) —
    and orders them by index, as Opal does, or in a random permutation. Its prompt is the system
    prompt followed by the documents (``system_prompt_tokens + docs_per_request ×
    document_tokens`` tokens: 66,560 with the defaults, O30). Arrivals are every
    ``1 / request_rate_per_s`` seconds (Opal's unjittered mode; no concurrency limit — that is a
    serving choice, not part of the trace). Because sorted documents give a request a prefix in
    common with an earlier one only up to the first differing document, later shared documents
    recur at other offsets: the non-prefix reuse CacheBlend targets (O31).

    Block keys: ``hasher`` (any :mod:`kvlab.hashing` profile; its ``block_keys`` are computed per
    request) or, by default, kvlab's fast chained ``sim`` hash with ``block_size`` tokens per
    block (16, vLLM's default, when ``block_size`` is None). Pass ``kvlab.hashing.vllm(block_size=…)``
    for vLLM's exact ids (slower: SHA-256 per block).

    Args:
        num_requests: number of requests (≥ 1; Opal's ``total_requests``).
        num_documents: corpus size (≥ 1).
        document_tokens: tokens per document (≥ 1).
        system_prompt_tokens: tokens of the shared system prompt (≥ 0).
        docs_per_request: distinct documents per request (1 .. ``num_documents``).
        order: ``"sorted"`` (Opal), ``"shuffled"``, or the probability in ``[0, 1]`` that a
            request's documents are shuffled instead of sorted.
        popularity: ``"uniform"`` (Opal) or ``"zipf"``.
        zipf_alpha: Zipf exponent (≥ 0; 0 is uniform); used with ``popularity="zipf"``.
        output_tokens: output length of every request (≥ 0; Opal's fixed 128).
        request_rate_per_s: arrival rate (> 0).
        block_size: tokens per block of the default ``sim`` hasher; with ``hasher``, None or equal
            to ``hasher.block_size``.
        hasher: the block hasher (default ``kvlab.hashing.sim(block_size)``).
        seed: an integer seed ≥ 0 or a ``numpy.random.Generator``.

    Returns:
        A :class:`Trace` with ``token_ids`` (``list[u32]``) and ``document_ids`` (``list[u32]``,
        the request's documents in prompt order) columns; ``source`` records the parameters.

    Raises:
        ValueError: a parameter out of range (names it), ``docs_per_request > num_documents``, an
            unknown ``order`` or ``popularity``, a ``block_size`` that disagrees with ``hasher``,
            or a corpus whose token ids would not fit in 32 bits.

    Example:
        >>> trace = rag(3, num_documents=4, document_tokens=128, system_prompt_tokens=32, block_size=16)
        >>> trace.frame["input_tokens"].to_list()
        [544, 544, 544]
        >>> len(trace), trace.frame["document_ids"].list.len().to_list()
        (3, [4, 4, 4])
    """
    for name, value in (("num_requests", num_requests), ("num_documents", num_documents),
                        ("document_tokens", document_tokens), ("docs_per_request", docs_per_request)):
        check_positive(name, value)
    check_count("system_prompt_tokens", system_prompt_tokens)
    check_count("output_tokens", output_tokens)
    check_real("zipf_alpha", zipf_alpha, low=0.0)
    check_real("request_rate_per_s", request_rate_per_s, low=0.0, low_open=True)
    if docs_per_request > num_documents:
        raise ValueError(f"docs_per_request={docs_per_request} exceeds num_documents={num_documents}: "
                         f"a request picks distinct documents")
    shuffle_p = _shuffle_probability(order)
    check_choice("popularity", popularity, POPULARITIES)
    if system_prompt_tokens + num_documents * document_tokens > 2**32:
        raise ValueError(f"system_prompt_tokens + num_documents * document_tokens = "
                         f"{system_prompt_tokens + num_documents * document_tokens} token ids do not fit in u32")
    hasher = _resolve_hasher(block_size, hasher)
    rng = rng_from_seed("seed", seed)

    docs = _pick_documents(rng, num_requests, num_documents, docs_per_request,
                           zipf_alpha if popularity == "zipf" else 0.0)
    shuffled = rng.random(num_requests) < shuffle_p
    if shuffled.any():
        docs[shuffled] = rng.permuted(docs[shuffled], axis=1)

    # Allocate document ids in order of first use (O28): one pass over the picks in prompt order.
    used, first_index = np.unique(docs.ravel(), return_index=True)
    doc_start = np.zeros(num_documents, dtype=np.int64)
    first_used = used[np.argsort(first_index, kind="stable")]
    doc_start[first_used] = system_prompt_tokens + np.arange(first_used.shape[0], dtype=np.int64) * document_tokens

    system_ids = np.arange(system_prompt_tokens, dtype=np.int64)
    doc_offsets = np.arange(document_tokens, dtype=np.int64)
    prompts = [np.concatenate([system_ids, (doc_start[row][:, None] + doc_offsets).ravel()]) for row in docs]
    keys = [hasher.block_keys(tokens) for tokens in prompts]
    frame = pl.DataFrame({
        "request_id": np.arange(num_requests, dtype=np.uint64),
        "arrival_s": np.arange(num_requests, dtype=np.float64) / request_rate_per_s,
        "input_tokens": np.full(num_requests, system_prompt_tokens + docs_per_request * document_tokens, np.uint32),
        "output_tokens": np.full(num_requests, output_tokens, dtype=np.uint32),
        "block_keys": list_series(keys),
        "token_ids": list_series(prompts, pl.UInt32),
        "document_ids": list_series(list(docs), pl.UInt32),
    })
    seed_repr = "Generator" if isinstance(seed, np.random.Generator) else seed
    source = (f"rag(num_requests={num_requests}, num_documents={num_documents}, document_tokens={document_tokens}, "
              f"system_prompt_tokens={system_prompt_tokens}, docs_per_request={docs_per_request}, order={order!r}, "
              f"popularity={popularity!r}, zipf_alpha={zipf_alpha}, seed={seed_repr}) | {hasher!r}")
    return Trace(frame, block_size=hasher.block_size, source=source, partial_block_keyed=hasher.hashes_partial_tail)


def _shuffle_probability(order: object) -> float:
    """``order``'s shuffle probability: a name of :data:`ORDERS` or a real in ``[0, 1]``."""
    if isinstance(order, str) and order in ORDERS:
        return ORDERS[order]
    if not isinstance(order, str):
        with contextlib.suppress(ValueError):
            return check_real("order", order, low=0.0, high=1.0)
    raise ValueError(f"order must be one of {tuple(ORDERS)} or a shuffle probability in [0, 1], got {order!r}")


def _resolve_hasher(block_size: object, hasher: object) -> BlockHasher:
    if hasher is None:
        if block_size is None:
            return sim(16)
        return sim(check_positive("block_size", block_size))
    if not isinstance(hasher, BlockHasher):
        raise ValueError(f"hasher must be a kvlab.hashing BlockHasher or None, got {type(hasher).__name__}")
    if block_size is not None and block_size != hasher.block_size:
        raise ValueError(f"block_size={block_size!r} disagrees with hasher.block_size={hasher.block_size}; "
                         f"leave block_size None when passing a hasher")
    return hasher


def _pick_documents(rng: np.random.Generator, num_requests: int, num_documents: int, k: int,
                    alpha: float) -> np.ndarray:
    """``int64[num_requests, k]``: distinct documents per row, sorted by index (O29).

    Gumbel-top-k: the ``k`` largest of ``log w_d + Gumbel`` are ``k`` successive draws without
    replacement with probabilities ∝ ``w_d = 1 / (d + 1) ** alpha`` (uniform for ``alpha = 0``).
    """
    log_w = -alpha * np.log(np.arange(1, num_documents + 1, dtype=np.float64))
    scores = log_w + rng.gumbel(size=(num_requests, num_documents))
    top = np.argpartition(-scores, k - 1, axis=1)[:, :k] if k < num_documents else \
        np.broadcast_to(np.arange(num_documents), (num_requests, num_documents))
    return np.sort(top, axis=1).astype(np.int64)
