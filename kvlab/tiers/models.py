"""Model shapes (KV bytes per token, prefill FLOPs) and GPU compute and memory-bandwidth presets.

:data:`MODELS` holds every row of docs/specs/engines.md §8.2 (values from the models' public
``config.json``; ``num_params`` / ``num_active_params`` from the model cards). :data:`GPU_FLOPS` maps
a GPU name to its dense BF16 FLOP/s, :data:`GPU_HBM_BYTES_PER_S` to its HBM bandwidth. They feed
:mod:`kvlab.tiers.cost` (load vs recompute) and the cluster step-time models (:mod:`kvlab.sim.cluster.timing`).

KV bytes per token (engines.md §8.2), BF16 = 2 bytes per element:

* MHA / GQA: ``2 (K and V) × layers × kv_heads × head_dim × bytes_per_elem``;
* MLA (DeepSeek-V2/V3): ``layers × (kv_lora_rank + rope_dim) × bytes_per_elem``.

Tensor parallelism is not modelled here: a GPU holds ``1/TP`` of the GQA cache while
``TP ≤ kv_heads``; MLA latents are replicated on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.tiers.devices import _check_int, _check_real

__all__ = ["GPU_FLOPS", "GPU_HBM_BYTES_PER_S", "MODELS", "ModelSpec", "get_gpu_flops", "get_gpu_hbm_bytes_per_s",
           "get_model"]


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """Shape of one transformer as far as the KV cache and prefill cost are concerned.

    Fields (keyword-only): ``name``; ``layers``, ``kv_heads``, ``q_heads`` (query/attention
    heads), ``head_dim``, ``hidden_size`` (ints ≥ 1); ``num_params`` (total parameters, > 0);
    ``num_active_params`` (parameters used per token — MoE; ``None`` → ``num_params``);
    ``bytes_per_elem`` (int ≥ 1, 2 for BF16/FP16, 1 for FP8); ``kv_lora_rank`` and
    ``rope_dim`` (MLA, both given or neither); ``note``.

    For MLA models ``kv_heads`` / ``head_dim`` describe the decompressed heads (used only for
    the attention FLOPs); the cache size comes from the latent. Raises ``ValueError`` naming
    the field and the value on bad input.

    >>> m = ModelSpec(name="tiny", layers=2, kv_heads=2, q_heads=4, head_dim=8, hidden_size=32,
    ...               num_params=1e6)
    >>> m.kv_bytes_per_token                      # 2 × 2 layers × 2 heads × 8 × 2 bytes
    128
    >>> m.kv_bytes_per_block(16), m.blocks_for_bytes(10_000, 16), m.tokens_for_bytes(10_000, 16)
    (2048, 4, 64)
    >>> m.prefill_flops(10)                       # 2·1e6·10 + 4·2·32·10·(0 + 10/2)
    20012800.0
    >>> get_model("Llama-3-8B").kv_bytes_per_token
    131072
    """

    name: str
    layers: int
    kv_heads: int
    q_heads: int
    head_dim: int
    hidden_size: int
    num_params: float
    num_active_params: float | None = None
    bytes_per_elem: int = 2
    kv_lora_rank: int | None = None
    rope_dim: int | None = None
    note: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name must be a non-empty str, got {self.name!r}")
        for field in ("layers", "kv_heads", "q_heads", "head_dim", "hidden_size", "bytes_per_elem"):
            _check_int(field, getattr(self, field), minimum=1)
        if self.q_heads % self.kv_heads:
            raise ValueError(f"q_heads must be a multiple of kv_heads={self.kv_heads}, got {self.q_heads!r}")
        _check_real("num_params", self.num_params, positive=True)
        if self.num_active_params is None:
            object.__setattr__(self, "num_active_params", self.num_params)
        _check_real("num_active_params", self.num_active_params, positive=True)
        if self.num_active_params > self.num_params:
            raise ValueError(f"num_active_params must be <= num_params={self.num_params}, "
                             f"got {self.num_active_params!r}")
        if (self.kv_lora_rank is None) != (self.rope_dim is None):
            raise ValueError(f"kv_lora_rank and rope_dim must be given together, got kv_lora_rank="
                             f"{self.kv_lora_rank!r}, rope_dim={self.rope_dim!r}")
        if self.kv_lora_rank is not None:
            _check_int("kv_lora_rank", self.kv_lora_rank, minimum=1)
            _check_int("rope_dim", self.rope_dim, minimum=0)
        if not isinstance(self.note, str):
            raise ValueError(f"note must be a str, got {self.note!r}")

    @property
    def is_mla(self) -> bool:
        """True for multi-head latent attention (the cache holds ``kv_lora_rank + rope_dim`` per layer)."""
        return self.kv_lora_rank is not None

    @property
    def gqa(self) -> int:
        """Query heads per KV head (Mooncake FAST'25's ``gqa``; 1 for MHA)."""
        return self.q_heads // self.kv_heads

    @property
    def attention_dim(self) -> int:
        """``q_heads × head_dim`` (Kaplan's ``d_attn``); differs from ``hidden_size`` for e.g. Qwen3-32B."""
        return self.q_heads * self.head_dim

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes of one token over all layers (engines.md §8.2 formula, see module doc)."""
        if self.is_mla:
            return self.layers * (self.kv_lora_rank + self.rope_dim) * self.bytes_per_elem
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_elem

    def kv_bytes_per_block(self, block_size: int) -> int:
        """Bytes of one full block of ``block_size`` tokens (vLLM block, LMCache chunk, …).

        Raises ``ValueError`` if ``block_size`` is not an int ≥ 1.
        """
        _check_int("block_size", block_size, minimum=1)
        return block_size * self.kv_bytes_per_token

    def blocks_for_bytes(self, capacity_bytes: int, block_size: int) -> int:
        """Whole blocks that fit in ``capacity_bytes`` (floor). ``ValueError`` on bad input."""
        _check_int("capacity_bytes", capacity_bytes)
        return capacity_bytes // self.kv_bytes_per_block(block_size)

    def tokens_for_bytes(self, capacity_bytes: int, block_size: int = 1) -> int:
        """Tokens that fit in ``capacity_bytes`` when stored in whole blocks of ``block_size``.

        ``block_size = 1`` gives the raw ``capacity_bytes // kv_bytes_per_token``.
        """
        return self.blocks_for_bytes(capacity_bytes, block_size) * block_size

    def prefill_flops(self, num_tokens: int, context_tokens: int = 0) -> float:
        """Forward FLOPs to prefill ``num_tokens`` new tokens after ``context_tokens`` cached ones.

        ``2 · num_active_params · num_tokens`` (the usual "2N per token" rule for the weight matmuls,
        Kaplan et al. 2020, Scaling Laws, Table 1) plus the attention over the causal context,
        ``2 · 2 · layers · attention_dim · (context_tokens + num_tokens / 2)`` per token (QKᵀ and
        AV, 2 FLOPs per multiply-add; the accounting PaLM (Chowdhery et al. 2022, App. B) uses —
        Kaplan counts only QKᵀ). Embeddings count as parameters; MLA is approximated with its
        decompressed heads. Raises ``ValueError`` for negative or non-int token counts.
        """
        _check_int("num_tokens", num_tokens)
        _check_int("context_tokens", context_tokens)
        dense = 2.0 * self.num_active_params * num_tokens
        # sum over new tokens i of (context + i) ≈ n·context + n²/2, kept exact in integers.
        attention = 2 * self.layers * self.attention_dim * num_tokens * (2 * context_tokens + num_tokens)
        return dense + float(attention)


def _m(name: str, layers: int, kv_heads: int, head_dim: int, q_heads: int, hidden_size: int, num_params: float,
       num_active_params: float | None = None, note: str = "", **mla: int) -> ModelSpec:
    return ModelSpec(name=name, layers=layers, kv_heads=kv_heads, head_dim=head_dim, q_heads=q_heads,
                     hidden_size=hidden_size, num_params=num_params, num_active_params=num_active_params, note=note,
                     **mla)


MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        #  name               layers kv  hdim  q    hidden  num_params  active   (engines.md §8.2 rows)
        _m("Llama-3.2-1B", 16, 8, 64, 32, 2048, 1.24e9),
        _m("Llama-3.2-3B", 28, 8, 128, 24, 3072, 3.21e9),
        _m("Llama-3-8B", 32, 8, 128, 32, 4096, 8.03e9),
        _m("Llama-3.1-8B", 32, 8, 128, 32, 4096, 8.03e9),
        _m("Mistral-7B", 32, 8, 128, 32, 4096, 7.24e9, note="v0.1 has a 4k sliding window"),
        _m("Mixtral-8x7B", 32, 8, 128, 32, 4096, 46.7e9, 12.9e9, note="MoE, 2 of 8 experts per token"),
        _m("Llama-2-7B", 32, 32, 128, 32, 4096, 6.74e9, note="MHA"),
        _m("Llama-2-13B", 40, 40, 128, 40, 5120, 13.0e9, note="MHA"),
        _m("Llama-3-70B", 80, 8, 128, 64, 8192, 70.6e9, note='Mooncake paper: "320 KB" per token'),
        _m("Llama-3.1-70B", 80, 8, 128, 64, 8192, 70.6e9),
        _m("Qwen2.5-72B", 80, 8, 128, 64, 8192, 72.7e9),
        _m("Llama-3.1-405B", 126, 8, 128, 128, 16384, 405e9),
        _m("Qwen2.5-7B", 28, 4, 128, 28, 3584, 7.6e9),
        _m("Qwen3-8B", 36, 8, 128, 32, 4096, 8.2e9),
        _m("Qwen3-32B", 64, 8, 128, 64, 5120, 32.8e9, note="attention_dim 8192 > hidden_size 5120"),
        _m("Qwen3-30B-A3B", 48, 4, 128, 32, 2048, 30.5e9, 3.3e9, note="MoE"),
        _m("Qwen3-235B-A22B", 94, 4, 128, 64, 4096, 235e9, 22e9, note="MoE"),
        _m("Gemma-2-9B", 42, 8, 256, 16, 3584, 9.24e9, note="half the layers use a 4k window"),
        _m("gpt-oss-120b", 36, 8, 64, 64, 2880, 117e9, 5.1e9,
           note="MoE; alternating full / 128-token window layers"),
        _m("DeepSeek-V3", 61, 128, 128, 128, 7168, 671e9, 37e9, kv_lora_rank=512, rope_dim=64,
           note="MLA; FP8 cache halves it"),
        _m("DeepSeek-R1", 61, 128, 128, 128, 7168, 671e9, 37e9, kv_lora_rank=512, rope_dim=64,
           note="MLA; same architecture as DeepSeek-V3"),
    )
}
"""Model presets by name (engines.md §8.2; sliding windows are noted, not modelled)."""


GPU_FLOPS: dict[str, float] = {
    # Dense (no sparsity) BF16 tensor-core FLOP/s per GPU.
    "H100-SXM": 989.5e12,  # NVIDIA H100 datasheet (1,979 TFLOPS with sparsity / 2); Opal's worker.hw default
    "H200": 989.5e12,  # NVIDIA H200 datasheet: same compute as H100 SXM
    "H800": 989.5e12,  # export variant of H100 (reduced interconnect, same compute); Mooncake FAST'25 §2
    "B200": 2.25e15,  # NVIDIA HGX B200 datasheet: 36 PFLOPS BF16 with sparsity for 8 GPUs -> 2.25 dense each
    "A100": 312e12,  # NVIDIA A100 datasheet
    "A800": 312e12,  # export variant of A100, same compute; Mooncake FAST'25 Table 1 (8x312 TFLOPS)
    "H20": 148e12,  # NVIDIA H20 spec sheet (BF16 dense)
}
"""Dense BF16 FLOP/s per GPU, by name (sources in the comments)."""


GPU_HBM_BYTES_PER_S: dict[str, float] = {
    # Peak HBM bandwidth per GPU, bytes/s (1 TB/s = 1e12 B/s), the SXM / HGX parts GPU_FLOPS names.
    # The NVIDIA datasheet PDFs are not in the searchable corpus; every value below is the datasheet
    # figure as quoted by the secondary pages cited (all agree; none contradicts the spec's table).
    "H100-SXM": 3.35e12,  # NVIDIA H100 datasheet, H100 SXM 80 GB HBM3 (H100 PCIe/NVL differ: 2.0/3.9 TB/s);
    #                       glennklockwood.com/garden/processors/h100, openmetal.io H200 vs H100 SXM5
    "H200": 4.8e12,  # NVIDIA H200 datasheet, 141 GB HBM3e (+43 % over H100 SXM); aiminingco.com/gpu/h200/specs
    "H800": 3.35e12,  # export variant of H100 SXM: same 80 GB HBM3 (only NVLink reduced)
    "B200": 8e12,  # NVIDIA HGX B200 datasheet, 8 TB/s HBM3e per GPU; glennklockwood.com/garden/processors/B200,
    #                modal.com/gpu-glossary/perf/memory-bandwidth
    "A100": 2.039e12,  # NVIDIA A100 datasheet, A100 80 GB SXM HBM2e (the 40 GB part: 1.555e12);
    #                    glennklockwood.com/garden/processors/A100 (cites the datasheet PDF)
    "A800": 2.039e12,  # export variant of A100 80 GB SXM, same HBM2e
    "H20": 4.0e12,  # NVIDIA H20 spec sheet, 96 GB HBM3 at 4.0 TB/s; willitrunai.com/gpus/h20-96gb
}
"""Peak HBM bandwidth in bytes/s per GPU, by name (same names as :data:`GPU_FLOPS`; sources in the comments)."""


def _lookup(table: dict, kind: str, name: str) -> object:
    if isinstance(name, str):
        for key, value in table.items():
            if key.lower() == name.lower():
                return value
    raise ValueError(f"unknown {kind} {name!r}; known: {', '.join(sorted(table))}")


def get_model(name: str) -> ModelSpec:
    """The :class:`ModelSpec` preset ``name`` (case-insensitive); ``ValueError`` listing known names.

    >>> get_model("deepseek-v3").kv_bytes_per_token
    70272
    """
    return _lookup(MODELS, "model", name)


def get_gpu_flops(name: str) -> float:
    """Dense BF16 FLOP/s of GPU ``name`` (case-insensitive); ``ValueError`` listing known names.

    >>> get_gpu_flops("a800")
    312000000000000.0
    """
    return _lookup(GPU_FLOPS, "GPU", name)


def get_gpu_hbm_bytes_per_s(name: str) -> float:
    """Peak HBM bandwidth in bytes/s of GPU ``name`` (case-insensitive); ``ValueError`` listing known names.

    >>> get_gpu_hbm_bytes_per_s("h100-sxm")
    3350000000000.0
    """
    return _lookup(GPU_HBM_BYTES_PER_S, "GPU", name)
