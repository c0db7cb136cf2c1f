"""kvlab.sim.cluster step-time models: exact values from cluster_sim.md §6.5 (rules C10, C11, C12).

Every expected value is written out from the spec's formula with the model's literal numbers
(Llama-3.1-8B: 8.03e9 parameters, 32 layers, 32 query heads × 128 = attention dim 4096, 8 KV
heads → 2·32·8·128·2 = 131,072 KV bytes per token, BF16 weights) and the GPU datasheets
(H100 SXM: 989.5e12 FLOP/s, 3.35e12 B/s).
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.sim.cluster import Linear, MooncakePrefill, ProfileTable, Roofline, StepBatch, StepTime, ZeroTime
from kvlab.tiers import GPU_FLOPS, GPU_HBM_BYTES_PER_S, get_gpu_hbm_bytes_per_s, get_model

P = 8.03e9  # Llama-3.1-8B parameters
LAYERS = 32
ATTN = 32 * 128  # q_heads × head_dim
KV_TOKEN = 2 * 32 * 8 * 128 * 2  # bytes per token: K and V × layers × kv_heads × head_dim × BF16
W = P * 2  # weight bytes, BF16
G = 989.5e12  # H100 SXM dense BF16 FLOP/s
H = 3.35e12  # H100 SXM HBM bytes/s
FIXED = 0.13e-3 + 32e-6 * LAYERS  # t_step + t_layer · L
T_REQ = 4e-6


def flops(n, c):
    """ModelSpec.prefill_flops written out: 2·P·n + 2·2·L·attn·n·(c + n/2)."""
    return 2 * P * n + 2 * 2 * LAYERS * ATTN * n * (c + n / 2)


def e1(x, layers=LAYERS, d=4096):
    """Mooncake FAST'25 Eq. 1 with a = 4, b = 22."""
    return layers * (4 * x * x * d + 22 * x * d * d)


# --- presets -------------------------------------------------------------------------------------

def test_hbm_presets():
    assert get_gpu_hbm_bytes_per_s("H100-SXM") == get_gpu_hbm_bytes_per_s("h800") == 3.35e12
    assert get_gpu_hbm_bytes_per_s("H200") == 4.8e12 and get_gpu_hbm_bytes_per_s("B200") == 8e12
    assert get_gpu_hbm_bytes_per_s("A100") == get_gpu_hbm_bytes_per_s("A800") == 2.039e12
    assert get_gpu_hbm_bytes_per_s("H20") == 4.0e12
    assert set(GPU_HBM_BYTES_PER_S) == set(GPU_FLOPS)  # every compute preset has a bandwidth
    with pytest.raises(ValueError, match="unknown GPU 'V100'; known: .*H100-SXM"):
        get_gpu_hbm_bytes_per_s("V100")


# --- Roofline (C10, C12) -------------------------------------------------------------------------

def test_roofline_single_prefill_is_compute_bound():
    t = Roofline(model="Llama-3.1-8B", gpu="H100-SXM").step_time(StepBatch(prefill=[(1000, 0)]))
    compute = (2 * 8.03e9 * 1000 + 4 * 32 * 4096 * 1000 * (0 + 500)) / (989.5e12 * 0.45)
    memory = (8.03e9 * 2 + 1000 * 131072) / 3.35e12  # W charged to prefill: no decode in the step
    assert compute > memory
    expected = compute + 0.13e-3 + 32 * 32e-6 + 4e-6
    assert t.step_s == pytest.approx(expected, rel=1e-12)  # ≈ 37.81 ms
    assert t.step_s == pytest.approx(0.0378142, rel=1e-5)
    assert t.prefill_s == t.step_s  # a prefill-only step is all prefill


def test_roofline_decode_batch_is_memory_bound():
    t = Roofline(model="Llama-3.1-8B", gpu="H100-SXM").step_time(StepBatch(decode=[2000] * 8))
    compute = 8 * (2 * 8.03e9 + 4 * 32 * 4096 * (2000 + 0.5)) / (989.5e12 * 0.30)
    memory = (8.03e9 * 2 + 8 * (2000 + 1) * 131072) / 3.35e12
    assert memory > 10 * compute
    assert t.step_s == pytest.approx(memory + FIXED + 8 * T_REQ, rel=1e-12)  # ≈ 6.606 ms
    assert t.prefill_s == 0.0


def test_roofline_mixed_step_charges_weights_to_decode():
    batch = StepBatch(prefill=[(512, 1024)], decode=[3000] * 4)
    t = Roofline(model=get_model("Llama-3.1-8B"), gpu="H100-SXM").step_time(batch)
    pf = max(flops(512, 1024) / (G * 0.45), (1024 + 512) * KV_TOKEN / H)
    dc = max(4 * flops(1, 3000) / (G * 0.30), (W + 4 * 3001 * KV_TOKEN) / H)
    assert t.step_s == pytest.approx(pf + dc + FIXED + 5 * T_REQ, rel=1e-12)
    assert t.prefill_s == pytest.approx(pf + T_REQ + FIXED * 1 / 5, rel=1e-12)  # C12: 1 of 5 requests
    # a short chunk beside decodes: compute-bound without W, which goes to the decode phase only
    small = Roofline().step_time(StepBatch(prefill=[(16, 4000)], decode=[3000] * 4))
    pf = flops(16, 4000) / (G * 0.45)
    assert pf > 4016 * KV_TOKEN / H and (W + 4016 * KV_TOKEN) / H > pf  # W would flip it to memory-bound
    assert small.step_s == pytest.approx(pf + dc + FIXED + 5 * T_REQ, rel=1e-12)
    # a one-token prefill alone reads the weights: memory-bound, W on the prefill phase
    tiny = Roofline().step_time(StepBatch(prefill=[(1, 0)]))
    assert tiny.step_s == pytest.approx((W + KV_TOKEN) / H + FIXED + T_REQ, rel=1e-12)


def test_roofline_options():
    batch = StepBatch(prefill=[(2048, 0)], decode=[1000] * 32)
    bare = dict(t_step_s=0.0, t_layer_s=0.0, t_req_s=0.0)
    one = Roofline(**bare).step_time(batch)
    assert Roofline(tp=4, **bare).step_time(batch).step_s == pytest.approx(one.step_s / 4, rel=1e-12)
    assert Roofline(gpu=(989.5e12, 3.35e12), **bare).step_time(batch) == one
    fp8 = Roofline(bytes_per_elem=1, **bare).step_time(StepBatch(decode=[100]))
    assert fp8.step_s == pytest.approx((8.03e9 + 101 * KV_TOKEN) / H, rel=1e-12)
    slow = Roofline(eta=0.5, **bare).step_time(StepBatch(decode=[100]))
    assert slow.step_s == pytest.approx((W + 101 * KV_TOKEN) / (H * 0.5), rel=1e-12)
    h200 = Roofline(gpu="H200", **bare).step_time(StepBatch(decode=[100]))
    assert h200.step_s == pytest.approx((W + 101 * KV_TOKEN) / 4.8e12, rel=1e-12)


# --- Mooncake (C11) ------------------------------------------------------------------------------

def test_mooncake_prefill_eq1_and_memory_bound_decode():
    m = MooncakePrefill(model="Llama-3.1-8B", gpu="H100-SXM")
    t = m.step_time(StepBatch(prefill=[(1000, 500)]))
    assert t.step_s == t.prefill_s == pytest.approx((e1(1500) - e1(500)) / (989.5e12 * 0.45), rel=1e-12)
    assert t.step_s == pytest.approx(0.0288804, rel=1e-5)
    mixed = m.step_time(StepBatch(prefill=[(1000, 500), (300, 0)], decode=[2000] * 8))
    pf = (e1(1500) - e1(500) + e1(300)) / (989.5e12 * 0.45)
    dc = (8.03e9 * 2 + 8 * 2001 * 131072) / 3.35e12
    assert mixed == (pytest.approx(pf + dc, rel=1e-12), pytest.approx(pf, rel=1e-12))
    # Mooncake's own setting: Llama-3-70B (80 layers, d = 8192) on 8 × A800, mfu 0.5
    big = MooncakePrefill(model="Llama-3-70B", gpu="A800", tp=8, mfu=0.5).step_time(StepBatch(prefill=[(8192, 0)]))
    assert big.step_s == pytest.approx(e1(8192, layers=80, d=8192) / (8 * 312e12 * 0.5), rel=1e-12)


# --- Linear, ZeroTime, empty batches --------------------------------------------------------------

def test_linear_and_zero():
    batch = StepBatch(prefill=[(100, 0), (50, 200)], decode=[10, 20, 30])
    t = Linear(beta0=2e-3, beta1=3e-5, beta2=1e-4).step_time(batch)
    assert t.step_s == pytest.approx(2e-3 + 3e-5 * 150 + 1e-4 * 3, rel=1e-12)
    assert t.prefill_s == pytest.approx(3e-5 * 150 + 2e-3 * 2 / 5, rel=1e-12)
    assert ZeroTime().step_time(batch) == StepTime(0.0, 0.0)
    for model in (Roofline(), MooncakePrefill(), Linear(beta0=1.0), ZeroTime()):
        assert model.step_time(StepBatch()) == (0.0, 0.0)


# --- ProfileTable ---------------------------------------------------------------------------------

PF_TOKENS = [0, 256, 1024, 4096]
PF_S = [0.0, 0.011, 0.037, 0.16]
TOTAL = [2000, 4000, 8000]
MEAN = [1000, 2000]
DC_S = [[0.0051, 0.0057], [0.0063, 0.0071], [0.0089, 0.0103]]


def table():
    return ProfileTable(prefill_tokens=PF_TOKENS, prefill_s=PF_S, decode_total_context=TOTAL,
                        decode_mean_context=MEAN, decode_s=DC_S)


def test_profile_table_exact_at_grid_points():
    tab = table()
    for n, s in zip(PF_TOKENS[1:], PF_S[1:]):
        assert tab.step_time(StepBatch(prefill=[(n, 7)])) == (s, s)
    for i, total in enumerate(TOTAL):
        for j, mean in enumerate(MEAN):
            assert tab.step_time(StepBatch(decode=[mean] * (total // mean))) == (DC_S[i][j], 0.0)


def test_profile_table_interpolates():
    tab = table()
    # prefill 640 = midway 256..1024; two chunks sum their new tokens
    t = tab.step_time(StepBatch(prefill=[(600, 0), (40, 600)], decode=[1500] * 4))
    pf = 0.011 + 0.5 * (0.037 - 0.011)
    dc = 0.25 * (0.0063 + 0.0071 + 0.0089 + 0.0103)  # Σ = 6000, mean 1500: centre of the cell
    assert t.step_s == pytest.approx(pf + dc, rel=1e-12) and t.prefill_s == pytest.approx(pf, rel=1e-12)
    with pytest.raises(ValueError, match="batch new tokens 5000 is outside the profile's range"):
        tab.step_time(StepBatch(prefill=[(5000, 0)]))
    with pytest.raises(ValueError, match="decode total context 1000 is outside"):
        tab.step_time(StepBatch(decode=[1000]))


def test_profile_table_rejects_malformed():
    good = dict(prefill_tokens=PF_TOKENS, prefill_s=PF_S, decode_total_context=TOTAL,
                decode_mean_context=MEAN, decode_s=DC_S)
    cases = {
        "prefill_tokens must be finite, >= 0 and strictly increasing": dict(prefill_tokens=[0, 256, 256, 4096]),
        "prefill_tokens must be a 1-D array of at least 2": dict(prefill_tokens=[5], prefill_s=[0.1]),
        r"prefill_s must be a numeric array of shape \(4,\)": dict(prefill_s=[0.0, 0.1]),
        "prefill_s must hold finite seconds >= 0": dict(prefill_s=[0.0, -0.1, 0.2, 0.3]),
        r"decode_s must be a numeric array of shape \(3, 2\)": dict(decode_s=[[0.1, 0.2]]),
        "decode_mean_context must be finite": dict(decode_mean_context=[-1, 2000]),
        "decode_s must hold finite seconds": dict(decode_s=[[0.1, np.nan], [0.1, 0.2], [0.3, 0.4]]),
    }
    for message, change in cases.items():
        with pytest.raises(ValueError, match=message):
            ProfileTable(**{**good, **change})


# --- properties -----------------------------------------------------------------------------------

chunks = st.lists(st.tuples(st.integers(1, 4096), st.integers(0, 8192)), max_size=5)
decodes = st.lists(st.integers(1, 16384), max_size=12)
MODELS = [Roofline(), Roofline(model="Qwen3-30B-A3B", gpu="H20", tp=2), MooncakePrefill(),
          Linear(beta0=1e-3, beta1=2e-5, beta2=3e-4)]


@settings(max_examples=150, deadline=None)
@given(chunks, decodes, st.integers(0, 3), st.integers(0, 10**6), st.sampled_from(MODELS))
def test_more_tokens_never_take_less_time(pf, dc, kind, pick, model):
    before = model.step_time(StepBatch(prefill=pf, decode=dc))
    assert 0.0 <= before.prefill_s <= before.step_s
    pf2, dc2 = list(pf), list(dc)
    if kind == 0 and pf2:  # one more new token in a chunk
        n, c = pf2[pick % len(pf2)]
        pf2[pick % len(pf2)] = (n + 1, c)
    elif kind == 1 and dc2:  # a longer decode context
        dc2[pick % len(dc2)] += 1
    elif kind == 2:  # one more prefill chunk
        pf2.append((1 + pick % 4096, pick % 8192))
    else:  # one more decode
        dc2.append(1 + pick % 16384)
    after = model.step_time(StepBatch(prefill=pf2, decode=dc2))
    assert after.step_s >= before.step_s * (1 - 1e-12)
    assert 0.0 <= after.prefill_s <= after.step_s


# --- bad configuration ----------------------------------------------------------------------------

@pytest.mark.parametrize(("make", "message"), [
    (lambda: Roofline(mfu_pf=-0.1), "mfu_pf must be a finite number in \\(0.0, 1.0\\], got -0.1"),
    (lambda: Roofline(mfu_dc=1.5), "mfu_dc must be .* got 1.5"),
    (lambda: Roofline(eta=0), "eta must be .* got 0"),
    (lambda: Roofline(gpu="V100"), "unknown GPU 'V100'"),
    (lambda: Roofline(gpu=(0.0, 3e12)), "gpu flops must be .* got 0.0"),
    (lambda: Roofline(gpu=3e12), "gpu must be a GPU name or a \\(flops, hbm_bytes_per_s\\) pair"),
    (lambda: Roofline(model="gpt-5"), "unknown model 'gpt-5'"),
    (lambda: Roofline(model=7), "model must be a ModelSpec or a model name, got 7"),
    (lambda: Roofline(tp=0), "tp must be an integer >= 1, got 0"),
    (lambda: Roofline(bytes_per_elem=0), "bytes_per_elem must be an integer >= 1 or None, got 0"),
    (lambda: Roofline(t_step_s=-1e-3), "t_step_s must be a finite number >= 0.0, got -0.001"),
    (lambda: MooncakePrefill(mfu=2.0), "mfu must be .* got 2.0"),
    (lambda: MooncakePrefill(a=0), "a must be .* got 0"),
    (lambda: Linear(beta1=-1e-5), "beta1 must be a finite number >= 0.0, got -1e-05"),
    (lambda: StepBatch(prefill=[(0, 5)]), "prefill new_tokens must hold integers >= 1, got 0"),
    (lambda: StepBatch(prefill=[(5, -1)]), "prefill context_tokens must hold integers >= 0, got -1"),
    (lambda: StepBatch(prefill=[1, 2, 3]), "prefill must be \\(new_tokens, context_tokens\\) pairs"),
    (lambda: StepBatch(decode=[0]), "decode must hold integers >= 1, got 0"),
    (lambda: StepBatch(decode=[1.5]), "decode must be a 1-D sequence of integers"),
    (lambda: Roofline().step_time([(10, 0)]), "batch must be a StepBatch"),
])
def test_bad_configuration_names_field(make, message):
    with pytest.raises(ValueError, match=message):
        make()
