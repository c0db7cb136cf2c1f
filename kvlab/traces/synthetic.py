"""Seeded synthetic workloads: a shared system prompt plus multi-turn chat sessions."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import polars as pl

from kvlab.core.validate import check_count, check_positive, check_real, rng_from_seed
from kvlab.traces.arrays import trace_from_arrays
from kvlab.traces.flat import list_series
from kvlab.traces.trace import Trace


@dataclass(frozen=True)
class ChatWorkload:
    """Parameters of the multi-turn chat generator (:func:`chat_sessions`).

    Every session starts with the same system prompt; each turn's prompt is the whole
    conversation so far (system prompt, earlier user messages and replies) plus a new
    user message, as in chat serving. Sessions start as a Poisson process; a session's
    next turn follows its previous one after an exponential think time.

    Attributes:
        num_sessions: number of sessions (≥ 1).
        mean_turns: mean turns per session (geometric, ≥ 1 turn).
        system_prompt_tokens: shared system prompt length, tokens (≥ 0).
        user_tokens_mean: mean user message length, tokens (log-normal, σ = 1).
        output_tokens_mean: mean reply length, tokens (log-normal, σ = 1).
        session_rate_per_s: session arrival rate, sessions per second.
        think_time_mean_s: mean gap between a turn and the next turn of its session, s.
        max_input_tokens: a session ends before a prompt would exceed this, tokens.
        block_size: tokens per block.

    Raises:
        ValueError: a field out of range (names the field and value).

    Example:
        >>> workload = ChatWorkload(num_sessions=3, mean_turns=2.0, block_size=16)
        >>> workload.system_prompt_tokens
        2048
    """

    num_sessions: int = 200
    mean_turns: float = 4.0
    system_prompt_tokens: int = 2048
    user_tokens_mean: float = 300.0
    output_tokens_mean: float = 250.0
    session_rate_per_s: float = 1.0
    think_time_mean_s: float = 30.0
    max_input_tokens: int = 131_072
    block_size: int = 512

    def __post_init__(self) -> None:
        for name in ("num_sessions", "max_input_tokens", "block_size"):
            check_positive(name, getattr(self, name))
        check_count("system_prompt_tokens", self.system_prompt_tokens)
        for name in ("user_tokens_mean", "output_tokens_mean", "session_rate_per_s", "think_time_mean_s"):
            check_real(name, getattr(self, name), low=0.0, low_open=True)
        check_real("mean_turns", self.mean_turns, low=1.0)
        if self.max_input_tokens <= self.system_prompt_tokens:
            raise ValueError(f"max_input_tokens ({self.max_input_tokens}) must exceed "
                             f"system_prompt_tokens ({self.system_prompt_tokens})")


def chat_sessions(workload: ChatWorkload | None = None, *, seed: int | np.random.Generator = 0) -> Trace:
    """Generate a chat trace with chained block keys (no token ids).

    Keys are dense integers assigned on first use: the system prompt's full blocks
    are shared by every session; a turn reuses the keys of the previous prompt's full
    blocks (its exact prefix) and takes fresh keys for the rest — so equal key ⇔ equal
    whole prefix, as with chained hashing.

    Args:
        workload: the parameters (defaults: :class:`ChatWorkload`).
        seed: an integer seed or a ``numpy.random.Generator``.

    Returns:
        A :class:`Trace` in arrival order with an extra ``session_id`` (u64) column;
        ``source`` records the parameters and seed.

    Raises:
        ValueError: ``workload`` is not a :class:`ChatWorkload`, ``seed`` is not an
            integer >= 0 or a Generator (``None`` would not be reproducible), or no
            session's first prompt fits in ``max_input_tokens``.

    Example:
        >>> trace = chat_sessions(ChatWorkload(num_sessions=5, block_size=64), seed=1)
        >>> trace.check_chained().height, trace.frame["session_id"].n_unique()
        (0, 5)
    """
    wl = ChatWorkload() if workload is None else workload
    if not isinstance(wl, ChatWorkload):
        raise ValueError(f"workload must be a ChatWorkload or None, got {workload!r}")
    rng = rng_from_seed("seed", seed)
    turns = rng.geometric(1.0 / wl.mean_turns, size=wl.num_sessions)
    num_turns = int(turns.sum())
    starts = np.cumsum(rng.exponential(1.0 / wl.session_rate_per_s, size=wl.num_sessions)) - 0.0
    starts -= starts[0]
    user = _lognormal_tokens(rng, wl.user_tokens_mean, num_turns)
    output = _lognormal_tokens(rng, wl.output_tokens_mean, num_turns)
    think = rng.exponential(wl.think_time_mean_s, size=num_turns)

    bs = wl.block_size
    system_keys = np.arange(wl.system_prompt_tokens // bs, dtype=np.uint64)
    next_key = system_keys.shape[0]
    rows: dict[str, list] = {"arrival_s": [], "input_tokens": [], "output_tokens": [], "session_id": [], "keys": []}
    t = 0
    for session in range(wl.num_sessions):
        full_keys, context, arrival = system_keys, wl.system_prompt_tokens, float(starts[session])
        for turn in range(int(turns[session])):
            prompt = context + int(user[t + turn])
            if prompt > wl.max_input_tokens:
                break
            num_blocks = -(-prompt // bs)
            num_known = min(full_keys.shape[0], num_blocks)
            fresh = np.arange(next_key, next_key + num_blocks - num_known, dtype=np.uint64)
            next_key += fresh.shape[0]
            keys = np.concatenate([full_keys[:num_known], fresh])
            rows["arrival_s"].append(arrival)
            rows["input_tokens"].append(prompt)
            rows["output_tokens"].append(int(output[t + turn]))
            rows["session_id"].append(session)
            rows["keys"].append(keys)
            full_keys = keys[: prompt // bs]
            context = prompt + int(output[t + turn])
            arrival += float(think[t + turn])
        t += int(turns[session])
    if not rows["arrival_s"]:
        raise ValueError(f"no request generated: every session's first prompt exceeds max_input_tokens="
                         f"{wl.max_input_tokens} (system prompt {wl.system_prompt_tokens} tokens, user messages "
                         f"~{wl.user_tokens_mean:g} tokens)")
    order = np.argsort(np.asarray(rows["arrival_s"]), kind="stable")
    frame = pl.DataFrame({
        "request_id": np.arange(order.shape[0], dtype=np.uint64),
        "arrival_s": np.asarray(rows["arrival_s"])[order],
        "input_tokens": np.asarray(rows["input_tokens"], dtype=np.uint32)[order],
        "output_tokens": np.asarray(rows["output_tokens"], dtype=np.uint32)[order],
        "block_keys": list_series([rows["keys"][i] for i in order]),
        "session_id": np.asarray(rows["session_id"], dtype=np.uint64)[order],
    })
    seed_repr = "Generator" if isinstance(seed, np.random.Generator) else seed
    params = ", ".join(f"{k}={v}" for k, v in asdict(wl).items())
    return Trace(frame, block_size=bs, source=f"chat_sessions({params}, seed={seed_repr})")


def _lognormal_tokens(rng: np.random.Generator, mean: float, size: int) -> np.ndarray:
    """Log-normal token counts with the given mean (σ = 1), at least 1 token."""
    sigma = 1.0
    mu = np.log(mean) - sigma**2 / 2
    return np.maximum(1, np.rint(rng.lognormal(mu, sigma, size=size))).astype(np.int64)


def zipf_objects(num_requests: int, num_objects: int, alpha: float = 1.0, *, seed: int | np.random.Generator = 0,
                 rate_per_s: float = 1000.0) -> Trace:
    """A classic object-cache workload: each request asks for one object, drawn from a
    bounded Zipf distribution (probability of rank ``k`` ∝ ``1 / k**alpha``).

    Objects are blocks of one token with no chaining (each request is a single block),
    so prefix and independent hit semantics coincide — the workload libCacheSim and the
    caching literature benchmark on. Ranks are mapped to object ids by a seeded random
    permutation, so popularity is not ordered by id.

    Args:
        num_requests: number of requests (≥ 1).
        num_objects: number of distinct objects (≥ 1).
        alpha: Zipf exponent (≥ 0; 0 = uniform).
        seed: integer seed or ``numpy.random.Generator``.
        rate_per_s: arrival rate (requests evenly spaced), for the timeline.

    Returns:
        A :class:`Trace` with ``block_size=1`` and one key per request.

    Raises:
        ValueError: a parameter out of range.

    Example:
        >>> trace = zipf_objects(1000, 50, seed=1)
        >>> len(trace), trace.block_size, trace.distinct_blocks <= 50
        (1000, 1, True)
    """
    check_positive("num_requests", num_requests)
    check_positive("num_objects", num_objects)
    check_real("alpha", alpha, low=0.0)
    check_real("rate_per_s", rate_per_s, low=0.0, low_open=True)
    rng = rng_from_seed("seed", seed)
    cdf = zipf_cdf(num_objects, alpha)
    # in chunks (the same draws as one call): no float64 or int64 array of every request
    objects = np.empty(num_requests, dtype=np.uint64)
    for start in range(0, num_requests, _CHUNK):
        objects[start:start + _CHUNK] = zipf_ranks(rng, cdf, min(_CHUNK, num_requests - start))
    permutation = rng.permutation(num_objects).astype(np.uint64)
    for start in range(0, num_requests, _CHUNK):
        objects[start:start + _CHUNK] = permutation[objects[start:start + _CHUNK]]
    seed_repr = "Generator" if isinstance(seed, np.random.Generator) else seed
    return trace_from_arrays(
        objects, arrival_s=np.arange(num_requests, dtype=np.float64) / rate_per_s,
        output_tokens=np.zeros(num_requests, dtype=np.uint32), block_size=1,
        source=f"zipf_objects(num_requests={num_requests}, num_objects={num_objects}, alpha={alpha}, "
               f"seed={seed_repr})")


def zipf_cdf(num_ranks: int, alpha: float) -> np.ndarray:
    """The unnormalised cumulative weights (``float64[num_ranks]``) of a bounded Zipf
    distribution: rank ``k`` (0-based) has weight ``1 / (k + 1) ** alpha``.

    >>> zipf_cdf(3, 1.0).tolist()
    [1.0, 1.5, 1.8333333333333333]
    """
    return np.cumsum(1.0 / np.arange(1, num_ranks + 1, dtype=np.float64) ** alpha)


def zipf_ranks(rng: np.random.Generator, cdf: np.ndarray, size: int) -> np.ndarray:
    """``size`` 0-based ranks (``int64``) drawn from :func:`zipf_cdf`'s distribution by inverse
    transform: one ``rng.random()`` per draw.

    >>> zipf_ranks(np.random.default_rng(0), zipf_cdf(4, 1.0), 5).tolist()
    [1, 0, 0, 0, 2]
    """
    draws = rng.random(size) * cdf[-1]
    return np.minimum(np.searchsorted(cdf, draws, side="right"), cdf.shape[0] - 1)


#: Requests drawn at a time by :func:`zipf_objects`.
_CHUNK = 1 << 20
