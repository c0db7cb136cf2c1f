"""Load or recompute: the time to fetch cached KV from a tier against the time to prefill it again.

* :func:`fetch_time_s` / :func:`offload_time_s` — a tier's device plus an optional link, as two
  sequential stages (no pipelining between them: an upper bound when the engine overlaps them).
* :func:`recompute_time_s` — prefill FLOPs (:meth:`ModelSpec.prefill_flops`) at a fixed MFU.
* :func:`load_or_recompute` — both, and the decision.
* :func:`mooncake_prefill_flops`, :func:`mooncake_break_even_bandwidth` — Mooncake FAST'25 Eq. 1
  and Eq. 2 (docs/specs/engines.md §8.1, end).
* :func:`tokens_to_load` — LMCache's vLLM-connector arithmetic (engines.md §3 L4).
* :func:`ttft_saved_s` — prefill time saved by hits spread over several tiers.

The default MFU of 0.5 is a round middle of the 40-60 % model-FLOPs utilisation commonly reported
for large-batch prefill on H100-class GPUs; prefill is compute-bound, so time = FLOPs / (peak × MFU).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvlab.tiers.devices import Device, _check_int, _check_real
from kvlab.tiers.models import ModelSpec

__all__ = [
    "LoadOrRecompute",
    "TierHit",
    "fetch_time_s",
    "load_or_recompute",
    "mooncake_break_even_bandwidth",
    "mooncake_prefill_flops",
    "offload_time_s",
    "recompute_time_s",
    "tokens_to_load",
    "ttft_saved_s",
]

DEFAULT_MFU = 0.5


def _check_device(field: str, value: object, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, Device):
        raise ValueError(f"{field} must be a Device{' or None' if optional else ''}, got {value!r}")


def _check_mfu(mfu: object) -> float:
    v = _check_real("mfu", mfu, positive=True)
    if v > 1:
        raise ValueError(f"mfu must be in (0, 1], got {mfu!r}")
    return v


def _transfer_time_s(num_blocks: int, block_bytes: int, device: Device, link: Device | None, *, write: bool) -> float:
    """``device`` then ``link`` time for ``num_blocks`` blocks (reads, or writes), input checked."""
    _check_int("num_blocks", num_blocks)
    _check_int("block_bytes", block_bytes)
    _check_device("device", device)
    _check_device("link", link, optional=True)
    total = num_blocks * block_bytes
    seconds = (device.write_time_s if write else device.read_time_s)(total, num_ops=num_blocks)
    if link is not None:
        seconds += (link.write_time_s if write else link.read_time_s)(total, num_ops=num_blocks)
    return seconds


def fetch_time_s(num_blocks: int, block_bytes: int, device: Device, link: Device | None = None) -> float:
    """Seconds to onboard ``num_blocks`` blocks of ``block_bytes`` each from a tier's ``device``.

    ``device.read_time_s(num_blocks · block_bytes, num_ops=num_blocks)`` plus, when ``link`` is given
    (e.g. PCIe from host to GPU), ``link.read_time_s(...)`` of the same bytes and ops. The two
    stages are sequential (the model of Opal-IBM's retrieve: tier read, then a host→device copy,
    index_blend.md O18). Raises ``ValueError`` for negative/non-int counts or a non-Device.

    >>> from kvlab.tiers.devices import get_device
    >>> round(fetch_time_s(4, 2**21, get_device("opal_cpu_memory")), 7)   # 200 ns + 8 MiB / 50 GB/s
    0.000168
    """
    return _transfer_time_s(num_blocks, block_bytes, device, link, write=False)


def offload_time_s(num_blocks: int, block_bytes: int, device: Device, link: Device | None = None) -> float:
    """Seconds to offload ``num_blocks`` blocks to ``device``: ``link.write`` then ``device.write``.

    The mirror of :func:`fetch_time_s` (same model, same errors).
    """
    return _transfer_time_s(num_blocks, block_bytes, device, link, write=True)


def recompute_time_s(num_tokens: int, model: ModelSpec, gpu_flops: float, context_tokens: int = 0,
                     mfu: float = DEFAULT_MFU) -> float:
    """Seconds to prefill ``num_tokens`` after ``context_tokens``: ``prefill_flops / (gpu_flops × mfu)``.

    ``gpu_flops`` is the dense FLOP/s of the GPUs doing the prefill (sum them for a TP group);
    ``mfu`` in (0, 1] (default 0.5, see the module doc). Raises ``ValueError`` on bad input.

    >>> from kvlab.tiers.models import get_model
    >>> round(recompute_time_s(1000, get_model("Llama-3-8B"), 989.5e12), 4)
    0.033
    """
    if not isinstance(model, ModelSpec):
        raise ValueError(f"model must be a ModelSpec, got {model!r}")
    g = _check_real("gpu_flops", gpu_flops, positive=True)
    return model.prefill_flops(num_tokens, context_tokens) / (g * _check_mfu(mfu))


@dataclass(frozen=True)
class LoadOrRecompute:
    """Outcome of :func:`load_or_recompute`: both times in seconds and the cheaper choice.

    ``decision`` is ``"load"`` when ``fetch_s < recompute_s`` (a tie recomputes: no I/O);
    ``saved_s = max(0, recompute_s − fetch_s)``.

    >>> LoadOrRecompute(fetch_s=0.01, recompute_s=0.03, decision="load", saved_s=0.02).decision
    'load'
    """

    fetch_s: float
    recompute_s: float
    decision: str
    saved_s: float


def load_or_recompute(num_blocks: int, block_size: int, model: ModelSpec, device: Device, gpu_flops: float,
                      *, link: Device | None = None, context_tokens: int = 0,
                      mfu: float = DEFAULT_MFU) -> LoadOrRecompute:
    """Compare fetching ``num_blocks`` full blocks from ``device`` (+ ``link``) with recomputing them.

    The blocks hold ``num_blocks × block_size`` tokens that start after ``context_tokens``
    tokens already on the GPU (their attention reads that context). The "recompute vs load per
    tier" question of engines.md §8.1; see :func:`fetch_time_s`, :func:`recompute_time_s`.
    Raises ``ValueError`` on bad input.

    >>> from kvlab.tiers.devices import get_device
    >>> from kvlab.tiers.models import get_model
    >>> r = load_or_recompute(8, 256, get_model("Llama-3-70B"), get_device("nvme_gen4"), 8 * 312e12,
    ...                       link=get_device("pcie_gen4_x16"))
    >>> r.decision, round(r.fetch_s, 3), round(r.recompute_s, 3)
    ('load', 0.123, 0.236)
    """
    _check_int("num_blocks", num_blocks)
    block_bytes = model.kv_bytes_per_block(block_size) if isinstance(model, ModelSpec) else None
    recompute_s = recompute_time_s(num_blocks * block_size, model, gpu_flops, context_tokens, mfu)
    fetch_s = fetch_time_s(num_blocks, block_bytes, device, link)
    load = fetch_s < recompute_s
    return LoadOrRecompute(fetch_s=fetch_s, recompute_s=recompute_s, decision="load" if load else "recompute",
                           saved_s=max(0.0, recompute_s - fetch_s))


def mooncake_prefill_flops(num_tokens: int, model: ModelSpec, a: float = 4.0, b: float = 22.0) -> float:
    """Mooncake FAST'25 Eq. 1: prefill FLOPs of ``n`` tokens = ``l · (a·n²·d + b·n·d²)``.

    ``l`` = layers, ``d`` = ``hidden_size``, ``a = 4`` and ``b = 22`` the paper's fitted
    constants (Table 1). A coarser alternative to :meth:`ModelSpec.prefill_flops`.
    Raises ``ValueError`` on a negative or non-int ``num_tokens``.
    """
    _check_int("num_tokens", num_tokens)
    d = model.hidden_size
    return float(model.layers * (a * num_tokens * num_tokens * d + b * num_tokens * d * d))


def mooncake_break_even_bandwidth(p_tokens: int, model: ModelSpec, gpu_flops: float, *, num_gpus: int = 1,
                                  a: float = 4.0, b: float = 22.0) -> float:
    """Load bandwidth (bytes/s) above which loading ``p`` cached tokens beats recomputing them.

    Mooncake FAST'25 Eq. 2 (engines.md §8.1): load wins if ``B / G > 2·d·s / (gqa·(a·p·d + b·d²))``
    with ``B`` the load bandwidth, ``G = num_gpus × gpu_flops`` the aggregate compute of the
    prefill instance (the paper's 8×A800 / 8×H800 nodes), ``d`` = ``hidden_size``, ``s`` =
    ``bytes_per_elem``, ``gqa`` = ``q_heads / kv_heads``, ``p`` = prefix tokens and ``a, b`` =
    4, 22 fitted constants. It follows from equating the transfer time of the prefix's KV,
    ``p · l · 2·d·s/gqa / B``, with its compute time, Eq. 1 ``l·(a·p²·d + b·p·d²) / G``.
    We use the model's real cache size, ``kv_bytes_per_token / l``, in place of ``2·d·s/gqa``:
    identical when ``q_heads × head_dim = hidden_size`` (Llama), and the right size otherwise
    (Qwen3-32B, Gemma-2, MLA). Returns ``G × kv_bytes_per_token / (l · (a·p·d + b·d²))``.
    Raises ``ValueError`` for ``p_tokens < 1`` or other bad input.

    >>> from kvlab.tiers.models import get_model
    >>> round(mooncake_break_even_bandwidth(8192, get_model("Llama-3-70B"), 312e12, num_gpus=8) / 1e9, 2)
    5.86
    """
    _check_int("p_tokens", p_tokens, minimum=1)
    _check_int("num_gpus", num_gpus, minimum=1)
    if not isinstance(model, ModelSpec):
        raise ValueError(f"model must be a ModelSpec, got {model!r}")
    g = num_gpus * _check_real("gpu_flops", gpu_flops, positive=True)
    _check_real("a", a, positive=False)
    _check_real("b", b, positive=False)
    d = model.hidden_size
    denominator = model.layers * (a * p_tokens * d + b * d * d)
    if denominator <= 0:
        raise ValueError(f"a and b must not both be 0, got a={a!r}, b={b!r}")
    return g * model.kv_bytes_per_token / denominator


def tokens_to_load(local_hit_tokens: int, tier_hit_tokens: int, prompt_tokens: int | None = None) -> int:
    """Tokens to onboard from a lower tier: ``max(0, tier_hit_tokens − local_hit_tokens)``.

    LMCache's vLLM connector (``vllm_v1_adapter.py :: get_num_new_matched_tokens``, engines.md
    §3 L4): ``need_to_load = lmcache_hit − vllm_local_hit``; ≤ 0 loads nothing. The tiers may
    use different units (a 16-token GPU block, a 256-token chunk), so the local hit can exceed
    the tier's. With ``prompt_tokens``, a tier hit covering the whole prompt is cut by one token
    (the last token must be computed to produce logits). Raises ``ValueError`` for negative or
    non-int counts, or a hit longer than ``prompt_tokens``.

    >>> tokens_to_load(52 * 16, 3 * 256)     # 832 local tokens vs 768 in 256-token chunks
    0
    >>> tokens_to_load(512, 1024, prompt_tokens=1024)
    511
    """
    _check_int("local_hit_tokens", local_hit_tokens)
    _check_int("tier_hit_tokens", tier_hit_tokens)
    if prompt_tokens is not None:
        _check_int("prompt_tokens", prompt_tokens)
        for field, value in (("local_hit_tokens", local_hit_tokens), ("tier_hit_tokens", tier_hit_tokens)):
            if value > prompt_tokens:
                raise ValueError(f"{field} must be <= prompt_tokens={prompt_tokens}, got {value}")
        if tier_hit_tokens == prompt_tokens:
            tier_hit_tokens -= 1
    return max(0, tier_hit_tokens - local_hit_tokens)


@dataclass(frozen=True)
class TierHit:
    """``num_blocks`` consecutive prefix blocks served by ``device`` (through ``link``, if given).

    >>> from kvlab.tiers.devices import get_device
    >>> TierHit(get_device("nvme_gen4"), 3, get_device("pcie_gen4_x16")).num_blocks
    3
    """

    device: Device
    num_blocks: int
    link: Device | None = None

    def __post_init__(self) -> None:
        _check_device("device", self.device)
        _check_int("num_blocks", self.num_blocks)
        _check_device("link", self.link, optional=True)


def ttft_saved_s(hits: Sequence[TierHit | tuple], block_size: int, model: ModelSpec, gpu_flops: float,
                 *, mfu: float = DEFAULT_MFU) -> float:
    """Estimated prefill seconds saved by prefix hits spread over tiers, vs computing everything.

    ``hits`` lists the tiers in prefix order (as Opal's strict prefix walk across tiers,
    index_blend.md O15, and LMCache's backend order): the first ``hits[0].num_blocks`` blocks
    of the prompt come from ``hits[0].device``, the next ones from ``hits[1]``, … Items are
    :class:`TierHit` or ``(device, num_blocks[, link])`` tuples. Returns the sum over tiers of
    ``max(0, recompute − fetch)`` for that tier's blocks, where the recompute of a tier's
    blocks attends over all earlier blocks (``context_tokens``). A tier slower than recomputing
    saves 0 (the engine would recompute). GPU-resident hits: omit them, or pass the HBM device.
    Raises ``ValueError`` on bad input.

    >>> from kvlab.tiers.devices import get_device
    >>> from kvlab.tiers.models import get_model
    >>> pcie = get_device("pcie_gen5_x16")
    >>> hits = [(get_device("host_dram_ddr5_4800_8ch"), 4, pcie), (get_device("nvme_gen5"), 4, pcie)]
    >>> round(ttft_saved_s(hits, 256, get_model("Llama-3-8B"), 989.5e12), 4)
    0.0532
    """
    if isinstance(hits, (str, bytes)) or not isinstance(hits, Sequence):
        raise ValueError(f"hits must be a sequence of TierHit or (device, num_blocks[, link]), got {hits!r}")
    saved_s = 0.0
    context_tokens = 0
    for i, hit in enumerate(hits):
        if isinstance(hit, tuple) and 2 <= len(hit) <= 3:
            hit = TierHit(*hit)
        elif not isinstance(hit, TierHit):
            raise ValueError(f"hits[{i}] must be a TierHit or (device, num_blocks[, link]), got {hit!r}")
        r = load_or_recompute(hit.num_blocks, block_size, model, hit.device, gpu_flops, link=hit.link,
                              context_tokens=context_tokens, mfu=mfu)
        saved_s += r.saved_s
        context_tokens += hit.num_blocks * block_size
    return saved_s
