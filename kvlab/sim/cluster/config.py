"""The configuration of a simulated cluster (cluster_sim.md §6.2–6.6): workers, engine, time.

One frozen dataclass, checked on construction; ``ValueError`` names the field and the value.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from kvlab.core.result import to_jsonable
from kvlab.core.validate import check_choice, check_count, check_flag, check_positive, check_real, check_str
from kvlab.index.faults import FaultInjector
from kvlab.sim.cluster.blend import BlendSpec
from kvlab.sim.cluster.links import LINK_SHARING
from kvlab.sim.cluster.routers import Router, get_router
from kvlab.sim.cluster.tier_store import CACHE_SCOPES
from kvlab.sim.cluster.timing import Roofline
from kvlab.tiers.devices import DEVICES, Device, get_device
from kvlab.tiers.models import GPU_FLOPS, ModelSpec, get_model
from kvlab.tiers.types import WRITE_POLICIES, TierSpec

#: Worker roles: ``mixed`` (prefill and decode), ``prefill`` and ``decode`` (P/D disaggregation).
ROLES = ("mixed", "prefill", "decode")
#: Worker caches: vLLM's KVCacheManager or SGLang's radix cache (:mod:`kvlab.sim.cluster.radix_manager`).
ENGINES = ("vllm", "sglang")
#: GPU → its HBM device preset (capacity), for the default KV block count.
_GPU_HBM_DEVICE = {"H100-SXM": "h100_hbm", "H800": "h100_hbm", "H200": "h200_hbm", "B200": "b200_hbm",
                   "A100": "a100_80gb_hbm", "A800": "a100_80gb_hbm"}


@dataclass(frozen=True)
class ClusterTier:
    """A tier under every worker's GPU cache: a :mod:`kvlab.tiers` tier priced on a device.

    Args:
        name: the tier's name (e.g. ``"CPU"``; the KV events' medium).
        capacity_blocks: engine blocks it holds per worker (>= 1).
        device: a :class:`~kvlab.tiers.devices.Device` or a preset name (``host_dram_ddr5_4800_8ch``).
        policy: its eviction policy (a :mod:`kvlab.policies` name).

    >>> ClusterTier("CPU", 100_000).device.name
    'host_dram_ddr5_4800_8ch'
    """

    name: str
    capacity_blocks: int
    device: Device | str = "host_dram_ddr5_4800_8ch"
    policy: str = "lru"

    def __post_init__(self) -> None:
        check_str("tier name", self.name, nonempty=True)
        object.__setattr__(self, "capacity_blocks", check_positive("capacity_blocks", self.capacity_blocks))
        object.__setattr__(self, "device", _device("device", self.device))
        TierSpec(self.name, self.capacity_blocks, self.policy)  # checks the policy


def _device(name: str, value: object) -> Device:
    if isinstance(value, Device):
        return value
    if not isinstance(value, str) or value not in DEVICES:
        raise ValueError(f"{name} must be a Device or one of {sorted(DEVICES)}, got {value!r}")
    return get_device(value)


@dataclass(frozen=True)
class ClusterConfig:
    """What :func:`~kvlab.sim.cluster.simulate` runs (every field checked on construction).

    Workers and engine (vLLM v1 defaults, cluster_sim.md §6.4):
        num_workers: workers ``w0 .. w{n-1}`` (>= 1). roles: one of :data:`ROLES` per worker, or
        ``None`` (all ``mixed``); a ``decode`` worker needs a ``prefill`` one and vice versa.
        block_size: tokens per engine block. capacity_blocks: usable GPU KV blocks per worker;
        ``None`` derives it from the GPU's HBM (``gpu_memory_utilization`` × capacity × tp −
        weights) / block bytes. enable_prefix_caching.
        max_num_batched_tokens (8192), max_num_seqs (256), long_prefill_token_threshold (0: off).
        engine: each worker's cache, one of :data:`ENGINES`: ``"vllm"`` (KVCacheManager) or
        ``"sglang"`` (the radix cache, :class:`~kvlab.sim.cluster.radix_manager.RadixManager`);
        the scheduling step is vLLM's either way.
    Time (§6.5): model (a :class:`~kvlab.tiers.models.ModelSpec` or preset), gpu (a
        :data:`~kvlab.tiers.models.GPU_FLOPS` name), tp; time_model (``None``: ``Roofline``) —
        any object with ``step_time(StepBatch) -> StepTime``. arrival_overhead_s (α0, added to the
        enqueue time) and output_token_overhead_s (α2, added to every token's emission time: it
        shows in TTFT and E2E, not in the gaps between tokens).
    Tiers and transfers (C7, C8, C14): tiers (``ClusterTier`` per level under the GPU, fastest
        first), tier_write_policy (completed prompts stored at finish), host_link (host→GPU
        device), link_sharing (``fifo``/``ps``), max_kvc_ready_requests (Opal's gate, 8),
        network (device for P/D handoffs, cache transfers and remote store reads).
        cache_scope (C20, :mod:`~kvlab.sim.cluster.tier_store`): ``"local"`` — the tiers are each
        worker's own; ``"global"`` — one pool of N × each tier's capacity shared by the N routable
        workers (Mooncake Store: a block read from another worker's segment crosses the network).
        store_high_watermark (``None``: a tier evicts only when full) and store_eviction_ratio:
        Mooncake Store's eviction rounds — ``store_eviction_ratio`` of a tier's blocks evicted
        at once when its usage reaches ``store_high_watermark`` of its capacity (engines.md §5.1
        M2: 0.9 and 0.05), in either scope.
    Routing (§6.6): router (a :class:`~kvlab.sim.cluster.routers.Router` or a name of
        :data:`~kvlab.sim.cluster.routers.ROUTERS`; ``None``: ``least_loaded``),
        snapshot_interval_s (0: routers see live loads), faults (KV events to the index through a
        :class:`~kvlab.index.FaultInjector`; ``None``: delivered at once).
    CacheBlend: blend (a :class:`~kvlab.sim.cluster.blend.BlendSpec`: non-prefix chunk reuse on every
        worker; the trace needs ``token_ids``).
    Run: coalesce_decode (C9), slo_ttft_s / slo_tbt_s (``None``: no SLO), seed (C24),
        step_sample (keep every n-th step in the ``steps`` frame; 1 keeps all).

    Example:
        >>> c = ClusterConfig(num_workers=2, capacity_blocks=1000)
        >>> c.roles, c.block_bytes
        (('mixed', 'mixed'), 2097152)
        >>> ClusterConfig(max_num_seqs=0)
        Traceback (most recent call last):
        ...
        ValueError: max_num_seqs must be an integer >= 1, got 0
    """

    num_workers: int = 1
    roles: tuple[str, ...] | None = None
    model: ModelSpec | str = "Llama-3.1-8B"
    gpu: str = "H100-SXM"
    tp: int = 1
    block_size: int = 16
    capacity_blocks: int | None = None
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    long_prefill_token_threshold: int = 0
    engine: str = "vllm"
    time_model: object = None
    arrival_overhead_s: float = 0.0
    output_token_overhead_s: float = 0.0
    tiers: tuple[ClusterTier, ...] = ()
    tier_write_policy: str = "write_back"
    host_link: Device | str = "pcie_gen5_x16"
    link_sharing: str = "fifo"
    max_kvc_ready_requests: int = 8
    network: Device | str = "rdma_400gbps"
    cache_scope: str = "local"
    store_high_watermark: float | None = None
    store_eviction_ratio: float = 0.05
    router: object = None
    snapshot_interval_s: float = 0.0
    faults: FaultInjector | None = None
    blend: BlendSpec | None = None
    coalesce_decode: bool = True
    slo_ttft_s: float | None = None
    slo_tbt_s: float | None = None
    seed: int = 0
    step_sample: int = 1
    model_spec: ModelSpec = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        s = object.__setattr__
        s(self, "_given", {"roles": self.roles, "capacity_blocks": self.capacity_blocks})  # before defaults
        for name in ("num_workers", "tp", "block_size", "max_num_batched_tokens", "max_num_seqs",
                     "max_kvc_ready_requests", "step_sample"):
            s(self, name, check_positive(name, getattr(self, name)))
        if isinstance(self.roles, str):
            raise ValueError(f"roles must be a sequence of role names (one per worker), got the string {self.roles!r}")
        roles = ("mixed",) * self.num_workers if self.roles is None else tuple(self.roles)
        if len(roles) != self.num_workers:
            raise ValueError(f"roles has {len(roles)} entries for num_workers={self.num_workers}")
        for i, role in enumerate(roles):
            check_choice(f"roles[{i}]", role, ROLES)
        if ("decode" in roles) != ("prefill" in roles):
            raise ValueError(f"roles {roles}: a decode worker needs a prefill worker and vice versa")
        s(self, "roles", roles)
        s(self, "model_spec", self.model if isinstance(self.model, ModelSpec) else _model(self.model))
        check_choice("gpu", self.gpu, GPU_FLOPS)
        check_choice("engine", self.engine, ENGINES)
        s(self, "gpu_memory_utilization", check_real("gpu_memory_utilization", self.gpu_memory_utilization,
                                                     low=0.0, high=1.0, low_open=True))
        s(self, "enable_prefix_caching", check_flag("enable_prefix_caching", self.enable_prefix_caching))
        s(self, "coalesce_decode", check_flag("coalesce_decode", self.coalesce_decode))
        s(self, "long_prefill_token_threshold", check_count("long_prefill_token_threshold",
                                                            self.long_prefill_token_threshold))
        if self.max_num_batched_tokens < self.block_size:
            raise ValueError(f"max_num_batched_tokens must be >= block_size ({self.block_size}), "
                             f"got {self.max_num_batched_tokens}")
        for name in ("arrival_overhead_s", "output_token_overhead_s", "snapshot_interval_s"):
            s(self, name, check_real(name, getattr(self, name), low=0.0))
        for name in ("slo_ttft_s", "slo_tbt_s"):
            s(self, name, check_real(name, getattr(self, name), low=0.0, low_open=True, optional=True))
        s(self, "seed", check_count("seed", self.seed))
        if isinstance(self.tiers, ClusterTier) or not isinstance(self.tiers, (tuple, list)):
            raise ValueError(f"tiers must be a tuple of ClusterTier (fastest first), got {self.tiers!r}")
        s(self, "tiers", tuple(self.tiers))
        for i, tier in enumerate(self.tiers):
            if not isinstance(tier, ClusterTier):
                raise ValueError(f"tiers[{i}] must be a ClusterTier, got {tier!r}")
        if len({t.name for t in self.tiers}) != len(self.tiers):
            raise ValueError(f"tiers repeat a name: {[t.name for t in self.tiers]}")
        check_choice("tier_write_policy", self.tier_write_policy, WRITE_POLICIES)
        check_choice("cache_scope", self.cache_scope, CACHE_SCOPES)
        if self.cache_scope == "global" and not self.tiers:
            raise ValueError("cache_scope='global' shares the tiers under the GPUs; give tiers (a ClusterTier)")
        for name in ("store_high_watermark", "store_eviction_ratio"):
            s(self, name, check_real(name, getattr(self, name), low=0.0, high=1.0, low_open=True,
                                     optional=name == "store_high_watermark"))
        s(self, "host_link", _device("host_link", self.host_link))
        s(self, "network", _device("network", self.network))
        check_choice("link_sharing", self.link_sharing, LINK_SHARING)
        if isinstance(self.router, str):
            get_router(self.router)  # an unknown name fails here, naming the routers
        elif self.router is not None and not isinstance(self.router, Router):
            raise ValueError(f"router must be a kvlab.sim.cluster Router or a router name, got {self.router!r}")
        if self.blend is not None and not isinstance(self.blend, BlendSpec):
            raise ValueError(f"blend must be a BlendSpec or None, got {self.blend!r}")
        if self.faults is not None and not isinstance(self.faults, FaultInjector):
            raise ValueError(f"faults must be a FaultInjector or None, got {type(self.faults).__name__}")
        if self.time_model is not None and not callable(getattr(self.time_model, "step_time", None)):
            raise ValueError(f"time_model must have a step_time(batch) method, got {self.time_model!r}")
        if self.capacity_blocks is None:
            s(self, "capacity_blocks", self._hbm_blocks())
        s(self, "capacity_blocks", check_positive("capacity_blocks", self.capacity_blocks))

    def replace(self, **changes: object) -> ClusterConfig:
        """This configuration with ``changes``; ``roles`` and ``capacity_blocks`` left to their
        defaults (``None``) are derived again (from the new ``num_workers``, model, GPU, tp),
        which ``dataclasses.replace`` would not do.

        Example:
            >>> ClusterConfig(capacity_blocks=100).replace(num_workers=2).roles
            ('mixed', 'mixed')
        """
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.init}
        return ClusterConfig(**{**values, **self._given, **changes})

    @property
    def block_bytes(self) -> int:
        """Bytes of one engine block's KV (all layers)."""
        return self.model_spec.kv_bytes_per_block(self.block_size)

    def _hbm_blocks(self) -> int:
        device = _GPU_HBM_DEVICE.get(self.gpu)
        if device is None:
            raise ValueError(f"capacity_blocks is None and the HBM size of gpu {self.gpu!r} is not known; "
                             f"give capacity_blocks")
        hbm = get_device(device).capacity_bytes * self.tp * self.gpu_memory_utilization
        free = hbm - self.model_spec.num_params * self.model_spec.bytes_per_elem
        if free < self.block_bytes:
            raise ValueError(f"model {self.model_spec.name} leaves no KV memory on {self.tp} × {self.gpu}; "
                             f"raise tp or give capacity_blocks")
        return int(free // self.block_bytes)

    def to_dict(self) -> dict[str, object]:
        """The configuration as JSON types (devices by name, the router and faults by their options)."""
        out = {}
        for name in self.__dataclass_fields__:
            if name == "model_spec":
                continue
            value = getattr(self, name)
            if name == "model":
                value = self.model_spec.name
            elif isinstance(value, Device):
                value = value.name
            elif name == "tiers":
                value = [{"name": t.name, "capacity_blocks": t.capacity_blocks, "device": t.device.name,
                          "policy": t.policy} for t in value]
            elif name == "router":  # None: what runs (least loaded)
                value = (get_router("least_loaded" if value is None else value) if not isinstance(value, Router)
                         else value).to_dict()
            elif name == "time_model":  # None: what runs (the roofline)
                value = _options(value if value is not None else Roofline(model=self.model_spec, gpu=self.gpu,
                                                                             tp=self.tp))
            elif name == "faults" and value is not None:
                value = _options(value)
            out[name] = to_jsonable(value)
        return out


def _model(name: object) -> ModelSpec:
    if not isinstance(name, str):
        raise ValueError(f"model must be a ModelSpec or a preset name, got {name!r}")
    return get_model(name)


def _options(obj: object) -> dict[str, object]:
    """An object's type and its public attributes that are plain values (its options)."""
    out: dict[str, object] = {"type": type(obj).__name__}
    for key, value in sorted(vars(obj).items()) if hasattr(obj, "__dict__") else ():
        if not key.startswith("_") and isinstance(value, (bool, int, float, str, type(None))):
            out[key] = value
    return out
