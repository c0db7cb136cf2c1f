"""vidur (PyPI ``vidur``, MLSys'24) as the speed anchor of ``bench_cluster``: same arrivals, same lengths.

vidur never enters kvlab's venv: :func:`ensure_vidur_venv` installs it into a scratch venv
(``/tmp/vidur-venv``) and :func:`run_vidur` runs it there in a child process, timing the child's
CPU (``RUSAGE_CHILDREN``) and wall clock, and, inside the child, the event loop alone.

vidur 0.0.26 downloads its GPU profiles from Hugging Face datasets at run time
(``project-vajra/dev-staging-*``), which this machine cannot reach. :func:`prepare_profiles`
builds the four files it reads instead (see ``benchmarks/README.md``, "vidur anchor"):

* ``mlp.csv.xz`` — vidur's own A100 profile of Meta-Llama-3-8B (every non-attention operator),
  taken from the ``microsoft/vidur`` repository snapshot (``data/profiling/compute/a100/…``);
* ``all_reduce.csv.xz`` / ``send_recv.csv.xz`` — the same repository's ``a100_dgx`` network
  profiles (unused at TP = PP = 1, read all the same);
* ``attention.csv.xz`` — **synthesised** here (:func:`synth_attention_rows`): the repository's
  9.1 MB A100 attention profile is stored only where this machine cannot fetch it (Git LFS /
  files over 4 MiB), so attention is a roofline on A100 numbers instead.

Run ``python benchmarks/vidur_anchor.py`` (kvlab's venv is fine: only the standard library is
imported here) to print, as JSON, vidur on 16 replicas over the whole trace and over its first
2,000 rows. Not part of ``make test``.
"""

from __future__ import annotations

import csv
import json
import lzma
import math
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

VIDUR_VERSION = "0.0.26"
VENV = Path("/tmp/vidur-venv")
WORK = Path("/tmp/vidur-work")
TRACE = Path(__file__).resolve().parents[2] / "shared/data/traces/vidur-splitwise/splitwise_conv.csv"
if not TRACE.exists():  # a worktree under /work/wt/<name>: shared/ sits beside /work/main
    TRACE = Path("/work/shared/data/traces/vidur-splitwise/splitwise_conv.csv")
#: A snapshot of github.com/microsoft/vidur (the search tool's ``fetch``), for the profiles.
VIDUR_REPO = Path("/work/.mirror/microsoft+vidur/repo")
PROFILE_FILES = {
    "mlp.csv.xz": "data/profiling/compute/a100/meta-llama/Meta-Llama-3-8B/mlp.csv",
    "all_reduce.csv.xz": "data/profiling/network/a100_dgx/all_reduce.csv",
    "send_recv.csv.xz": "data/profiling/network/a100_dgx/send_recv.csv",
}

# Meta-Llama-3-8B (vidur's Llama38BModelConfig) and one A100-80GB SXM.
_Q_HEADS, _KV_HEADS, _HEAD_DIM, _EMBD = 32, 8, 128, 4096
_A100_FLOPS, _A100_HBM = 312e12, 2.039e12  # dense BF16 FLOP/s, HBM bytes/s (NVIDIA A100 datasheet)


def ensure_vidur_venv(venv: Path = VENV, version: str = VIDUR_VERSION) -> Path:
    """Create ``venv`` and ``pip install vidur==version`` there unless it already imports; returns its python."""
    python = venv / "bin" / "python"
    if python.exists() and _run([str(python), "-c", "import vidur"]).returncode == 0:
        return python
    if not python.exists():
        res = _run([sys.executable, "-m", "venv", str(venv)])
        if res.returncode != 0:
            raise RuntimeError(f"vidur unavailable: `python -m venv {venv}` failed: {res.stderr.strip()[-2000:]}")
    res = _run([str(python), "-m", "pip", "install", "-q", f"vidur=={version}"])
    if res.returncode != 0:
        raise RuntimeError(f"vidur unavailable: `pip install vidur=={version}` failed: {res.stderr.strip()[-2000:]}")
    return python


def synth_attention_rows() -> list[dict]:
    """Attention rows in vidur's ``attention.csv`` layout (ms per layer, TP 1, block 16) from a roofline.

    prefill (batch 1, chunk ``c`` after ``k`` cached tokens): 10 µs + ``4·c·(k + (c+1)/2)·h·d`` FLOPs at
    45 % of 312 TFLOP/s; decode (``b`` requests, ``k`` tokens each): 10 µs + ``b·k·2·kv_heads·d·2`` bytes at
    70 % of 2.039 TB/s; KV save: 19 µs + 4 KiB per token at 50 %. Constants: vidur's first A100 rows
    (19 µs KV save, ~11 µs smallest prefill) and BLIS's prefill MFU.
    """
    kv_bytes_per_token = 2 * _KV_HEADS * _HEAD_DIM * 2
    base = {"n_embd": _EMBD, "n_q_head": _Q_HEADS, "n_kv_head": _KV_HEADS, "block_size": 16,
            "num_tensor_parallel_workers": 1, "max_model_len": 16384}
    def save_ms(tokens: int) -> float:
        return 0.019 + tokens * kv_bytes_per_token / (_A100_HBM * 0.5) * 1e3

    rows = []
    kvs = list(range(0, 8193, 128))
    for c in sorted({*range(32, 4097, 32)}):
        for k in kvs:
            if c + k > 8192:
                continue
            flops = 4.0 * c * (k + (c + 1) / 2) * _Q_HEADS * _HEAD_DIM
            rows.append({**base, "batch_size": 1, "prefill_chunk_size": c, "kv_cache_size": k, "is_prefill": True,
                         "time_stats.attn_prefill.median": 0.010 + flops / (_A100_FLOPS * 0.45) * 1e3,
                         "time_stats.attn_decode.median": 0.0,
                         "time_stats.attn_kv_cache_save.median": save_ms(c)})
    for b in [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 80, 96, 112, 128]:
        for k in kvs[1:]:
            nbytes = float(b) * k * kv_bytes_per_token
            rows.append({**base, "batch_size": b, "prefill_chunk_size": 0, "kv_cache_size": k, "is_prefill": False,
                         "time_stats.attn_prefill.median": 0.0,
                         "time_stats.attn_decode.median": 0.010 + nbytes / (_A100_HBM * 0.7) * 1e3,
                         "time_stats.attn_kv_cache_save.median": save_ms(b)})
    return rows


def prepare_profiles(work: Path = WORK, repo: Path = VIDUR_REPO) -> Path:
    """Write the compute and network profile folders vidur reads; returns their parent."""
    prof = work / "profiles"
    compute, network = prof / "compute", prof / "network"
    if (compute / "attention.csv.xz").exists() and (network / "send_recv.csv.xz").exists():
        return prof
    compute.mkdir(parents=True, exist_ok=True)
    network.mkdir(parents=True, exist_ok=True)
    for name, path in PROFILE_FILES.items():
        if not repo.exists():
            raise RuntimeError(f"vidur unavailable: its profiles come from Hugging Face datasets, unreachable here, "
                               f"and no snapshot of github.com/microsoft/vidur is at {repo} to take {path} from")
        res = subprocess.run(["git", "--git-dir", str(repo), "show", f"HEAD:{path}"], capture_output=True)
        if res.returncode != 0:
            raise RuntimeError(f"vidur unavailable: {path} is missing from {repo}: {res.stderr.decode().strip()}")
        dest = (compute if name == "mlp.csv.xz" else network) / name
        dest.write_bytes(lzma.compress(res.stdout))
    rows = synth_attention_rows()
    with lzma.open(compute / "attention.csv.xz", "wt", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return prof


def write_vidur_trace(csv_path: Path, out: Path, num_requests: int | None = None) -> int:
    """Copy ``arrived_at,num_prefill_tokens,num_decode_tokens`` rows into vidur 0.0.26's trace layout.

    Its trace-replay generator reads ``Date,Time,PromptTokenCount,CompletionTokenCount`` (the README's
    column names are of older releases). Returns the number of rows written.
    """
    n = 0
    with open(csv_path, newline="") as src, open(out, "w", newline="") as dst:
        w = csv.writer(dst)
        w.writerow(["Date", "Time", "PromptTokenCount", "CompletionTokenCount"])
        for row in csv.DictReader(src):
            if num_requests is not None and n >= num_requests:
                break
            w.writerow(["2023-11-16", row["arrived_at"], row["num_prefill_tokens"], row["num_decode_tokens"]])
            n += 1
    return n


#: Runs inside vidur's venv: argv[1] is a JSON object {"argv": [...], "profiles": dir}.
_CHILD = r"""
import json, sys, time
t0, w0 = time.process_time(), time.perf_counter()
spec = json.loads(sys.argv[1])
import vidur
from vidur.execution_time_predictor import sklearn_execution_time_predictor as skl
P = spec["profiles"]
def _no_hf(self):
    raise RuntimeError("no Hugging Face predictions offline")
skl.SklearnExecutionTimePredictor._load_predictions_from_hf = _no_hf
skl.SklearnExecutionTimePredictor._get_input_files = lambda self: (
    f"{P}/compute/mlp.csv.xz", f"{P}/compute/attention.csv.xz",
    f"{P}/network/all_reduce.csv.xz", f"{P}/network/send_recv.csv.xz")
from vidur.config import SimulationConfig
from vidur.simulator import Simulator
from vidur.utils.random import set_seeds
sys.argv = ["vidur"] + spec["argv"]
config = SimulationConfig.create_from_cli_args()
set_seeds(config.seed)
t1, w1 = time.process_time(), time.perf_counter()
sim = Simulator(config)
write_output = sim._write_output
sim._write_output = lambda: None
t2, w2 = time.process_time(), time.perf_counter()
sim.run()
t3, w3 = time.process_time(), time.perf_counter()
write_output()
t4, w4 = time.process_time(), time.perf_counter()
events = None
print(json.dumps({"version": getattr(vidur, "__version__", None), "output_dir": config.metrics_config.output_dir,
                  "import_cpu_s": t1 - t0, "setup_cpu_s": t2 - t1, "loop_cpu_s": t3 - t2, "write_cpu_s": t4 - t3,
                  "setup_wall_s": w2 - w1, "loop_wall_s": w3 - w2, "simulated_s": sim._time}))
"""


def vidur_argv(trace: Path, *, num_replicas: int, max_tokens: int, model: str, device: str, network_device: str,
               out_dir: Path, cache_dir: Path) -> list[str]:
    """vidur's CLI flags for a trace replay on ``num_replicas`` one-GPU replicas with the vLLM scheduler."""
    flags = {
        "cluster_config_num_replicas": num_replicas,
        "replica_config_model_name": model,
        "replica_config_device": device,
        "replica_config_network_device": network_device,
        "replica_config_tensor_parallel_size": 1,
        "replica_config_num_pipeline_stages": 1,
        "global_scheduler_config_type": "round_robin",
        "replica_scheduler_config_type": "vllm",
        "vllm_scheduler_config_batch_size_cap": 128,
        "vllm_scheduler_config_max_tokens_in_batch": 4096,
        "request_generator_config_type": "trace_replay",
        "trace_request_generator_config_trace_file": trace,
        "trace_request_generator_config_date": "2023-11-16",
        "trace_request_generator_config_prefill_scale_factor": 1,
        "trace_request_generator_config_decode_scale_factor": 1,
        "trace_request_generator_config_time_scale_factor": 1,
        "trace_request_generator_config_max_tokens": max_tokens,
        "execution_time_predictor_config_type": "random_forrest",
        "random_forrest_execution_time_predictor_config_prediction_max_tokens_per_request": max_tokens,
        "random_forrest_execution_time_predictor_config_cache_dir": cache_dir,
        # One grid point and 3 folds: the one-off model fit (cached in cache_dir) fits this machine.
        "random_forrest_execution_time_predictor_config_num_estimators": 250,
        "random_forrest_execution_time_predictor_config_max_depth": 16,
        "random_forrest_execution_time_predictor_config_min_samples_split": 2,
        "random_forrest_execution_time_predictor_config_k_fold_cv_splits": 3,
        "metrics_config_output_dir": out_dir,
    }
    argv = []
    for key, value in flags.items():
        argv += [f"--{key}", str(value)]
    # Off: everything that writes big outputs or talks to wandb; on: per-request metrics (TTFT).
    for flag in ("metrics_config_enable_chrome_trace", "metrics_config_store_plots",
                 "metrics_config_store_batch_metrics", "metrics_config_store_utilization_metrics",
                 "metrics_config_write_json_trace", "metrics_config_store_operation_metrics",
                 "metrics_config_store_token_completion_metrics"):
        argv.append(f"--no-{flag}")
    return argv


def run_vidur(csv_path: Path | str = TRACE, *, num_replicas: int, num_requests: int | None = None,
              model: str = "meta-llama/Llama-3-8B", device: str = "a100", network_device: str = "a100_dgx",
              max_tokens: int = 4096, python: str = str(VENV / "bin" / "python"), work: Path = WORK,
              keep_output: bool = False) -> dict:
    """Run vidur on ``csv_path`` (arrived_at, num_prefill_tokens, num_decode_tokens) in a child process.

    Returns requests, child CPU and wall seconds, requests per CPU second (whole child and event loop
    alone), TTFT mean / p50 / p99 (vidur's ``prefill_e2e_time``), vidur's version and the config.
    Raises ``RuntimeError`` saying why when vidur is missing or fails.
    """
    if not Path(python).exists():
        raise RuntimeError(f"vidur unavailable: {python} does not exist (ensure_vidur_venv() installs it)")
    work.mkdir(parents=True, exist_ok=True)
    prof = prepare_profiles(work)
    tag = f"r{num_replicas}_n{num_requests or 'all'}"
    trace = work / f"trace_{tag}.csv"
    n = write_vidur_trace(Path(csv_path), trace, num_requests)
    out_dir = work / "out" / tag
    argv = vidur_argv(trace, num_replicas=num_replicas, max_tokens=max_tokens, model=model, device=device,
                      network_device=network_device, out_dir=out_dir, cache_dir=work / "cache")
    env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "PYTHONHASHSEED": "0"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    res = subprocess.run([python, "-c", _CHILD, json.dumps({"argv": argv, "profiles": str(prof)})],
                         capture_output=True, text=True, cwd=work, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if res.returncode != 0:
        raise RuntimeError(f"vidur failed (exit {res.returncode}): {res.stderr.strip()[-3000:]}")
    child = json.loads(res.stdout.strip().splitlines()[-1])
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    result = {"requests": n, "cpu_s": cpu, "wall_s": wall, "requests_per_cpu_s": n / cpu,
              "loop_cpu_s": child["loop_cpu_s"], "requests_per_loop_cpu_s": n / child["loop_cpu_s"],
              "setup_cpu_s": child["setup_cpu_s"], "import_cpu_s": child["import_cpu_s"],
              "write_cpu_s": child["write_cpu_s"], "simulated_s": child["simulated_s"],
              "version": child["version"] or VIDUR_VERSION}
    result.update(_ttft(Path(child["output_dir"]) / "request_metrics.csv", n))
    result["config"] = {"num_replicas": num_replicas, "model": model, "device": device,
                        "network_device": network_device, "max_tokens": max_tokens, "argv": argv}
    if not keep_output:
        shutil.rmtree(out_dir, ignore_errors=True)
    return result


def _ttft(path: Path, n: int) -> dict:
    """TTFT stats (s) and restarts from vidur's per-request metrics CSV, if it wrote one."""
    if not path.exists():
        return {}
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    ttft = sorted(float(r["prefill_e2e_time"]) for r in rows if r.get("prefill_e2e_time"))
    if len(ttft) != n:
        raise RuntimeError(f"vidur finished {len(ttft)} of {n} requests ({path})")
    restarts = sum(int(float(r.get("request_num_restarts") or 0)) for r in rows)

    def pct(q: float) -> float:  # nearest rank
        return ttft[max(0, math.ceil(q * len(ttft)) - 1)]

    return {"ttft_mean_s": sum(ttft) / len(ttft), "ttft_p50_s": pct(0.50), "ttft_p99_s": pct(0.99),
            "restarts": restarts}


def main() -> None:
    ensure_vidur_venv()
    out = {}
    # The first run also fits vidur's random-forest step-time models (cached in WORK/cache): warm up.
    run_vidur(TRACE, num_replicas=16, num_requests=200)
    for label, n in (("first_2000", 2000), ("all", None)):
        out[label] = run_vidur(TRACE, num_replicas=16, num_requests=n)
    out["loadavg"] = Path("/proc/loadavg").read_text().split()[:3]
    print(json.dumps(out, indent=2))


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True)


if __name__ == "__main__":
    main()
