"""Where kvlab finds its bundled data (``data/`` at the repository root).

Set ``KVLAB_DATA`` to point elsewhere (a copy of the repository's ``data/`` folder).
"""

from __future__ import annotations

import os
from pathlib import Path

from kvlab.core.validate import check_choice

#: Bundled real traces by short name → file or folder relative to the data folder (data/README.md).
BUNDLED_TRACES: dict[str, str] = {
    "conversation": "traces/mooncake/conversation_trace.jsonl",
    "synthetic": "traces/mooncake/synthetic_trace.jsonl",
    "claude-code": "traces/kv-cache-tester",
    "ragpulse": "traces/ragpulse",
    "azure-conv": "traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv.gz",
    "splitwise-conv": "traces/vidur-splitwise/splitwise_conv.csv.gz",
}

#: Bundled traces with token counts only (no block identity): the timed cluster simulation runs
#: them, cache replays refuse them.
TOKEN_COUNT_TRACES = ("azure-conv", "splitwise-conv")


def data_dir() -> Path:
    """Return the kvlab data folder.

    ``$KVLAB_DATA`` if set, else ``data/`` beside the ``kvlab`` package (a source
    checkout or an editable install).

    Raises:
        FileNotFoundError: the folder does not exist (names the path tried and how to
            set ``KVLAB_DATA``).
    """
    env = os.environ.get("KVLAB_DATA")
    path = Path(env) if env else Path(__file__).resolve().parent.parent / "data"
    if not path.is_dir():
        raise FileNotFoundError(
            f"kvlab data folder not found at {path}; set KVLAB_DATA to a copy of the "
            "repository's data/ folder"
        )
    return path


def bundled_trace_path(name: str) -> Path:
    """Path of a bundled real trace (a file, or a folder for the formats that come as folders):
    ``"conversation"``, ``"synthetic"`` (Mooncake FAST'25), ``"claude-code"`` (kv-cache-tester),
    ``"ragpulse"``, ``"azure-conv"`` (Azure LLM 2023), ``"splitwise-conv"`` (Vidur).

    Raises:
        ValueError: ``name`` is not a bundled trace (the message lists the known names).
        FileNotFoundError: the data folder or the file is missing.
    """
    path = data_dir() / BUNDLED_TRACES[check_choice("bundled trace", name, sorted(BUNDLED_TRACES))]
    if not (path.is_file() or path.is_dir()):
        raise FileNotFoundError(f"bundled trace {name!r} missing at {path}")
    return path
