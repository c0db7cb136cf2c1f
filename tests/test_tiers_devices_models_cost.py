"""kvlab.tiers devices, models and cost: exact values from docs/specs/engines.md §8 and index_blend.md §B.6."""

import dataclasses

import pytest

from kvlab.tiers import (
    DEVICES,
    GPU_FLOPS,
    MODELS,
    Device,
    LoadOrRecompute,
    ModelSpec,
    TierHit,
    fetch_time_s,
    get_device,
    get_gpu_flops,
    get_model,
    load_or_recompute,
    mooncake_break_even_bandwidth,
    mooncake_prefill_flops,
    offload_time_s,
    recompute_time_s,
    tokens_to_load,
    ttft_saved_s,
)

KIB = 1024
MIB = 2**20
GIB = 2**30


# --- devices -------------------------------------------------------------------------------------

def test_opal_defaults_exact():
    # index_blend.md §B.6, converted as O20: capacity GB * 2^30, GB/s * 1e9, ns * 1e-9.
    cpu, nvme, dfs = (get_device(n) for n in ("opal_cpu_memory", "opal_local_nvme", "opal_distributed_fs"))
    assert (cpu.capacity_bytes, cpu.read_bytes_per_s, cpu.write_bytes_per_s) == (8 * GIB, 50e9, 50e9)
    assert (cpu.latency_s, cpu.concurrency) == (200e-9, 1_000_000)
    assert (nvme.capacity_bytes, nvme.read_bytes_per_s, nvme.latency_s, nvme.concurrency) == (
        1024 * GIB, 10e9, 1e-5, 1_000)
    assert (dfs.capacity_bytes, dfs.read_bytes_per_s, dfs.latency_s, dfs.concurrency) == (2**50, 100e9, 1e-4, 1_000)


def test_hardware_presets_from_spec_table():
    assert (DEVICES["h100_hbm"].capacity_bytes, DEVICES["h100_hbm"].read_bytes_per_s) == (80 * 10**9, 3.35e12)
    assert (DEVICES["h200_hbm"].capacity_bytes, DEVICES["h200_hbm"].read_bytes_per_s) == (141 * 10**9, 4.8e12)
    assert (DEVICES["b200_hbm"].capacity_bytes, DEVICES["b200_hbm"].read_bytes_per_s) == (192 * 10**9, 8e12)
    assert DEVICES["host_dram_ddr5_4800_8ch"].read_bytes_per_s == 4800e6 * 8 * 8  # 307.2 GB/s
    assert DEVICES["host_dram_ddr5_4800_8ch"].capacity_bytes == 512 * GIB
    assert DEVICES["pcie_gen4_x16"].read_bytes_per_s == 25e9  # achieved, not the 31.5 line rate
    assert DEVICES["pcie_gen5_x16"].read_bytes_per_s == 50e9
    assert DEVICES["nvme_gen4"].read_bytes_per_s == 7e9 and DEVICES["nvme_gen5"].read_bytes_per_s == 14e9
    assert 10e-6 <= DEVICES["nvme_gen4"].latency_s <= 100e-6
    assert DEVICES["rdma_200gbps"].read_bytes_per_s == 200e9 / 8
    assert DEVICES["rdma_400gbps"].read_bytes_per_s == 400e9 / 8
    for name, device in DEVICES.items():
        assert device.name == name and device.source, name


def test_read_write_time_model():
    dev = Device("d", capacity_bytes=0, read_bytes_per_s=1e9, write_bytes_per_s=5e8, latency_s=1e-3, concurrency=4)
    assert dev.read_time_s(10**9) == pytest.approx(1.001)
    assert dev.write_time_s(10**9) == pytest.approx(2.001)
    # 4 ops fit one wave, 5 ops need two; bandwidth is shared, so the byte term is unchanged.
    assert dev.read_time_s(10**9, num_ops=4) == pytest.approx(1.001)
    assert dev.read_time_s(10**9, num_ops=5) == pytest.approx(1.002)
    assert dev.read_time_s(0, num_ops=9) == pytest.approx(3e-3)
    assert dev.read_time_s(0, num_ops=0) == 0.0


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"num_bytes": -1}, "num_bytes must be >= 0, got -1"),
    ({"num_bytes": 1.5}, "num_bytes must be an int, got 1.5"),
    ({"num_bytes": 10, "num_ops": 0}, "num_ops must be >= 1 when num_bytes > 0"),
    ({"num_bytes": 10, "num_ops": -2}, "num_ops must be >= 0, got -2"),
])
def test_time_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        get_device("nvme_gen4").read_time_s(**kwargs)


GOOD = {"name": "d", "capacity_bytes": 1, "read_bytes_per_s": 1.0, "write_bytes_per_s": 1.0, "latency_s": 0.0,
        "concurrency": 1}


@pytest.mark.parametrize(("field", "value", "message"), [
    ("name", "", "name must be a non-empty str, got ''"),
    ("capacity_bytes", -1, "capacity_bytes must be >= 0, got -1"),
    ("capacity_bytes", 1.0, "capacity_bytes must be an int, got 1.0"),
    ("capacity_bytes", True, "capacity_bytes must be an int, got True"),
    ("read_bytes_per_s", 0, "read_bytes_per_s must be > 0, got 0"),
    ("write_bytes_per_s", -5.0, "write_bytes_per_s must be > 0, got -5.0"),
    ("read_bytes_per_s", float("nan"), "read_bytes_per_s must be finite, got nan"),
    ("latency_s", -1e-6, "latency_s must be >= 0, got -1e-06"),
    ("latency_s", "1", "latency_s must be a number, got '1'"),
    ("concurrency", 0, "concurrency must be >= 1, got 0"),
    ("concurrency", 2.0, "concurrency must be an int, got 2.0"),
])
def test_device_validation(field, value, message):
    with pytest.raises(ValueError, match=message):
        Device(**{**GOOD, field: value})


def test_with_capacity_and_frozen():
    nvme = get_device("nvme_gen5")
    small = nvme.with_capacity(10**9)
    assert small.capacity_bytes == 10**9 and small.read_bytes_per_s == nvme.read_bytes_per_s
    assert nvme.capacity_bytes == 3_840 * 10**9
    with pytest.raises(ValueError, match="capacity_bytes must be >= 0, got -3"):
        nvme.with_capacity(-3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        nvme.latency_s = 0.0


def test_get_device_unknown_lists_names():
    with pytest.raises(ValueError, match="unknown device 'floppy'; known: .*opal_cpu_memory"):
        get_device("floppy")


# --- models --------------------------------------------------------------------------------------

# engines.md §8.2, bytes/token (bf16).
TABLE_BYTES_PER_TOKEN = {
    "Llama-3.2-1B": 32 * KIB, "Llama-3.2-3B": 112 * KIB, "Llama-3-8B": 131_072, "Llama-3.1-8B": 131_072,
    "Mistral-7B": 131_072, "Mixtral-8x7B": 131_072, "Llama-2-7B": 512 * KIB, "Llama-2-13B": 800 * KIB,
    "Llama-3-70B": 327_680, "Llama-3.1-70B": 327_680, "Qwen2.5-72B": 327_680, "Llama-3.1-405B": 504 * KIB,
    "Qwen2.5-7B": 56 * KIB, "Qwen3-8B": 144 * KIB, "Qwen3-32B": 256 * KIB, "Qwen3-30B-A3B": 96 * KIB,
    "Qwen3-235B-A22B": 188 * KIB, "Gemma-2-9B": 336 * KIB, "gpt-oss-120b": 72 * KIB, "DeepSeek-V3": 70_272,
    "DeepSeek-R1": 70_272,
}


def test_every_table_row_bytes_per_token():
    assert set(MODELS) == set(TABLE_BYTES_PER_TOKEN)
    for name, expected in TABLE_BYTES_PER_TOKEN.items():
        assert get_model(name).kv_bytes_per_token == expected, name
    ds = get_model("DeepSeek-V3")
    assert ds.is_mla and ds.kv_bytes_per_token / KIB == pytest.approx(68.6, abs=0.05)  # "~68.6 KiB"


@pytest.mark.parametrize(("block_tokens", "mib_8b", "mib_70b"), [(16, 2, 5), (256, 32, 80), (512, 64, 160)])
def test_unit_sizes(block_tokens, mib_8b, mib_70b):
    # vLLM block, LMCache chunk, Mooncake trace block (end of engines.md §8.2).
    assert get_model("Llama-3-8B").kv_bytes_per_block(block_tokens) == mib_8b * MIB
    assert get_model("Llama-3-70B").kv_bytes_per_block(block_tokens) == mib_70b * MIB


def test_capacity_in_blocks_and_tokens():
    m = get_model("Llama-3-70B")
    # Mooncake FAST'25: ~1 TB of DRAM holds ~3 M tokens of LLaMA3-70B.
    assert m.tokens_for_bytes(10**12) == 10**12 // 327_680 == 3_051_757
    assert m.blocks_for_bytes(80 * 10**9, 16) == 80 * 10**9 // (5 * MIB) == 15_258
    assert m.tokens_for_bytes(80 * 10**9, 16) == 15_258 * 16
    with pytest.raises(ValueError, match="block_size must be >= 1, got 0"):
        m.blocks_for_bytes(10**9, 0)
    with pytest.raises(ValueError, match="capacity_bytes must be >= 0, got -1"):
        m.tokens_for_bytes(-1)


def test_prefill_flops_formula():
    m = get_model("Llama-3-8B")
    assert m.attention_dim == 4096 and m.gqa == 4
    n, ctx = 1000, 3000
    expected = 2 * 8.03e9 * n + 4 * 32 * 4096 * n * (ctx + n / 2)
    assert m.prefill_flops(n, ctx) == pytest.approx(expected, rel=1e-12)
    assert m.prefill_flops(0) == 0.0
    assert get_model("Qwen3-32B").attention_dim == 8192  # not hidden_size 5120
    moe = get_model("Qwen3-30B-A3B")
    assert moe.prefill_flops(1, 0) == pytest.approx(2 * 3.3e9 + 2 * 48 * 4096 * 1)
    with pytest.raises(ValueError, match="context_tokens must be >= 0, got -1"):
        m.prefill_flops(10, -1)


BASE = {"name": "m", "layers": 2, "kv_heads": 2, "q_heads": 4, "head_dim": 8, "hidden_size": 32, "num_params": 1e6}


@pytest.mark.parametrize(("changes", "message"), [
    ({"layers": 0}, "layers must be >= 1, got 0"),
    ({"kv_heads": 2.0}, "kv_heads must be an int, got 2.0"),
    ({"q_heads": 3}, "q_heads must be a multiple of kv_heads=2, got 3"),
    ({"bytes_per_elem": 0}, "bytes_per_elem must be >= 1, got 0"),
    ({"num_params": -1}, "num_params must be > 0, got -1"),
    ({"num_active_params": 2e6}, "num_active_params must be <= num_params=1000000.0, got 2000000.0"),
    ({"kv_lora_rank": 512}, "kv_lora_rank and rope_dim must be given together"),
    ({"kv_lora_rank": 0, "rope_dim": 64}, "kv_lora_rank must be >= 1, got 0"),
])
def test_model_validation(changes, message):
    with pytest.raises(ValueError, match=message):
        ModelSpec(**{**BASE, **changes})


def test_model_defaults_and_fp8():
    m = ModelSpec(**BASE)
    assert m.num_active_params == 1e6 and m.bytes_per_elem == 2
    fp8 = dataclasses.replace(get_model("DeepSeek-V3"), bytes_per_elem=1)
    assert fp8.kv_bytes_per_token == 35_136  # "FP8 cache ~34 KiB"


def test_gpu_presets():
    assert GPU_FLOPS["H100-SXM"] == 989.5e12 and get_gpu_flops("h800") == 989.5e12
    assert get_gpu_flops("A100") == get_gpu_flops("A800") == 312e12
    assert get_gpu_flops("H20") == 148e12 and get_gpu_flops("B200") == 2.25e15
    with pytest.raises(ValueError, match="unknown GPU 'V100'; known: .*H100-SXM"):
        get_gpu_flops("V100")
    with pytest.raises(ValueError, match="unknown model 'gpt-5'; known: "):
        get_model("gpt-5")


# --- cost ----------------------------------------------------------------------------------------

def test_fetch_and_offload_time():
    cpu, pcie = get_device("host_dram_ddr5_4800_8ch"), get_device("pcie_gen4_x16")
    block = 2 * MIB
    tier = 100e-9 + 10 * block / 307.2e9
    link = 10 * 2.3e-6 + 10 * block / 25e9  # concurrency 1: one latency per copy
    assert fetch_time_s(10, block, cpu) == pytest.approx(tier)
    assert fetch_time_s(10, block, cpu, link=pcie) == pytest.approx(tier + link)
    assert offload_time_s(10, block, cpu, link=pcie) == pytest.approx(tier + link)
    assert fetch_time_s(0, block, cpu, pcie) == 0.0
    with pytest.raises(ValueError, match="num_blocks must be >= 0, got -1"):
        fetch_time_s(-1, block, cpu)
    with pytest.raises(ValueError, match="link must be a Device or None, got 'pcie'"):
        fetch_time_s(1, block, cpu, "pcie")


def test_recompute_time():
    m = get_model("Llama-3-70B")
    assert recompute_time_s(512, m, 8 * 312e12, context_tokens=1024) == pytest.approx(
        m.prefill_flops(512, 1024) / (8 * 312e12 * 0.5))
    assert recompute_time_s(512, m, 1e15, mfu=1.0) == pytest.approx(m.prefill_flops(512) / 1e15)
    for mfu, message in ((0, "mfu must be > 0, got 0"), (1.5, r"mfu must be in \(0, 1\], got 1.5")):
        with pytest.raises(ValueError, match=message):
            recompute_time_s(1, m, 1e15, mfu=mfu)
    with pytest.raises(ValueError, match="gpu_flops must be > 0, got 0"):
        recompute_time_s(1, m, 0)
    with pytest.raises(ValueError, match="model must be a ModelSpec, got 'Llama-3-70B'"):
        recompute_time_s(1, "Llama-3-70B", 1e15)


def test_load_or_recompute():
    m, gpu = get_model("Llama-3-8B"), 989.5e12
    fast = load_or_recompute(32, 16, m, get_device("opal_cpu_memory"), gpu)
    assert fast.decision == "load" and fast.saved_s == pytest.approx(fast.recompute_s - fast.fetch_s)
    assert fast.fetch_s == pytest.approx(fetch_time_s(32, 2 * MIB, get_device("opal_cpu_memory")))
    assert fast.recompute_s == pytest.approx(recompute_time_s(512, m, gpu))
    slow_dev = Device("tape", capacity_bytes=0, read_bytes_per_s=1e6, write_bytes_per_s=1e6, latency_s=1.0,
                      concurrency=1)
    slow = load_or_recompute(32, 16, m, slow_dev, gpu)
    assert slow.decision == "recompute" and slow.saved_s == 0.0
    assert load_or_recompute(0, 16, m, slow_dev, gpu) == LoadOrRecompute(0.0, 0.0, "recompute", 0.0)
    with pytest.raises(ValueError, match="block_size must be >= 1, got 0"):
        load_or_recompute(1, 0, m, slow_dev, gpu)


def test_mooncake_eq2_reproduces_paper():
    # FAST'25: LLaMA3-70B, p = 8192, G = aggregate of the 8-GPU prefill node (Table 1: 8 x 312 TFLOPS).
    m = get_model("Llama-3-70B")
    d, s, gqa, p, a, b = 8192, 2, 8, 8192, 4, 22
    literal = 2 * d * s / (gqa * (a * p * d + b * d * d))  # right-hand side of Eq. 2 = 1 / 425,984
    assert literal == 1 / 425_984
    a800 = mooncake_break_even_bandwidth(p, m, get_gpu_flops("A800"), num_gpus=8)
    h800 = mooncake_break_even_bandwidth(p, m, get_gpu_flops("H800"), num_gpus=8)
    assert a800 == pytest.approx(8 * 312e12 * literal, rel=1e-12)  # 5.859 GB/s
    assert h800 == pytest.approx(8 * 989.5e12 * literal, rel=1e-12)  # 18.58 GB/s
    # The paper's "~6 GB/s" and "~19 GB/s" are these, rounded to whole GB/s (within 3 %).
    assert round(a800 / 1e9) == 6 and a800 == pytest.approx(6e9, rel=0.03)
    assert round(h800 / 1e9) == 19 and h800 == pytest.approx(19e9, rel=0.03)
    # A single GPU's G would give 8x less: the paper's numbers need the node aggregate.
    assert mooncake_break_even_bandwidth(p, m, 312e12) == pytest.approx(a800 / 8)


def test_mooncake_eq2_is_eq1_break_even():
    # At the break-even bandwidth, moving the prefix's KV takes exactly its Eq. 1 compute time.
    m, p, g = get_model("Llama-3-70B"), 4096, 8 * 989.5e12
    bandwidth = mooncake_break_even_bandwidth(p, m, g)
    assert p * m.kv_bytes_per_token / bandwidth == pytest.approx(mooncake_prefill_flops(p, m) / g, rel=1e-12)
    assert mooncake_prefill_flops(p, m) == 80 * (4 * p * p * 8192 + 22 * p * 8192**2)
    # Longer prefixes make recompute (quadratic) costlier, so the needed bandwidth drops.
    assert mooncake_break_even_bandwidth(32768, m, g) < bandwidth
    # MLA uses its latent cache size (70,272 B/token), not 2·d·s/gqa.
    ds = get_model("DeepSeek-V3")
    assert mooncake_break_even_bandwidth(p, ds, g) == pytest.approx(
        g * 70_272 / (61 * (4 * p * 7168 + 22 * 7168**2)))
    with pytest.raises(ValueError, match="p_tokens must be >= 1, got 0"):
        mooncake_break_even_bandwidth(0, m, g)
    with pytest.raises(ValueError, match="num_gpus must be >= 1, got 0"):
        mooncake_break_even_bandwidth(8192, m, g, num_gpus=0)


def test_tokens_to_load_lmcache_connector():
    assert tokens_to_load(52 * 16, 3 * 256) == 0  # 832 local tokens vs 768 in the 256-token tier
    assert tokens_to_load(32 * 16, 3 * 256) == 256
    assert tokens_to_load(0, 0) == 0
    assert tokens_to_load(256, 1024, prompt_tokens=1024) == 767  # whole-prompt hit: last token recomputed
    assert tokens_to_load(256, 1024, prompt_tokens=1025) == 768
    with pytest.raises(ValueError, match="local_hit_tokens must be >= 0, got -16"):
        tokens_to_load(-16, 0)
    with pytest.raises(ValueError, match="tier_hit_tokens must be <= prompt_tokens=100, got 256"):
        tokens_to_load(0, 256, prompt_tokens=100)


def test_ttft_saved_sums_tiers_in_prefix_order():
    m, gpu, bs = get_model("Llama-3-8B"), 989.5e12, 256
    dram, nvme, pcie = get_device("host_dram_ddr5_4800_8ch"), get_device("nvme_gen4"), get_device("pcie_gen5_x16")
    first = load_or_recompute(4, bs, m, dram, gpu, link=pcie)
    second = load_or_recompute(6, bs, m, nvme, gpu, link=pcie, context_tokens=4 * bs)
    hits = [TierHit(dram, 4, pcie), TierHit(nvme, 6, pcie)]
    assert ttft_saved_s(hits, bs, m, gpu) == pytest.approx(first.saved_s + second.saved_s)
    assert ttft_saved_s([(dram, 4, pcie), (nvme, 6, pcie)], bs, m, gpu) == ttft_saved_s(hits, bs, m, gpu)
    tape = Device("tape", capacity_bytes=0, read_bytes_per_s=1e6, write_bytes_per_s=1e6, latency_s=1.0,
                  concurrency=1)
    # A tier slower than recomputing saves nothing, but its blocks still count as context.
    assert ttft_saved_s([(tape, 4), (nvme, 6, pcie)], bs, m, gpu) == pytest.approx(second.saved_s)
    assert ttft_saved_s([], bs, m, gpu) == 0.0
    with pytest.raises(ValueError, match=r"hits\[0\] must be a TierHit"):
        ttft_saved_s([dram], bs, m, gpu)
    with pytest.raises(ValueError, match="num_blocks must be >= 0, got -1"):
        ttft_saved_s([(dram, -1)], bs, m, gpu)
