"""``kvlab simulate``: a trace through the timed cluster simulation (:func:`kvlab.sim.cluster.simulate`).

The configuration is a :class:`~kvlab.sim.cluster.ClusterConfig`: from a TOML file
(``--config cluster.toml``: top-level keys are ClusterConfig field names, tiers an array of
tables ``[[tiers]]`` with ``name``, ``capacity_blocks``, ``device``, ``policy``), then the
flags given on the command line replace the file's values. The summary echoes the effective
configuration (``summary.to_dict()["config"]``).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

#: Byte units of a ``--tier`` size (decimal and binary).
SIZE_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
              "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
_UNITS = {unit.upper(): factor for unit, factor in SIZE_UNITS.items()}
#: ClusterConfig fields a TOML file cannot set (objects, not values; derived).
NOT_IN_FILE = ("time_model", "faults", "model_spec")
#: Keys of a ``[[tiers]]`` table: the :class:`~kvlab.sim.cluster.ClusterTier` fields.
TIER_KEYS = ("name", "capacity_blocks", "device", "policy")
_SIZE = re.compile(r"([0-9][0-9_]*(?:\.[0-9]+)?)\s*([A-Za-z]*)")
#: Command-line option → ClusterConfig field, for the options that set one.
FLAG_FIELDS = {"workers": "num_workers", "model": "model", "gpu": "gpu", "tp": "tp", "router": "router",
               "roles": "roles",
               "capacity_blocks": "capacity_blocks", "seed": "seed", "slo_ttft": "slo_ttft_s",
               "slo_tbt": "slo_tbt_s", "max_kvc_ready_requests": "max_kvc_ready_requests"}


@dataclasses.dataclass(frozen=True)
class TierArgument:
    """A ``--tier`` value before the model is known: a size in bytes or a block count.

    >>> parse_tier_size("CPU=64GiB"), parse_tier_size("NVMe=5000:fifo:nvme_gen4").blocks
    (TierArgument(name='CPU', size_bytes=68719476736, blocks=None, policy='lru', device=None), 5000)
    """

    name: str
    size_bytes: int | None
    blocks: int | None
    policy: str = "lru"
    device: str | None = None


def parse_tier_size(text: str) -> TierArgument:
    """``NAME=SIZE[:POLICY[:DEVICE]]``: SIZE a block count (``5000``) or bytes with a unit
    (``64GiB``, ``1.5TB``, ``512MiB``; units of :data:`SIZE_UNITS`, any case).

    Raises:
        argparse.ArgumentTypeError: a malformed spec, a unit not in :data:`SIZE_UNITS`, a size of 0.
    """
    name, sep, rest = text.partition("=")
    parts = rest.split(":")
    if not sep or not name.strip() or not parts[0].strip() or len(parts) > 3 or any(not p.strip() for p in parts):
        raise argparse.ArgumentTypeError(f"expected NAME=SIZE[:POLICY[:DEVICE]] (SIZE in blocks, or with a unit "
                                         f"as 64GiB), got {text!r}")
    match = _SIZE.fullmatch(parts[0].strip())
    unit = match.group(2).upper() if match else ""
    if match is None or (unit and unit not in _UNITS) or (not unit and "." in match.group(1)):
        raise argparse.ArgumentTypeError(f"tier {name.strip()!r}: size {parts[0]!r} is not a block count or a size "
                                         f"with a unit of {', '.join(SIZE_UNITS)} (e.g. 64GiB)")
    number = float(match.group(1).replace("_", ""))
    if number <= 0:
        raise argparse.ArgumentTypeError(f"tier {name.strip()!r}: size must be > 0, got {parts[0]!r}")
    size_bytes, blocks = (int(number * _UNITS[unit]), None) if unit else (None, int(number))
    policy = parts[1].strip() if len(parts) > 1 else "lru"
    device = parts[2].strip() if len(parts) > 2 else None
    return TierArgument(name.strip(), size_bytes, blocks, policy, device)


def _roles(text: str) -> tuple[str, ...]:
    roles = tuple(part.strip() for part in text.split(","))
    if not all(roles):
        raise argparse.ArgumentTypeError(f"expected a comma list of roles (mixed, prefill, decode), got {text!r}")
    return roles


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def _integer(text: str) -> int:
    try:
        return int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def add_simulate_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``kvlab simulate`` on the ``kvlab`` subcommand set ``sub``."""
    from kvlab.cli import _out_dir
    from kvlab.cli.traces import add_trace_arguments

    sim = sub.add_parser("simulate", help="a trace through a timed cluster of vLLM workers: TTFT, TBT, goodput",
                         description="Timed cluster simulation (kvlab.sim.cluster). Options not given take the "
                                     "--config file's value, else ClusterConfig's default.")
    add_trace_arguments(sim)
    sim.add_argument("--config", type=Path, metavar="cluster.toml",
                     help="a TOML file of ClusterConfig fields ([[tiers]] tables: name, capacity_blocks, device, "
                          "policy); the options below replace its values")
    sim.add_argument("--requests", type=_integer, default=None, metavar="N", help="simulate the first N requests")
    sim.add_argument("--workers", type=_integer, default=None, metavar="N", help="number of workers (default 1)")
    sim.add_argument("--model", default=None, help="model preset (default Llama-3.1-8B)")
    sim.add_argument("--gpu", default=None, help="GPU preset (default H100-SXM)")
    sim.add_argument("--tp", type=_integer, default=None, metavar="N",
                     help="tensor-parallel GPUs per worker (default 1): FLOP/s, HBM bandwidth and memory × N")
    sim.add_argument("--router", default=None, metavar="NAME",
                     help="least_loaded (default), round_robin, random, scorer, or scorer:<scorer name> "
                          "(kvlab.sim.cluster.get_router)")
    sim.add_argument("--roles", type=_roles, default=None, metavar="R1,R2,...",
                     help="one role per worker: mixed, prefill or decode (default all mixed)")
    sim.add_argument("--capacity-blocks", type=_integer, default=None, metavar="N",
                     help="GPU KV blocks per worker (default: from the GPU's HBM and the model)")
    sim.add_argument("--tier", type=parse_tier_size, action="append", metavar="NAME=SIZE[:POLICY[:DEVICE]]",
                     help="a tier under every worker's GPU cache, fastest first (repeat); SIZE in blocks or with a "
                          "unit (CPU=64GiB, converted with the model's block bytes); replaces the file's tiers")
    sim.add_argument("--max-kvc-ready-requests", type=_integer, default=None, metavar="N",
                     help="Opal's FETCH_KVC gate (default 8)")
    sim.add_argument("--rate", type=_number, default=None, metavar="R",
                     help="Poisson arrivals at R requests/s instead of the trace's times")
    sim.add_argument("--time-scale", type=_number, default=1.0, metavar="X",
                     help="multiply the trace's arrival times (0.5: twice the load; default 1)")
    sim.add_argument("--seed", type=_integer, default=None, help="seed of the arrivals and the router (default 0)")
    sim.add_argument("--slo-ttft", type=_number, default=None, metavar="S", help="TTFT SLO in seconds")
    sim.add_argument("--slo-tbt", type=_number, default=None, metavar="S", help="TBT SLO in seconds")
    sim.add_argument("--no-coalesce", action="store_true", help="run every decode step (no coalescing, rule C9)")
    sim.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    sim.add_argument("--out", type=_out_dir, metavar="DIR",
                     help="write requests.parquet, steps.parquet, transfers.parquet, timeline.parquet, summary.json")


def read_config_file(path: Path) -> dict[str, object]:
    """The ClusterConfig fields of a TOML file (tiers as :class:`~kvlab.sim.cluster.ClusterTier`).

    Raises:
        ValueError: a file TOML cannot parse, a key that names no settable ClusterConfig field,
            a ``[[tiers]]`` entry that is not a table or has an unknown key (each message names
            the key and the file).
        FileNotFoundError: no such file.
    """
    import tomllib

    from kvlab.sim.cluster import ClusterConfig, ClusterTier

    try:
        with open(path, "rb") as f:
            values = tomllib.load(f)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not valid TOML: {err}") from None
    except FileNotFoundError:
        raise FileNotFoundError(f"--config {path}: no such file") from None
    except OSError as err:
        raise ValueError(f"--config {path}: cannot read it: {err.strerror}") from None
    fields = [f.name for f in dataclasses.fields(ClusterConfig) if f.name not in NOT_IN_FILE]
    for key in values:
        if key not in fields:
            raise ValueError(f"{path}: unknown key {key!r} (keys are ClusterConfig fields: {', '.join(fields)})")
    if "roles" in values and isinstance(values["roles"], list):
        values["roles"] = tuple(values["roles"])
    if "tiers" in values:
        tiers = values["tiers"]
        if not isinstance(tiers, list) or not all(isinstance(t, dict) for t in tiers):
            raise ValueError(f"{path}: tiers must be an array of tables ([[tiers]] with {', '.join(TIER_KEYS)})")
        for i, table in enumerate(tiers):
            for key in table:
                if key not in TIER_KEYS:
                    raise ValueError(f"{path}: unknown key {key!r} in tiers[{i}] (keys: {', '.join(TIER_KEYS)})")
            missing = [key for key in TIER_KEYS[:2] if key not in table]
            if missing:
                raise ValueError(f"{path}: tiers[{i}] lacks {' and '.join(missing)}")
        checked = []
        for i, table in enumerate(tiers):
            try:
                checked.append(ClusterTier(**table))
            except ValueError as err:
                raise ValueError(f"{path}: tiers[{i}]: {err}") from None
        values["tiers"] = tuple(checked)
    try:  # every other field checked now, so a bad value names the file
        ClusterConfig(**{k: v for k, v in values.items() if k != "capacity_blocks"}, capacity_blocks=1)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
    return values


def cluster_config(args: argparse.Namespace) -> object:
    """The :class:`~kvlab.sim.cluster.ClusterConfig` of ``kvlab simulate``'s arguments: the
    ``--config`` file's fields, replaced by the options given; ``--tier`` sizes in bytes are
    converted to blocks with the model's block bytes (rounded down).

    Raises:
        ValueError: as :func:`read_config_file`; an unknown router; a bad field (named by
            ClusterConfig); a tier size smaller than one block.
    """
    from kvlab.sim.cluster import ClusterConfig, ClusterTier, get_router

    values = read_config_file(args.config) if args.config is not None else {}
    for option, name in FLAG_FIELDS.items():
        if getattr(args, option) is not None:
            values[name] = getattr(args, option)
    if args.no_coalesce:
        values["coalesce_decode"] = False
    if isinstance(values.get("router"), str):
        values["router"] = get_router(values["router"])
    if args.tier:
        values.pop("tiers", None)
    config = ClusterConfig(**values)
    if not args.tier:
        return config
    tiers = []
    for tier in args.tier:
        blocks = tier.blocks
        if blocks is None:
            blocks = config.model_spec.blocks_for_bytes(tier.size_bytes, config.block_size)
            if blocks < 1:
                raise ValueError(f"tier {tier.name!r}: {tier.size_bytes:,} bytes hold no block of "
                                 f"{config.block_bytes:,} bytes ({config.model_spec.name}, block_size "
                                 f"{config.block_size})")
        extra = {} if tier.device is None else {"device": tier.device}
        try:
            tiers.append(ClusterTier(tier.name, blocks, policy=tier.policy, **extra))
        except ValueError as err:
            raise ValueError(f"--tier {tier.name}: {err}") from None
    return dataclasses.replace(config, tiers=tuple(tiers))


def run_simulate(args: argparse.Namespace) -> None:
    """``kvlab simulate TRACE ...``: build the configuration, check the output folder, load the
    trace, simulate (progress on stderr), write the frames and print the summary.

    Raises:
        ValueError: bad options or input (as :func:`cluster_config`, :func:`kvlab.sim.cluster.simulate`).
        FileNotFoundError: no such trace or config file.
    """
    from kvlab.cli import summary_json
    from kvlab.cli.files import prepare_out
    from kvlab.cli.traces import load_trace_from_args
    from kvlab.core.validate import check_positive, check_real
    from kvlab.sim.cluster import simulate

    config = cluster_config(args)
    if args.requests is not None:
        check_positive("--requests", args.requests)
    if args.rate is not None:
        check_real("--rate", args.rate, low=0.0, low_open=True)
    check_real("--time-scale", args.time_scale, low=0.0, low_open=True)
    prepare_out(args.out)
    trace = load_trace_from_args(args)
    if args.requests is not None:
        trace = trace.head(args.requests)
    result = simulate(trace, config, time_scale=args.time_scale, rate=args.rate, progress=True)
    if args.out is not None:
        for name in ("requests", "steps", "transfers", "timeline"):
            getattr(result, name).write_parquet(args.out / f"{name}.parquet")
        (args.out / "summary.json").write_text(summary_json(result.summary, indent=2) + "\n")
    if args.json:
        print(summary_json(result.summary))
        return
    print(result.summary)
    if args.out is not None:
        print(f"wrote {args.out}/ (requests, steps, transfers, timeline .parquet; summary.json)")
