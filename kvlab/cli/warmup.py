"""``kvlab warmup``: compile the kernels the notebooks and the dashboard use, before a class.

kvlab's numba kernels are compiled on first use and kept in the disk cache of
:mod:`kvlab.core.jit` (one folder per version of kvlab's sources). A fresh install therefore
pays the compile once: minutes of CPU for notebook 04 alone, which compiles the replay driver
for every policy (``benchmarks/README.md``, bench_notebooks, "cold cache"). Run this once after
installing (or upgrading) kvlab, before a workshop: every later run, in any process, starts warm.

Each step replays a few requests of the bundled synthetic trace, so it compiles exactly the
specialisations the real runs use (the same dtypes) and computes nothing else.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

#: The tiered store's policy combinations worth compiling ahead: the design explorer's default
#: (every tier LRU), one to three tiers.
TIER_COMBINATIONS: tuple[tuple[str, ...], ...] = (("lru",), ("lru", "lru"), ("lru", "lru", "lru"))


def warmup_steps(policies: list[str]) -> list[tuple[str, Callable[[], object]]]:
    """The compile steps, in order: ``(label, run)``; ``run()`` replays a few requests.

    Args:
        policies: policy names (:data:`kvlab.policies.POLICIES`) whose replay driver to compile.

    Raises:
        ValueError: an unknown policy name.
    """
    from kvlab.core.validate import check_choice
    from kvlab.policies import POLICIES

    for name in policies:
        check_choice("policy", name, POLICIES)

    def trace() -> object:
        from kvlab.traces import load_trace

        return load_trace("synthetic").head(50)

    def replay_with(policy: str) -> Callable[[], object]:
        def run() -> object:
            from kvlab.sim import ReplayConfig, replay

            return replay(trace(), ReplayConfig(policy=policy, capacity_blocks=64))
        return run

    def tiers_with(policies_: tuple[str, ...]) -> Callable[[], object]:
        def run() -> object:
            from kvlab.tiers.replay import replay_tiered
            from kvlab.tiers.types import TierSpec

            tiers = [TierSpec(f"T{i}", 64 * (i + 1), p) for i, p in enumerate(policies_)]
            return replay_tiered(trace(), tiers)
        return run

    def curve() -> object:
        from kvlab.sim import mrc

        return mrc(trace())

    steps = [(f"replay, {p}", replay_with(p)) for p in policies]
    steps += [(f"tiers, {'+'.join(c)}", tiers_with(c)) for c in TIER_COMBINATIONS]
    steps.append(("miss-ratio curve", curve))
    return steps


def add_warmup_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``kvlab warmup`` on the ``kvlab`` subcommand set ``sub``."""
    from kvlab.policies import POLICIES

    warm = sub.add_parser("warmup", help="compile the kernels the notebooks and the dashboard use (once per "
                                         "install, before a class)")
    warm.add_argument("--policy", action="append", choices=sorted(POLICIES), metavar="NAME",
                      help="compile only this policy's replay (repeatable; default: every policy)")


def run_warmup(args: argparse.Namespace) -> int:
    """Run every step of :func:`warmup_steps` with a progress bar; print the seconds each took."""
    from tqdm.auto import tqdm

    from kvlab.policies import POLICIES

    steps = warmup_steps(args.policy or sorted(POLICIES))
    for label, run in tqdm(steps, desc="compiling", unit="kernel"):
        start = time.perf_counter()
        run()
        tqdm.write(f"{label}: {time.perf_counter() - start:.1f} s")
    return 0
