"""Warm start: CPU time of a first ``kvlab replay conversation --capacity-blocks 10000`` process
with an empty kernel cache (the anchor: what every process paid before issue 17 item 5) beside a
second process that loads the kernels from the cache (``kvlab.core.jit``).

Per policy (LRU, S3-FIFO, ARC) and round: a fresh empty ``KVLAB_CACHE_DIR``, one cold process,
then one warm process; the sides interleave round by round. CPU time is the children's rusage
(user + system) around each process, interpreter start-up and imports included (what a user
waits for); kvlab's bytecode is compiled beforehand, so neither side pays for it. Best and median
per side, the warm/cold ratio of the medians, the load average before and after.
Target: warm ≤ 1/3 of cold for every policy.

Usage: ``python benchmarks/bench_warm_start.py --out out/bench/bench_warm_start.json``.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import kvlab
from report import exit_unless_met, machine_info, write_report  # noqa: E402 - benchmarks/ is on sys.path

TARGET_RATIO = 1 / 3
POLICIES = ("lru", "s3fifo", "arc")
#: The console script installed beside this interpreter.
KVLAB = Path(sys.executable).parent / "kvlab"
COMMAND = ("replay", "conversation", "--capacity-blocks", "10000")


def run_cli(policy: str, cache_dir: Path) -> float:
    """CPU seconds (children's user + system) of one ``kvlab replay`` process."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("KVLAB_", "NUMBA_")) and k != "PYTHONDONTWRITEBYTECODE"}
    env["KVLAB_CACHE_DIR"] = str(cache_dir)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([str(KVLAB), *COMMAND, "--policy", policy], env=env, check=True,
                   stdout=subprocess.DEVNULL, timeout=600)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("out/bench/bench_warm_start.json"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    args = parser.parse_args()

    # both sides read kvlab's bytecode caches, as a user's second command does
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(Path(kvlab.__file__).parent)], check=True)
    load_before = os.getloadavg()
    times: dict[str, dict[str, list[float]]] = {p: {"cold": [], "warm": []} for p in args.policies}
    for _ in range(args.rounds):
        for policy in args.policies:
            with tempfile.TemporaryDirectory(prefix="kvlab-warm-") as tmp:
                times[policy]["cold"].append(run_cli(policy, Path(tmp)))
                times[policy]["warm"].append(run_cli(policy, Path(tmp)))
    load_after = os.getloadavg()

    results, met = {}, {}
    for policy, sides in times.items():
        cold, warm = statistics.median(sides["cold"]), statistics.median(sides["warm"])
        results[policy] = {"cold_best_cpu_s": min(sides["cold"]), "cold_median_cpu_s": cold,
                           "warm_best_cpu_s": min(sides["warm"]), "warm_median_cpu_s": warm,
                           "warm_vs_cold": warm / cold, "cold_cpu_s": sides["cold"], "warm_cpu_s": sides["warm"]}
        met[policy] = warm / cold <= TARGET_RATIO
        print(f"{policy:8s} cold {cold:6.2f} s  warm {warm:6.2f} s  warm/cold {warm / cold:.2f}")
    print(f"load average before {load_before}, after {load_after}")
    write_report(args.out, {
        "benchmark": "bench_warm_start", "machine": machine_info(), "rounds": args.rounds,
        "command": ["kvlab", *COMMAND], "anchor": "the same command with an empty kernel cache",
        "load_average_before": load_before, "load_average_after": load_after,
        "target_warm_vs_cold": TARGET_RATIO, "met": met, "results": results,
    })
    exit_unless_met(met, args.out)


if __name__ == "__main__":
    main()
