"""Storage devices and links of a KV-cache tier: capacity, bandwidth, latency, concurrency.

A :class:`Device` is the cost model of one place the KV cache can live (GPU HBM, host DRAM,
local NVMe, a distributed file system) or of one link it crosses (PCIe, NVLink, an RDMA NIC).
Transfer time follows a simplified version of Opal's device (docs/specs/index_blend.md O20):

    time_s = ceil(num_ops / concurrency) * latency_s + num_bytes / bandwidth_bytes_per_s

``num_ops`` equal transfers issued together: at most ``concurrency`` are in flight, the rest wait
for a slot (one latency per wave), and all of them share the device bandwidth. Opal instead
lets a transfer that fits in ``bandwidth * latency`` finish at the latency and splits the
bandwidth among the transfers active *at each instant* (processor sharing); for a batch issued
together the totals agree up to one latency per wave.

:data:`DEVICES` holds presets from docs/specs/engines.md §8.1 (vendor/theoretical numbers;
measure on the target for calibrated runs) and Opal's shipped defaults (index_blend.md §B.6).
Unit conventions: vendor "GB" and "GB/s" are decimal (10^9); Opal converts capacity GB with
2^30, bandwidth GB/s with 10^9 and latency ns with 10^-9 (O20), and its presets do the same.
Links store nothing and have ``capacity_bytes = 0``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = ["DEVICES", "Device", "get_device"]

GB = 10**9
GIB = 2**30
TB = 10**12


def _check_int(field: str, value: object, *, minimum: int = 0) -> int:
    """Return ``value`` if it is an ``int`` (not ``bool``) ``>= minimum``, else raise ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{field} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{field} must be >= {minimum}, got {value!r}")
    return value


def _check_real(field: str, value: object, *, positive: bool) -> float:
    """Return ``float(value)`` if it is a finite real ``> 0`` (or ``>= 0``), else raise ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{field} must be a number, got {value!r}")
    v = float(value)
    if v != v or v in (float("inf"), float("-inf")):
        raise ValueError(f"{field} must be finite, got {value!r}")
    if (positive and v <= 0) or v < 0:
        raise ValueError(f"{field} must be {'> 0' if positive else '>= 0'}, got {value!r}")
    return v


@dataclass(frozen=True)
class Device:
    """One storage device or link: capacity, read/write bandwidth, per-op latency, concurrency.

    Fields: ``name``; ``capacity_bytes`` (int ≥ 0; 0 for a link, which stores nothing);
    ``read_bytes_per_s`` and ``write_bytes_per_s`` (> 0; for a link, *read* is the direction
    towards the GPU, i.e. onboard, *write* is away from it, i.e. offload); ``latency_s``
    (≥ 0, fixed cost of one transfer); ``concurrency`` (int ≥ 1, transfers in flight at once);
    ``source`` (where the numbers come from).

    Models Opal's ``AbstractDevice`` (io_model.py; docs/specs/index_blend.md O20), simplified
    as described in :mod:`kvlab.tiers.devices`. Raises ``ValueError`` naming the field and
    the value on bad input.

    >>> nvme = Device("nvme", capacity_bytes=4 * 10**12, read_bytes_per_s=7e9,
    ...               write_bytes_per_s=7e9, latency_s=50e-6, concurrency=128)
    >>> round(nvme.read_time_s(2 * 2**20), 6)          # one 2 MiB block: 50 µs + 2 MiB / 7 GB/s
    0.00035
    >>> round(nvme.read_time_s(256 * 2 * 2**20, num_ops=256), 4)   # 2 waves of 128 ops
    0.0768
    >>> nvme.with_capacity(10**12).capacity_bytes
    1000000000000
    >>> Device("x", capacity_bytes=1, read_bytes_per_s=0, write_bytes_per_s=1, latency_s=0, concurrency=1)
    Traceback (most recent call last):
    ...
    ValueError: read_bytes_per_s must be > 0, got 0
    """

    name: str
    capacity_bytes: int
    read_bytes_per_s: float
    write_bytes_per_s: float
    latency_s: float
    concurrency: int
    source: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name must be a non-empty str, got {self.name!r}")
        _check_int("capacity_bytes", self.capacity_bytes)
        object.__setattr__(self, "read_bytes_per_s", _check_real("read_bytes_per_s", self.read_bytes_per_s,
                                                                  positive=True))
        object.__setattr__(self, "write_bytes_per_s", _check_real("write_bytes_per_s", self.write_bytes_per_s,
                                                                   positive=True))
        object.__setattr__(self, "latency_s", _check_real("latency_s", self.latency_s, positive=False))
        _check_int("concurrency", self.concurrency, minimum=1)
        if not isinstance(self.source, str):
            raise ValueError(f"source must be a str, got {self.source!r}")

    def _time_s(self, num_bytes: int, num_ops: int, bytes_per_s: float) -> float:
        _check_int("num_bytes", num_bytes)
        _check_int("num_ops", num_ops)
        if num_ops == 0:
            if num_bytes != 0:
                raise ValueError(f"num_ops must be >= 1 when num_bytes > 0, got num_ops=0, num_bytes={num_bytes}")
            return 0.0
        waves = -(-num_ops // self.concurrency)
        return waves * self.latency_s + num_bytes / bytes_per_s

    def read_time_s(self, num_bytes: int, num_ops: int = 1) -> float:
        """Seconds to read ``num_bytes`` in total as ``num_ops`` equal transfers issued together.

        ``ceil(num_ops / concurrency) * latency_s + num_bytes / read_bytes_per_s``. ``num_ops = 0``
        (with ``num_bytes = 0``) costs nothing. Raises ``ValueError`` for a negative or
        non-int ``num_bytes`` / ``num_ops``, or ``num_ops = 0`` with ``num_bytes > 0``.
        """
        return self._time_s(num_bytes, num_ops, self.read_bytes_per_s)

    def write_time_s(self, num_bytes: int, num_ops: int = 1) -> float:
        """Seconds to write ``num_bytes`` as ``num_ops`` equal transfers; as :meth:`read_time_s`."""
        return self._time_s(num_bytes, num_ops, self.write_bytes_per_s)

    def with_capacity(self, capacity_bytes: int) -> Device:
        """A copy with another ``capacity_bytes`` (validated; ``ValueError`` if bad)."""
        return dataclasses.replace(self, capacity_bytes=capacity_bytes)


def _d(name: str, capacity_bytes: int, bytes_per_s: float, latency_s: float, concurrency: int, source: str,
       write_bytes_per_s: float | None = None) -> Device:
    return Device(name, capacity_bytes, bytes_per_s, bytes_per_s if write_bytes_per_s is None else write_bytes_per_s,
                  latency_s, concurrency, source)


# Concurrency of memories (HBM, DRAM) is effectively unbounded: 1,000,000 as Opal's CPUMemory.
_UNBOUNDED = 1_000_000
# HBM latency: the spec's order of magnitude for A100 load-to-use (~0.5 µs) used for every HBM.
_HBM_LATENCY_S = 0.5e-6

DEVICES: dict[str, Device] = {
    d.name: d
    for d in (
        # --- GPU memory (HBM); capacity in decimal GB as on the datasheets -----------------------
        _d("a100_80gb_hbm", 80 * GB, 2.0 * TB, _HBM_LATENCY_S, _UNBOUNDED,
           "engines.md §8.1: HBM2e A100-80GB ~2.0 TB/s, ~0.5 µs (NVIDIA datasheet)"),
        _d("h100_hbm", 80 * GB, 3.35 * TB, _HBM_LATENCY_S, _UNBOUNDED,
           "engines.md §8.1: HBM3 H100 SXM 80 GB, 3.35 TB/s (NVIDIA datasheet); latency as A100"),
        _d("h200_hbm", 141 * GB, 4.8 * TB, _HBM_LATENCY_S, _UNBOUNDED,
           "engines.md §8.1: HBM3e H200 141 GB, 4.8 TB/s (NVIDIA datasheet); latency as A100"),
        _d("b200_hbm", 192 * GB, 8.0 * TB, _HBM_LATENCY_S, _UNBOUNDED,
           "engines.md §8.1: HBM3e B200 192 GB, ~8 TB/s (NVIDIA); latency as A100"),
        # --- host memory ---------------------------------------------------------------------------
        # 4800 MT/s x 8 B x 8 channels = 307.2 GB/s per socket (theoretical; explainers say ~200
        # usable). Capacity 512 GiB is OUR choice (a typical 2-socket inference host holds 1-2 TiB).
        _d("host_dram_ddr5_4800_8ch", 512 * GIB, 307.2 * GB, 100e-9, _UNBOUNDED,
           "engines.md §8.1: DDR5-4800 8 ch. ~307 GB/s per socket, ~100 ns (JEDEC arithmetic); "
           "capacity 512 GiB chosen by kvlab"),
        # --- links (capacity 0) ----------------------------------------------------------------------
        # PCIe: the "achieved with pinned memory" values, not the 31.5 / 63 GB/s per-direction line
        # rates. Latency 2.3 µs = measured cudaMemcpyAsync overhead (the spec's "a few µs per DMA
        # op"); concurrency 1 = copies on one CUDA stream run one after another (our choice).
        _d("pcie_gen4_x16", 0, 25 * GB, 2.3e-6, 1,
           "engines.md §8.1: PCIe Gen4 x16 ~25 GB/s achieved (31.5 line rate); 2.3 µs per copy "
           "(FlexKV PR #193, H20)"),
        _d("pcie_gen5_x16", 0, 50 * GB, 2.3e-6, 1,
           "engines.md §8.1: PCIe Gen5 x16 ~50 GB/s achieved (63 line rate); 2.3 µs per copy "
           "(FlexKV PR #193, H20)"),
        _d("nvlink4", 0, 450 * GB, 1e-6, _UNBOUNDED,
           "engines.md §8.1: NVLink 4 (H100/H200) 450 GB/s per direction, ~µs"),
        # RDMA: line rate; latency 3 µs picked inside the spec's 2-5 µs one-sided range;
        # concurrency 1024 outstanding work requests (our choice).
        _d("rdma_200gbps", 0, 25 * GB, 3e-6, 1024,
           "engines.md §8.1: RDMA NIC 200 Gb/s = 25 GB/s, ~2-5 µs one-sided (NIC line rate)"),
        _d("rdma_400gbps", 0, 50 * GB, 3e-6, 1024,
           "engines.md §8.1: RDMA NIC 400 Gb/s = 50 GB/s, ~2-5 µs one-sided (NIC line rate)"),
        _d("rdma_4x200gbps", 0, 100 * GB, 3e-6, 1024,
           "FAST'25 §5.1 testbed: four 200 Gb/s RDMA NICs per node, line rate 100 GB/s; latency as "
           "rdma_400gbps"),
        _d("mooncake_te_8x400gbps", 0, 190 * GB, 3e-6, 1024,
           "engines.md §8.1: Mooncake transfer engine 190 GB/s measured on 8x400 Gb/s RoCE "
           "(FAST'25 §5.4); latency as rdma_400gbps"),
        # --- local NVMe: sequential read from the spec; write = read (the spec gives read only).
        # Latency 50 µs picked inside the spec's 10-100 µs; queue depth 128 and 3.84 TB (a common
        # data-center drive size) are our choices.
        _d("nvme_gen4", 3_840 * GB, 7 * GB, 50e-6, 128,
           "engines.md §8.1: NVMe Gen4 x4 ~7 GB/s seq. read, ~10-100 µs per I/O (vendor specs); "
           "latency, queue depth, capacity chosen by kvlab"),
        _d("nvme_gen5", 3_840 * GB, 14 * GB, 50e-6, 128,
           "engines.md §8.1: NVMe Gen5 x4 ~14 GB/s seq. read, ~10-100 µs per I/O (vendor specs); "
           "latency, queue depth, capacity chosen by kvlab"),
        # --- distributed file system: Opal-IBM's RAG config (aggregate, shared by all workers).
        _d("distributed_fs", 172_032 * GIB, 350 * GB, 100_000e-9, 1024,
           "index_blend.md §B.6: Opal-IBM configs/RAG_KVCtiers-HBM-DRAM-DFS.json DistributedFS "
           "(350 GB/s, 100,000 ns, concurrency 1024, 172,032 GB)"),
        # --- Opal's shipped defaults, exactly (configs/defaults.json; O20 unit conversions) ---------
        _d("opal_cpu_memory", 8 * GIB, 50 * GB, 200e-9, 1_000_000,
           "index_blend.md §B.6: Opal kvc.CPUMemory 50 GB/s, 200 ns, concurrency 1,000,000, 8 GB"),
        _d("opal_local_nvme", 1_024 * GIB, 10 * GB, 10_000e-9, 1_000,
           "index_blend.md §B.6: Opal kvc.LocalNVMe 10 GB/s, 10,000 ns, concurrency 1,000, 1,024 GB"),
        _d("opal_distributed_fs", 1_048_576 * GIB, 100 * GB, 100_000e-9, 1_000,
           "index_blend.md §B.6: Opal kvc.DistributedFS 100 GB/s, 100,000 ns, concurrency 1,000, "
           "1,048,576 GB"),
    )
}
"""Device presets by name; every entry's ``source`` cites the number's origin."""


def get_device(name: str) -> Device:
    """The preset :class:`Device` called ``name`` (see :data:`DEVICES`).

    Raises ``ValueError`` listing the known names for an unknown one.

    >>> get_device("opal_local_nvme").latency_s
    1e-05
    """
    try:
        return DEVICES[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown device {name!r}; known: {', '.join(sorted(DEVICES))}") from None
